"""BSP rounds per second: paramserver against PyTorch DDP and a torch.distributed.rpc server.

Same machine, same run, interleaved: N homogeneous workers (default 4), no emulation, the
digits MLP (`paramserver.training.train_task.build`), batch 32 per worker, SGD lr 0.1, one torch
thread per process. Every system does the same work per round: each worker computes the
gradient of one batch, the batch-weighted average gradient is applied once, every worker
continues from the updated parameters.

  paramserver  `train` task under BSP through LocalCluster (1 shard, no evaluator);
               rounds/s = rounds / training wall time of the job's metrics
  paramserver no-ahead / copy-pull
               the same without sending the next pull with the push / with the pull's reply
               copied into the model instead of read in place (A/B rows)
  ddp          DistributedDataParallel, gloo backend, N processes (allreduce of the gradient)
  rpc-ps       torch.distributed.rpc parameter server: a server process holds the flat
               parameters; each worker's rpc pushes its gradient and returns the parameters
               once all N pushed and the average was applied (TensorPipe default transports:
               shared memory on one host)
  rpc-ps tcp   the same forced onto TCP (TensorPipe uv transport, basic channel)
  compute      N processes doing forward/backward only (no communication): the compute ceiling
  floor        raw TCP loopback moving N x 2 x model bytes through one process per round
               (the bytes a parameter-server round moves), measured here; rounds/s if only that
  floor mem    the same bytes as N x 2 memory copies of the model (what a round costs when the
               bytes go through shared memory, as paramserver's do on one host)

The summary gives each system's median and, repeat by repeat, paramserver over the better
baseline of that repeat (the systems of a repeat run back to back: a slow spell of this shared
machine weighs on both sides of that ratio).

Usage: python benchmarks/bsp_rounds.py [--rounds 400] [--repeats 3] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch import nn

from paramserver.spec.config import TrainConfig
from paramserver.runlog.metrics import read_records, summarize
from paramserver.models.flat_binding import bind_to_flat
from paramserver.models.workload import build

TASK = {"name": "train", "model": "mlp", "dataset": "digits", "seed": 0}
BATCH, LR = 32, 0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model():
    torch.set_num_threads(1)
    ds, model, keys = build(TASK, "float32")
    return ds, model, keys


# ---- paramserver --------------------------------------------------------------------------------
def paramserver_job(workers: int, rounds: int) -> dict:
    """The BSP job every paramserver row runs (also benchmarks/bsp_cpu.py)."""
    from paramserver.launch.jobs import prepare_job
    cfg = TrainConfig(sync="bsp", workers=workers, servers=1, batch_size=BATCH, lr=LR,
                      steps=rounds, threads=1, seed=0)
    job = prepare_job(cfg)
    job["eval_interval"] = 0.0  # no evaluator: the other systems do not score a test set
    return job


def rounds_per_second(job: dict, env: dict | None = None) -> float:
    """Run `job` on this machine; rounds / training wall time of its metrics."""
    from paramserver.launch.local import LocalCluster
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d)
        LocalCluster(job, run_dir, job_timeout=600, env=env).run()
        summary = summarize(read_records(run_dir / "metrics.jsonl"),
                            {**job, "apply_mode": "round"})
    return summary["updates_applied"] / summary["wall_time_s"]


def run_paramserver(workers: int, rounds: int, env: dict | None = None,
                    pull_ahead: bool = True, borrow: bool = True) -> float:
    job = paramserver_job(workers, rounds)
    job["task"]["pull_ahead"] = pull_ahead  # off: the pull waits for the release (A/B)
    job["task"]["borrow"] = borrow  # off: the reply is copied into the model (A/B)
    return rounds_per_second(job, env)


# ---- DDP ----------------------------------------------------------------------------------------
def _ddp_proc(rank: int, world: int, port: int, rounds: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # DDP's own setup trips torch's deprecation warning about gloo; one per process per repeat
    # buried the benchmark's figures.
    warnings.filterwarnings("ignore", message="You are using a Backend")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ds, model, _ = _model()
    ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    sampler = ds.sampler(rank, world, seed=0)
    loss_fn = nn.CrossEntropyLoss()
    dist.barrier()
    t0 = time.monotonic()
    for _ in range(rounds):
        xb, yb = sampler.next_batch(BATCH)
        opt.zero_grad(set_to_none=False)
        loss_fn(ddp(xb), yb).backward()  # equal batches: DDP's mean is the batch-weighted mean
        opt.step()
    t1 = time.monotonic()
    Path(out, f"{rank}.json").write_text(json.dumps([t0, t1]))
    dist.destroy_process_group()


def _spread(out: str, world: int, rounds: int) -> float:
    spans = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(world)]
    return rounds / (max(b for _, b in spans) - min(a for a, _ in spans))


def run_ddp(workers: int, rounds: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        tmp.spawn(_ddp_proc, args=(workers, _free_port(), rounds, out), nprocs=workers)
        return _spread(out, workers, rounds)


# ---- torch.distributed.rpc parameter server -----------------------------------------------------
class RpcServer:
    """Flat parameters; a round's pushes are summed and applied once all workers pushed."""

    def __init__(self, params: torch.Tensor, workers: int):
        self.params, self.workers = params, workers
        self.acc = torch.zeros_like(params)
        self.count, self.batches = 0, 0
        self.lock = threading.Lock()
        self.future = torch.futures.Future()

    @staticmethod
    @torch.distributed.rpc.functions.async_execution
    def push_pull(ref, grad: torch.Tensor, batch: int):
        self = ref.local_value()
        with self.lock:
            self.acc.add_(grad, alpha=batch)
            self.count += 1
            self.batches += batch
            fut = self.future
            if self.count == self.workers:
                self.params.add_(self.acc, alpha=-LR / self.batches)
                self.acc.zero_()
                self.count, self.batches = 0, 0
                self.future = torch.futures.Future()
                fut.set_result(self.params.clone())  # replies serialize after we return
        return fut

    @staticmethod
    def get(ref) -> torch.Tensor:
        return ref.local_value().params.clone()


