"""A script's optimizer.state_dict() and load_state_dict() over the servers' state (issue 33).

A launched script trains with Adam in two groups on two shards, saves `opt.state_dict()`,
loads another optimizer's state_dict (a plain torch Adam's, trained on other batches) and
trains on. torch in this process does the same with one optimizer: the saved state must be
torch's (moments, step counts, groups), and the steps after the load must go as torch's go
from the loaded state.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from script_setup import SETUP

SCRIPT = SETUP + textwrap.dedent("""
    import os, sys
    import paramserver
    out, other = sys.argv[1], sys.argv[2]
    model, opt, _ = build("adam")
    opt = paramserver.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    steps = 0
    while not opt.should_stop:
        if steps == 10:
            torch.save(opt.state_dict(), out + ".saved.pt")
            opt.load_state_dict(torch.load(other))
        x, y = batch(steps, 1)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        steps += 1
    opt.close()
    with open(out, "w") as f:
        json.dump({n: p.detach().tolist() for n, p in model.named_parameters()}, f)
""").replace("import os, sys", "import json, os, sys")


def _train(model, opt, steps, first=0):
    env: dict = {}
    exec(SETUP, env)
    for step in range(first, first + steps):
        x, y = env["batch"](step, 1)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _build():
    env: dict = {}
    exec(SETUP, env)
    model, opt, _ = env["build"]("adam")
    return model, opt


def test_state_dict_is_torchs_and_load_state_dict_goes_on_from_the_loaded_state(tmp_path):
    from paramserver.launch.jobs import script_job
    from paramserver.launch.local import LocalCluster
    from paramserver.spec.config import TrainConfig

    # Another run's optimizer: torch's Adam after 7 steps on other batches, other settings.
    other_model, other_opt = _build()
    _train(other_model, other_opt, 7, first=500)
    other_opt.param_groups[1]["lr"] = 0.005
    other = other_opt.state_dict()
    torch.save(other, tmp_path / "other.pt")

    script, out = tmp_path / "train.py", tmp_path / "final.json"
    script.write_text(SCRIPT)
    cfg = TrainConfig(sync="bsp", workers=1, steps=16, servers=2)
    LocalCluster(script_job(cfg, tmp_path), tmp_path / "run", job_timeout=180,
                 worker_cmd=[sys.executable, str(script), str(out),
                             str(tmp_path / "other.pt")]).run()

    model, opt = _build()
    _train(model, opt, 10)
    want = opt.state_dict()
    saved = torch.load(str(out) + ".saved.pt")
    assert sorted(saved["state"]) == sorted(want["state"]) == [0, 1, 2, 3]
    for i, entry in want["state"].items():
        assert set(saved["state"][i]) == set(entry) == {"step", "exp_avg", "exp_avg_sq"}
        assert float(saved["state"][i]["step"]) == float(entry["step"]) == 10
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(saved["state"][i][k], entry[k], rtol=1e-5, atol=1e-7)
    assert [g["params"] for g in saved["param_groups"]] == [[0, 1], [2, 3]] == \
        [g["params"] for g in want["param_groups"]]
    assert [g["lr"] for g in saved["param_groups"]] == [0.01, 0.02]
    assert saved["param_groups"][0]["betas"] == pytest.approx((0.8, 0.95))
    # What the saved dict is for: a plain torch optimizer takes it.
    _, plain = _build()
    plain.load_state_dict(saved)

    opt.load_state_dict(other)  # the reference goes on from the loaded state as well
    _train(model, opt, 6, first=10)
    got = json.loads(out.read_text())
    for name, p in model.named_parameters():
        torch.testing.assert_close(torch.tensor(got[name]), p.detach(), rtol=1e-5, atol=1e-6,
                                   msg=f"{name}: 6 steps after load_state_dict")


def test_load_state_dict_refuses_what_does_not_fit_and_changes_nothing():
    from types import SimpleNamespace

    from paramserver.client import optimizer_state
    from paramserver.models.core.keyspace import ModelKeys

    model, opt = _build()
    keys = ModelKeys(model)
    calls = []
    # No server is asked before the dict is checked (a refused load writes nothing).
    kv = SimpleNamespace(core=SimpleNamespace(pieces=lambda r: calls.append(r) or []))
    with pytest.raises(ValueError, match="optimizer state_dict"):
        optimizer_state.write(kv, model, keys, opt, model.state_dict())
    bad = opt.state_dict()
    bad["param_groups"] = bad["param_groups"][:1]
    with pytest.raises(ValueError, match="do not match"):
        optimizer_state.write(kv, model, keys, opt, bad)
    assert calls == []


FIXED_BATCH = textwrap.dedent("""
    import sys
    import torch
    import paramserver
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    follow = sys.argv[1] == "follow"
    with paramserver.DistributedOptimizer(model) as opt:
        while not opt.should_stop:
            n = opt.batch_size if follow else 32  # a DataLoader's fixed batch
            opt.zero_grad()
            model(torch.randn(n, 8)).pow(2).mean().backward()
            opt.step()
""")


@pytest.mark.parametrize("mode,warned", [
    ("fixed", True),
    pytest.param("follow", False, marks=pytest.mark.slow)])  # (the fast twin: "fixed")
def test_a_script_that_ignores_the_policys_batches_is_told_how_to_follow_them(tmp_path, mode,
                                                                              warned):
    """LB-BSP gives the 4x slower worker a smaller batch: a script that never reads
    opt.batch_size is told once, in its log, how to follow it; one that reads it is not."""
    from paramserver.launch.jobs import script_job
    from paramserver.launch.local import LocalCluster
    from paramserver.spec.config import TrainConfig

    script = tmp_path / "train.py"
    script.write_text(FIXED_BATCH)
    cfg = TrainConfig(sync="lbbsp", workers=2, steps=30, straggler="1:4", device_time="1ms")
    LocalCluster(script_job(cfg, tmp_path), tmp_path / "run", job_timeout=180,
                 worker_cmd=[sys.executable, str(script), mode]).run()
    logs = "".join((tmp_path / "run" / "logs" / f"worker-{r}.log").read_text()
                   for r in range(2))
    assert ("never reads opt.batch_size" in logs) == warned, logs[-2000:]
    if warned:
        assert logs.count("never reads opt.batch_size") <= 2  # once per rank at most
        assert "paramserver.BatchSampler" in logs and "opt.step(batch=len(x))" in logs
