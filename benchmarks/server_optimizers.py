"""What each update rule costs a shard per applied push: ours (sgd, momentum) beside torch's
optimizers run by the shard (optim/torch_rule.py), and beside torch's own optimizer stepping one
flat parameter of the same size in this process (the wrapper's cost is the difference).

    python benchmarks/server_optimizers.py [--keys 1000000] [--repeats 7] [--groups 2]
    python benchmarks/server_optimizers.py --src OTHER/src --rules adam   # an A/B side

Rules are interleaved within each repeat; prints the median ms per apply and the ratio to
`sgd` and, for torch rules, to torch stepping the same tensor directly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

RULES = ("sgd", "momentum", "torch-sgd", "adam", "adamw", "adagrad", "rmsprop", "adamax")
OPTIONS = {"momentum": {"momentum": 0.9}, "torch-sgd": {"momentum": 0.9}}


def _groups(keys: int, n: int) -> list:
    if n < 2:
        return []
    cut = [keys * i // n for i in range(n + 1)]
    return [{"ranges": [[cut[i], cut[i + 1]]], "weight_decay": 0.01 * i} for i in range(n)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--applies", type=int, default=20)
    p.add_argument("--groups", type=int, default=2, help="parameter groups of the torch rules")
    p.add_argument("--src", help="import paramserver from this folder (an A/B's other side)")
    p.add_argument("--rules", default=",".join(RULES))
    a = p.parse_args()
    if a.src:
        sys.path.insert(0, a.src)
    global KeyRange, TORCH_OPTIMIZERS, make_rule, ShardStore
    from paramserver.core.keyspace import KeyRange
    from paramserver.optim import TORCH_OPTIMIZERS, make_rule
    from paramserver.server.store import ShardStore
    rules = tuple(a.rules.split(","))
    torch.set_num_threads(1)
    grad = torch.randn(a.keys)
    stores, direct = {}, {}
    for name in rules:
        groups = _groups(a.keys, a.groups) if name in TORCH_OPTIMIZERS else []
        opts = dict(OPTIONS.get(name, {}), **({"groups": groups} if groups else {}))
        stores[name] = ShardStore(KeyRange(0, a.keys), "float32", make_rule(name, 0.01, **opts),
                                  "arrival")
        if name in TORCH_OPTIMIZERS:
            param = torch.zeros(a.keys)
            param.grad = grad
            direct[name] = TORCH_OPTIMIZERS[name](
                [param], lr=0.01, **OPTIONS.get(name, {}))
    times: dict[str, list[float]] = {n: [] for n in [*rules, *(f"torch:{n}" for n in direct)]}
    for _ in range(a.repeats):
        for name in rules:
            store = stores[name]
            t0 = time.perf_counter()
            for _ in range(a.applies):
                store.push("w", slice(0, a.keys), grad, 0, 1, store.version, 1.0)
            times[name].append((time.perf_counter() - t0) / a.applies)
            if name in direct:
                t0 = time.perf_counter()
                for _ in range(a.applies):
                    direct[name].step()
                times[f"torch:{name}"].append((time.perf_counter() - t0) / a.applies)
    med = {n: statistics.median(v) for n, v in times.items()}
    for name in rules:
        row = {"rule": name, "keys": a.keys, "ms_per_apply": round(med[name] * 1e3, 3)}
        if "sgd" in med:
            row["vs_sgd"] = round(med[name] / med["sgd"], 2)
        if name in direct:
            row["torch_direct_ms"] = round(med[f"torch:{name}"] * 1e3, 3)
            row["vs_torch_direct"] = round(med[name] / med[f"torch:{name}"], 3)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