def _rpc_proc(rank: int, world: int, port: int, rounds: int, out: str, tcp: bool) -> None:
    from torch.distributed import rpc
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8)
    if tcp:
        opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, _transports=["uv"],
                                               _channels=["basic"])
    name = "ps" if rank == 0 else f"w{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=opts)
    if rank == 0:
        _, model, keys = _model()
        params = keys.flatten_params(model, keys.new_buffer())
        server = RpcServer(params, world - 1)
        ref = rpc.RRef(server)
        for w in range(1, world):
            rpc.rpc_sync(f"w{w}", _set_server, args=(ref,))
    else:
        ds, model, keys = _model()
        params, grads = keys.new_buffer(), keys.new_buffer()
        bind_to_flat(model, keys, params, grads)
        sampler = ds.sampler(rank - 1, world - 1, seed=0)
        loss_fn = nn.CrossEntropyLoss()
        while _SERVER[0] is None:
            time.sleep(0.01)
        ref = _SERVER[0]
        params.copy_(rpc.rpc_sync("ps", RpcServer.get, args=(ref,)))
        _barrier_rpc(rank)
        t0 = time.monotonic()
        for _ in range(rounds):
            xb, yb = sampler.next_batch(BATCH)
            grads.zero_()
            loss_fn(model(xb), yb).backward()
            params.copy_(rpc.rpc_sync("ps", RpcServer.push_pull, args=(ref, grads, BATCH)))
        t1 = time.monotonic()
        Path(out, f"{rank - 1}.json").write_text(json.dumps([t0, t1]))
    rpc.shutdown()


_SERVER: list = [None]
_READY = {"n": 0}
_READY_LOCK = threading.Lock()


def _set_server(ref) -> None:
    _SERVER[0] = ref


def _arrive() -> int:
    with _READY_LOCK:
        _READY["n"] += 1
        return _READY["n"]


def _count() -> int:
    return _READY["n"]


def _barrier_rpc(rank: int) -> None:
    """All workers ready before the clock starts (counted on the server)."""
    from torch.distributed import rpc
    rpc.rpc_sync("ps", _arrive)
    world = int(os.environ["PS_WORKERS"])
    while rpc.rpc_sync("ps", _count) < world:
        time.sleep(0.001)


def run_rpc_ps(workers: int, rounds: int, tcp: bool = False) -> float:
    os.environ["PS_WORKERS"] = str(workers)
    with tempfile.TemporaryDirectory() as out:
        tmp.spawn(_rpc_proc, args=(workers + 1, _free_port(), rounds, out, tcp),
                  nprocs=workers + 1)
        return _spread(out, workers, rounds)


# ---- ceilings -----------------------------------------------------------------------------------
def _compute_proc(rank: int, world: int, rounds: int, out: str, start: float) -> None:
    ds, model, keys = _model()
    params, grads = keys.new_buffer(), keys.new_buffer()
    bind_to_flat(model, keys, params, grads)
    sampler = ds.sampler(rank, world, seed=0)
    loss_fn = nn.CrossEntropyLoss()
    while time.time() < start:
        time.sleep(0.001)
    t0 = time.monotonic()
    for _ in range(rounds):
        xb, yb = sampler.next_batch(BATCH)
        grads.zero_()
        loss_fn(model(xb), yb).backward()
        params.add_(grads, alpha=-LR)
    t1 = time.monotonic()
    Path(out, f"{rank}.json").write_text(json.dumps([t0, t1]))


