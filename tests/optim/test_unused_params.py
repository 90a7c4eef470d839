"""Parameters that get no gradient in a step, against torch itself: torch's optimizers skip a
parameter whose grad is None (no step count, no weight decay, no moment moves it), so the
servers running a script's optimizer must leave it out too, though every gradient here is a
zeroed buffer. A model whose auxiliary head is used on some steps only (and by some ranks
only), and whose spare head is never used, trains through a real job (coordinator, shards and
worker processes on 127.0.0.1) and in this process with plain torch (`zero_grad(set_to_none=
True)`); the final parameters and the optimizer's step counts must be torch's. With two ranks
a head one rank used on a step gets the averaged gradient (the other rank's share zero), as
DDP gives it; one no rank used keeps grad None. The pure checks: tests/server/test_idle_keys.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

UNUSED = textwrap.dedent("""
    import json, os, sys
    import torch
    import paramserver

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(5, 8)
            self.aux = torch.nn.Linear(8, 2)  # on some steps, by some ranks
            self.head = torch.nn.Linear(8, 2)
            self.spare = torch.nn.Linear(8, 2)  # never used

        def forward(self, x, aux):
            h = torch.tanh(self.body(x))
            return self.head(h) + self.aux(h) if aux else self.head(h)

    def build(kind):
        torch.manual_seed(0)
        model = Net()
        if kind == "adam":
            return model, torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)
        if kind == "adamw":
            return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                      weight_decay=0.01)

    def uses_aux(step, rank, workers):
        # one rank: every third step; two: rank 0 on even steps, rank 1 on every third
        # (both on some steps, one of them on others, neither on the rest)
        return step % 2 == 0 if workers > 1 and rank == 0 else step % 3 == 0

    def batch(step, workers):
        g = torch.Generator().manual_seed(step)
        return torch.randn(8 * workers, 5, generator=g), torch.randn(8 * workers, 2,
                                                                      generator=g)

    def loss_of(model, step, rank, workers):
        x, y = batch(step, workers)
        out = model(x[rank::workers], uses_aux(step, rank, workers))
        return torch.nn.functional.mse_loss(out, y[rank::workers])

    def steps_of(state_dict):  # (torch's SGD keeps no step count: only whether it has state)
        return {int(i): float(s["step"]) if "step" in s else None
                for i, s in state_dict["state"].items()}

    if __name__ == "__main__":
        out, kind, zero = sys.argv[1:4]
        workers, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        model, opt = build(kind)
        opt = paramserver.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        steps = 0
        while not opt.should_stop:
            if zero == "model":  # grads set to None: backward makes new ones, None if unused
                model.zero_grad()
            else:
                opt.zero_grad()
            loss_of(model, steps, rank, workers).backward()
            opt.step()
            steps += 1
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"steps": steps, "state": steps_of(opt.state_dict()),
                           "params": {n: p.detach().tolist()
                                      for n, p in model.named_parameters()}}, f)
        opt.close()
