"""`DistributedOptimizer.clip_grad_norm_` against torch itself: DDP's script clips the
averaged gradient (`torch.nn.utils.clip_grad_norm_` between backward and step), FSDP's calls
the wrapper's method of that name; here the servers clip the round's average by its norm over
every shard (server/clip_round.py, coordinator/clip_rounds.py). Real processes: a coordinator,
two shards whose split cuts the model, workers each on its own batch, through `launch`'s
local cluster; in this process plain torch on the ranks' averaged loss, clipped. max_norm is
small enough that clipping is active on every step (checked on torch's side), so the average
of per-rank clipped gradients (what clipping each rank's own gives) would not match.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import paramserver

    def build(kind):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                    torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                    torch.nn.Linear(16, 3))
        if kind == "adam":
            return model, torch.optim.Adam(model.parameters(), lr=0.01)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def loss_of(model, step, rank, workers):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8 * workers, 6, generator=g), torch.randn(8 * workers, 3,
                                                                      generator=g)
        return torch.nn.functional.mse_loss(model(x[rank::workers]), y[rank::workers])

    if __name__ == "__main__":
        out, kind, max_norm, norm_type = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
        workers, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        model, opt = build(kind)
        opt = paramserver.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        steps = 0
        while not opt.should_stop:
            opt.zero_grad()
            loss_of(model, steps, rank, workers).backward()
            opt.clip_grad_norm_(max_norm, norm_type=float(norm_type))
            opt.step()
            steps += 1
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"steps": steps, "params": {n: p.detach().tolist()
                                                      for n, p in model.named_parameters()}}, f)
        opt.close()
""")

STEPS = 10


def _torch(kind: str, workers: int, max_norm: float, norm_type: float):
    """DDP's step: the ranks' losses averaged, the average's gradient clipped."""
    env: dict = {}
    exec(SCRIPT, env)
    model, opt = env["build"](kind)
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(env["loss_of"](model, step, r, workers) for r in range(workers)) / workers
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)
        assert norm > 1.5 * max_norm, f"step {step}: clipping not active ({norm:.4f})"
        opt.step()
    return model


# The default suite keeps two ranks with Adam and the inf norm with SGD; the rest are its slow
# set (the cores' side: tests/server/test_clip_round.py, tests/coordinator/test_clip_rounds.py).
@pytest.mark.parametrize("kind,workers,sync,max_norm,norm_type,replicas", [
    pytest.param("sgd", 2, "bsp", 0.05, 2.0, 1, marks=pytest.mark.slow),
    ("adam", 2, "bsp", 0.05, 2.0, 1),
    ("sgd", 2, "bsp", 0.01, math.inf, 1),
    # one rank: torch's local clip
    pytest.param("adam", 1, "bsp", 0.05, 2.0, 1, marks=pytest.mark.slow),
    # applied on arrival: the worker clips its push
    pytest.param("sgd", 1, "asp", 0.05, 2.0, 1, marks=pytest.mark.slow),
    # each shard's backup holds the round too and takes the factor its primary forwards
    pytest.param("adam", 2, "bsp", 0.05, 2.0, 2, marks=pytest.mark.slow),
])
def test_clip_grad_norm_clips_the_average_as_ddp_does(tmp_path, kind, workers, sync,
                                                      max_norm, norm_type, replicas):
    from paramserver.launch.jobs import script_job
    from paramserver.launch.local import LocalCluster
    from paramserver.spec.config import TrainConfig
    script, out = tmp_path / "train.py", tmp_path / "final.json"
    script.write_text(SCRIPT)
    cfg = TrainConfig(sync=sync, workers=workers, steps=STEPS, servers=2, replicas=replicas)
    LocalCluster(script_job(cfg, tmp_path), tmp_path / "run", job_timeout=180,
                 worker_cmd=[sys.executable, str(script), str(out), kind, str(max_norm),
                             str(norm_type)]).run()
    got = json.loads(out.read_text())
    assert got["steps"] == STEPS
    model = _torch(kind, workers, max_norm, norm_type)
    for name, p in model.named_parameters():
        torch.testing.assert_close(torch.tensor(got["params"][name]), p.detach(),
                                   rtol=1e-6, atol=1e-6, msg=f"{name} after {STEPS} steps")