def run_compute(workers: int, rounds: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        tmp.spawn(_compute_proc, args=(workers, rounds, out, time.time() + 8), nprocs=workers)
        return _spread(out, workers, rounds)


def _sink(port_q, nbytes: int) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = memoryview(bytearray(nbytes))
    while True:
        got = 0
        while got < nbytes:
            n = conn.recv_into(buf[got:], nbytes - got)
            if n == 0:
                return
            got += n
        conn.sendall(buf)


def run_floor(workers: int, model_bytes: int, rounds: int = 200) -> float:
    """Rounds/s if a round were only its bytes: N pushes in, N pulls out, over raw TCP."""
    ctx = tmp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_sink, args=(q, model_bytes), daemon=True)
    proc.start()
    cli = socket.create_connection(("127.0.0.1", q.get(timeout=60)))
    payload, back = np.ones(model_bytes, np.uint8), memoryview(bytearray(model_bytes))
    try:
        t0 = time.perf_counter()
        for _ in range(rounds * workers):  # each exchange: model bytes in, model bytes out
            cli.sendall(payload)
            got = 0
            while got < model_bytes:
                got += cli.recv_into(back[got:], model_bytes - got)
        return rounds / (time.perf_counter() - t0)
    finally:
        cli.close()
        proc.join(5)
        proc.kill()


def run_floor_mem(workers: int, model_bytes: int, rounds: int = 200) -> float:
    """Rounds/s if a round were only N x 2 copies of the model through memory."""
    src, dst = np.ones(model_bytes, np.uint8), np.empty(model_bytes, np.uint8)
    t0 = time.perf_counter()
    for _ in range(rounds * workers * 2):
        np.copyto(dst, src)
    return rounds / (time.perf_counter() - t0)


def _paired_ratios(results: dict[str, list[float]]) -> list[float]:
    """paramserver over the better baseline, repeat by repeat: the systems of one repeat run
    back to back, so a slow spell of this shared machine weighs on both sides of a ratio."""
    bases = [results[n] for n in ("ddp", "rpc-ps") if results.get(n)]
    if "paramserver" not in results or not bases:
        return []
    return [p / max(b) for p, *b in zip(results["paramserver"], *bases)]


SYSTEMS = {
    "paramserver": lambda w, r: run_paramserver(w, r),
    "paramserver no-ahead": lambda w, r: run_paramserver(w, r, pull_ahead=False),
    "paramserver copy-pull": lambda w, r: run_paramserver(w, r, borrow=False),
    "ddp": run_ddp,
    "rpc-ps": lambda w, r: run_rpc_ps(w, r, tcp=False),
    "rpc-ps tcp": lambda w, r: run_rpc_ps(w, r, tcp=True),
    "compute": run_compute,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400, help="BSP rounds per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--only", help="comma-separated subset of: " + ", ".join(SYSTEMS))
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(SYSTEMS)
    _, _, keys = _model()
    model_bytes = keys.num_keys * 4
    print(f"model: {keys.num_keys} float32 parameters ({model_bytes / 1e6:.2f} MB); "
          f"{args.workers} workers, batch {BATCH}, lr {LR}, {args.rounds} rounds per run",
          flush=True)
    floors = ["floor", "floor mem"]
    results: dict[str, list[float]] = {n: [] for n in names + floors}
    for rep in range(args.repeats):
        for name in names:
            results[name].append(SYSTEMS[name](args.workers, args.rounds))
            print(f"  repeat {rep}: {name:12s} {results[name][-1]:7.1f} rounds/s", flush=True)
        results["floor"].append(run_floor(args.workers, model_bytes))
        results["floor mem"].append(run_floor_mem(args.workers, model_bytes))
        for name in floors:
            print(f"  repeat {rep}: {name:12s} {results[name][-1]:7.1f} rounds/s", flush=True)
    med = {n: statistics.median(v) for n, v in results.items()}
    base = max((med[n] for n in ("ddp", "rpc-ps") if n in med), default=None)
    print(f"\n{'system':12s} {'rounds/s':>9s} {'min':>7s} {'max':>7s} {'vs best baseline':>17s}")
    for n in names + floors:
        rel = f"{med[n] / base:16.2f}x" if base else ""
        print(f"{n:12s} {med[n]:9.1f} {min(results[n]):7.1f} {max(results[n]):7.1f} {rel}")
    paired = _paired_ratios(results)
    if paired:
        print(f"paramserver / best baseline of the same repeat: median "
              f"{statistics.median(paired):.2f}x "
              f"(per repeat: {', '.join(f'{r:.2f}' for r in paired)})")
    if "paramserver" in med:
        print(f"paramserver reaches {med['paramserver'] / med['floor']:.0%} of the byte floor "
              f"({args.workers} x 2 x {model_bytes / 1e6:.2f} MB per round over raw TCP), "
              f"{med['paramserver'] / med['floor mem']:.0%} of it through memory"
              + (f", {med['paramserver'] / med['compute']:.0%} of the compute ceiling"
                 if "compute" in med else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