""")


def _torch(script: str, kind: str, steps: int, workers: int):
    """torch in this process: the ranks' losses averaged (DDP's gradient), grads set to None
    between steps, so a head no rank used is skipped."""
    env: dict = {}
    exec(script, env)
    model, opt = env["build"](kind)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = sum(env["loss_of"](model, step, r, workers) for r in range(workers)) / workers
        loss.backward()
        opt.step()
    return model, env["steps_of"](opt.state_dict())


def _check(got: dict, model, state: dict, tol: dict) -> None:
    """The parameters, and which have optimizer state with which step count (torch's)."""
    for name, p in model.named_parameters():
        torch.testing.assert_close(torch.tensor(got["params"][name]), p.detach(), **tol,
                                   msg=f"{name} after {got['steps']} steps")
    have = {int(k): v for k, v in got["state"].items()}
    assert set(have) == set(state)  # the spare head has none
    assert {i: have[i] for i, n in state.items() if n is not None} == {
        i: n for i, n in state.items() if n is not None}


# The default suite keeps two ranks over two shards (a round's idle keys, the head's keys cut)
# and auto's lockstep rounds; the rest are its slow set (the pure side of each case:
# tests/server/test_idle_keys.py, tests/client/test_idle_params.py).
@pytest.mark.parametrize("kind,workers,servers,sync,zero", [
    pytest.param("adam", 1, 1, "bsp", "opt", marks=pytest.mark.slow),
    # two shards cut the auxiliary head's keys; the script sets grads to None itself
    pytest.param("sgd", 1, 2, "bsp", "model", marks=pytest.mark.slow),
    # each push applied on arrival
    pytest.param("adamw", 1, 1, "asp", "opt", marks=pytest.mark.slow),
    ("adam", 2, 2, "bsp", "opt"),
    pytest.param("sgd", 2, 1, "bsp", "opt", marks=pytest.mark.slow),
    # auto's lockstep rounds, summed on shards that apply on arrival
    ("adamw", 2, 2, "auto", "opt")])
def test_a_parameter_without_a_gradient_is_left_as_torch_leaves_it(
        tmp_path, kind, workers, servers, sync, zero):
    from paramserver.launch.jobs import script_job
    from paramserver.launch.local import LocalCluster
    from paramserver.spec.config import TrainConfig
    script, out = tmp_path / "train.py", tmp_path / "final.json"
    script.write_text(UNUSED)
    cfg = TrainConfig(sync=sync, workers=workers, steps=12, servers=servers,
                      sync_options={"candidates": "bsp"} if sync == "auto" else {})
    LocalCluster(script_job(cfg, tmp_path), tmp_path / "run", job_timeout=180,
                 worker_cmd=[sys.executable, str(script), str(out), kind, zero]).run()
    got = json.loads(out.read_text())
    assert got["steps"] == 12
    model, state = _torch(UNUSED, kind, 12, workers)
    # (two ranks' sum is the same in either order of arrival: a + b == b + a)
    _check(got, model, state, dict(rtol=1e-6, atol=1e-6))


HOROVOD_AMP = """
import json, sys
import torch
import paramserver.horovod as hvd

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.aux, self.head = (torch.nn.Linear(5, 8), torch.nn.Linear(8, 2),
                                          torch.nn.Linear(8, 2))

    def forward(self, x, aux):
        h = torch.tanh(self.body(x))
        return self.head(h) + self.aux(h) if aux else self.head(h)

def build():
    torch.manual_seed(0)
    model = Net()
    return model, torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)

def steps_of(state_dict):
    return {int(i): float(s["step"]) for i, s in state_dict["state"].items()}

def train(model, optimizer, horovod):
    # Horovod's mixed-precision loop (GradScaler, clipping), the head used every third step
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for k in range(8):
        g = torch.Generator().manual_seed(k)
        x, y = torch.randn(16, 5, generator=g), torch.randn(16, 2, generator=g)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x, k % 3 == 1), y)
        scaler.scale(loss).backward()
        if horovod:
            optimizer.synchronize()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if horovod:
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
        else:
            scaler.step(optimizer)
        scaler.update()

if __name__ == "__main__":
    hvd.init()
    model, optimizer = build()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    train(model, optimizer, horovod=True)
    with open(sys.argv[1] + "/final.json", "w") as f:
        json.dump({"steps": 8, "state": steps_of(optimizer.state_dict()),
                   "params": {n: p.detach().tolist() for n, p in model.named_parameters()}}, f)
"""


@pytest.mark.slow  # fast twin: the two-rank and auto cases above
def test_horovods_mixed_precision_loop_leaves_an_unused_head_as_torch_does(tmp_path):
    """The Horovod shim, run with plain python (a job of one worker): GradScaler's unscale and
    clipping see the unused head's zeroed gradient, and the servers still leave it out."""
    path = tmp_path / "script.py"
    path.write_text(HOROVOD_AMP)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PARAMSERVER_JOIN", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(path), str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scope: dict = {}
    exec(compile(HOROVOD_AMP, "horovod_amp", "exec"), scope)
    model, optimizer = scope["build"]()
    scope["train"](model, optimizer, horovod=False)
    got = json.loads((tmp_path / "final.json").read_text())
    _check(got, model, scope["steps_of"](optimizer.state_dict()), dict(rtol=1e-6, atol=1e-6))
