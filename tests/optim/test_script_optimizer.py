"""A script's own torch optimizer on the servers: `DistributedOptimizer(optimizer,
named_parameters=...)` as Horovod's, the class and parameter groups sent by name and value.

The live test launches a script that trains with AdamW in two groups (no weight decay on
biases) and torch's OneCycleLR schedule (lr and betas move every step) through `paramserver launch`'s machinery (real coordinator, shards and a worker
process) and checks its final parameters against torch training the same model with the same
batches in this process. The core tests drive the coordinator's part with events alone.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from paramserver.client.torch_optimizer import describe
from paramserver.coordinator.events import AppendEvent, Registered, Reply
from paramserver.coordinator.state import CoordinatorState
from paramserver.models.core.keyspace import ModelKeys
from paramserver.spec.job import OptimizerSpec
from ps_helpers import job_of, match

from script_setup import SETUP

SCRIPT = SETUP + textwrap.dedent("""
    import json, os, sys
    import paramserver
    kind, workers = sys.argv[2], int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    first = int(os.environ.get("FIRST_STEP", "0"))  # a resumed job's batches go on
    model, opt, schedule = build(kind)
    opt = paramserver.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.Optimizer) and len(opt.param_groups) == 2
    sched = schedule(opt) if schedule else None  # torch's own, on the optimizer returned
    steps = 0
    while not opt.should_stop:
        x, y = batch(first + steps, workers)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::workers]), y[rank::workers]).backward()
        opt.step()
        if sched is not None:
            sched.step()
        steps += 1
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"steps": steps, "lr": opt.param_groups[0]["lr"],
                       "params": {n: p.detach().tolist()
                                  for n, p in model.named_parameters()}}, f)
    opt.close()
""")


def _local(kind: str, steps: int, workers: int) -> tuple[dict, float]:
    """torch in this process on the global batches: what the job must end on."""
    env: dict = {}
    exec(SETUP, env)
    model, opt, schedule = env["build"](kind)
    sched = schedule(opt) if schedule else None
    for step in range(steps):
        x, y = env["batch"](step, workers)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()
    return {n: p.detach() for n, p in model.named_parameters()}, opt.param_groups[0]["lr"]


@pytest.mark.parametrize("kind,workers,servers,sync", [
    # (one shard: slow, its twin is the same rule split over two shards)
    pytest.param("adamw", 1, 1, "bsp", marks=pytest.mark.slow), ("adamw", 1, 2, "bsp"),
    # three ranks' mean gradient is the global batch's up to float32 summation order: the
    # tolerance is that rounding (1e-6 relative per step) carried through 25 steps
    ("sgd", 3, 2, "bsp"),
    # auto's lockstep rounds, summed on shards that apply on arrival: one adamw step a round
    # (before, each rank's push was an adamw step of its own)
    ("adamw", 3, 2, "auto"),
    # a warmup that ends at the lr the job began with (the servers kept the last warmup lr)
    ("warmup", 2, 1, "bsp")])
def test_a_scripts_optimizer_groups_and_schedule_train_on_the_servers_as_torch_does(
        tmp_path, kind, workers, servers, sync):
    from paramserver.launch.jobs import script_job
    from paramserver.launch.local import LocalCluster
    from paramserver.spec.config import TrainConfig
    script, out = tmp_path / "train.py", tmp_path / "final.json"
    script.write_text(SCRIPT)
    # (launch's own --optimizer stays sgd: the script's optimizer replaces it)
    cfg = TrainConfig(sync=sync, workers=workers, steps=25, servers=servers,
                      sync_options={"candidates": "bsp"} if sync == "auto" else {})
    cluster = LocalCluster(script_job(cfg, tmp_path), tmp_path / "run", job_timeout=180,
                           worker_cmd=[sys.executable, str(script), str(out), kind])
    cluster.run()
    got = json.loads(out.read_text())
    assert got["steps"] == 25
    want, lr = _local(kind, got["steps"], workers)
    assert got["lr"] == pytest.approx(lr)  # the script reads the lr in force
    tol = dict(rtol=1e-5, atol=1e-6) if workers == 1 else dict(rtol=1e-4, atol=1e-5)
    for name, values in got["params"].items():
        torch.testing.assert_close(torch.tensor(values), want[name], **tol,
                                   msg=f"{name} after {got['steps']} steps")
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    (adopted,) = [e for e in events if e["event"] == "script_optimizer"]
    assert adopted["rule"] == ("adamw" if kind == "adamw" else "torch-sgd")
    assert adopted["groups"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["adamw", "adam", "sgd", "adagrad", "rmsprop", "adamax",
                                  "amsgrad"])
def test_every_server_optimizer_keeps_torchs_course_for_100_steps_of_3_workers(tmp_path, kind):
    """Every torch optimizer the servers run, 3 workers on 2 shards for 100 steps: the
    parameters stay torch's within float32 summation order carried that far (the fast twin
    above runs 25 steps of two of them)."""
    from paramserver.launch.jobs import script_job
    from paramserver.launch.local import LocalCluster
    from paramserver.spec.config import TrainConfig
    script, out = tmp_path / "train.py", tmp_path / "final.json"
    script.write_text(SCRIPT)
    cfg = TrainConfig(sync="bsp", workers=3, steps=100, servers=2)
    LocalCluster(script_job(cfg, tmp_path), tmp_path / "run", job_timeout=300,
                 worker_cmd=[sys.executable, str(script), str(out), kind]).run()
    got = json.loads(out.read_text())
    assert got["steps"] == 100
    want, lr = _local(kind, 100, 3)
    assert got["lr"] == pytest.approx(lr)
    for name, values in got["params"].items():
        torch.testing.assert_close(torch.tensor(values), want[name], rtol=1e-3, atol=1e-4,
                                   msg=f"{kind}: {name} after 100 steps")


@pytest.mark.slow  # two launched jobs, ~23 s here; the fast twin: the shard's optimizer state
# through a checkpoint round trip (tests/optim/test_torch_rule.py::test_state_survives_a_...)
def test_a_resumed_job_goes_on_with_the_optimizers_state_from_its_checkpoint(tmp_path):
    """`launch --resume RUN`: Adam's moments and step counts are the shards' state, saved in
    the run's final checkpoint; a job resumed from a run of 10 steps and run to 16 ends where
    torch ends after 16 steps with one optimizer (with the moments lost it would not)."""
    import os
    import subprocess
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    def launch(out, steps, *extra, first=0):
        proc = subprocess.run(
            [sys.executable, "-m", "paramserver", "launch", "--workers", "1", "--servers", "2",
             "--steps", str(steps), "--quiet", "--out", str(tmp_path / out), *extra, "--",
             sys.executable, str(script), str(tmp_path / f"{out}.json"), "adam"],
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, FIRST_STEP=str(first)))
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        return json.loads((tmp_path / f"{out}.json").read_text())

    assert launch("a", 10)["steps"] == 10
    got = launch("b", 16, "--resume", str(tmp_path / "a"), first=10)
    assert got["steps"] == 6  # the budget counts the resumed run's steps
    want, _ = _local("adam", 16, 1)
    for name, values in got["params"].items():
        torch.testing.assert_close(torch.tensor(values), want[name], rtol=1e-5, atol=1e-6,
                                   msg=f"{name} after the resumed steps")


def test_resuming_a_run_without_a_checkpoint_says_so(tmp_path, capsys):
    # In this interpreter: a refusal before any process starts (launch's refusals as a
    # process: tests/launch/test_api_launch.py::test_launch_without_a_command_is_a_clear_error)
    from paramserver.cli.main import main
    (tmp_path / "empty").mkdir()
    code = main(["launch", "--resume", str(tmp_path / "empty"), "--out", str(tmp_path / "b"),
                 "--", sys.executable, "-c", "pass"])
    err = capsys.readouterr().err
    assert code == 2 and "no usable checkpoint" in err, err
    assert "Traceback" not in err


def test_resuming_a_run_whose_checkpoint_spent_the_budget_says_so(tmp_path, capsys):
    """`launch --resume RUN --steps N` where RUN's checkpoint has done N steps' samples
    already: refused before anything starts (it ran a job of 0 steps and exited 0)."""
    import numpy as np
    from paramserver.cli.main import main
    from paramserver.runlog.checkpoint import write_part
    from paramserver.runlog.checkpoint_set import save_coordinator_state
    root = tmp_path / "a" / "checkpoints"
    write_part(root, "000000040", "server-0", {"values": np.zeros(10, np.float32)},
               {"version": 40, "range": [0, 10], "dtype": "float32", "updates_applied": 40,
                "applied": []})
    save_coordinator_state(root, "000000040", {
        "rounds_applied": 40, "samples_done": 1280, "steps_done": 40, "num_keys": 10,
        "worker_samples": {"0": 1280}})
    code = main(["launch", "--resume", str(tmp_path / "a"), "--workers", "1", "--steps", "30",
                 "--out", str(tmp_path / "b"), "--", sys.executable, "-c", "pass"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert ("nothing left to train: checkpoint 000000040 has 1280 samples done and the "
            "budget is 960; give a larger --steps (it counts the resumed run's)") in err, err
    assert not (tmp_path / "b").exists()


# ---- what the client sends ----------------------------------------------------------------------

def _model():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))


def test_the_spec_names_the_rule_the_settings_and_each_groups_key_ranges():
    model = _model()
    keys = ModelKeys(model)
    w = [model[0].weight, model[1].weight]
    opt = torch.optim.SGD([{"params": w, "weight_decay": 1e-4},
                           {"params": [model[0].bias], "lr": 0.5}],
                          lr=0.1, momentum=0.9, nesterov=True)
    spec = describe(opt, model, keys)
    assert spec["name"] == "torch-sgd" and spec["lr"] == 0.1
    options = spec["options"]
    assert options["momentum"] == 0.9 and options["nesterov"] is True
    assert "foreach" not in options and "fused" not in options
    r = {n: keys.param_range(n) for n, _ in model.named_parameters()}
    g0, g1, frozen = options["groups"]
    assert g0 == {"ranges": [[r["0.weight"].lo, r["0.weight"].hi],
                             [r["1.weight"].lo, r["1.weight"].hi]], "weight_decay": 1e-4}
    assert g1 == {"ranges": [[r["0.bias"].lo, r["0.bias"].hi]], "lr": 0.5}
    # 1.bias is in no group: torch never steps it, nor do the servers
    assert frozen == {"ranges": [[r["1.bias"].lo, r["1.bias"].hi]], "frozen": True}
    OptimizerSpec.from_wire(json.loads(json.dumps(spec)))  # what the wire carries parses


def test_a_class_the_servers_do_not_run_is_refused_before_joining_with_the_list():
    model = _model()
    opt = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ValueError, match="do not run torch.optim.lbfgs.LBFGS.*torch.optim.Adam"):
        describe(opt, model, ModelKeys(model))
    stranger = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([*model.parameters(), stranger])
    with pytest.raises(ValueError, match="not among the model's parameters"):
        describe(opt, model, ModelKeys(model))


# ---- the coordinator's part ---------------------------------------------------------------------

ADAM = OptimizerSpec("adam", 0.01, {"betas": [0.9, 0.99]})


def _worker(src, t, optimizer, rank=None):
    return Registered(src, "worker", t, to=f"r-{src}", num_keys=10, want_rank=rank,
                      optimizer=optimizer)


def test_the_first_workers_optimizer_is_the_servers_rule_and_later_ranks_must_match():
    state = CoordinatorState(job_of(num_keys=0))
    out = state.handle(Registered("srv", "server", 0.0, to="r0", link="L0", addr="tcp://h:1"))
    assert out == []  # the server waits for the key space
    out = state.handle(_worker("w0", 0.1, ADAM, 0))
    welcome = next(i for i in out if isinstance(i, Reply) and i.to == "r0")
    assert welcome.fields["job"]["optimizer"] == {"name": "adam", "lr": 0.01,
                                                  "options": {"betas": [0.9, 0.99]}}
    assert any(match(i, AppendEvent, kind="script_optimizer", rule="adam") for i in out
               if isinstance(i, AppendEvent))
    other = OptimizerSpec("adam", 0.02, {"betas": [0.9, 0.99]})
    out = state.handle(_worker("w1", 0.2, other, 1))
    assert match(out[-1], Reply, to="r-w1", op="error", code="refused")
    assert "differs from the job's" in out[-1].fields["msg"]
    out = state.handle(_worker("w1", 0.3, None, 1))  # no optimizer, the job has one
    assert match(out[-1], Reply, to="r-w1", op="error", code="refused")
    out = state.handle(_worker("w1", 0.4, ADAM, 1))
    assert match(out[0], Reply, to="r-w1", op="welcome", rank=1)
    state.check_invariants()


def test_launchs_staleness_rule_composes_with_the_scripts_optimizer():
    """`launch --optimizer dynsgd` (what compare pairs SSP with) and a script's Adam: the
    servers run Adam with DynSGD's scaling; later ranks still compare their own optimizer."""
    state = CoordinatorState(job_of(num_keys=0, optimizer=OptimizerSpec("dynsgd", 0.1)))
    state.handle(Registered("srv", "server", 0.0, to="r0", link="L0", addr="tcp://h:1"))
    out = state.handle(_worker("w0", 0.1, ADAM, 0))
    welcome = next(i for i in out if isinstance(i, Reply) and i.to == "r0")
    assert welcome.fields["job"]["optimizer"]["options"] == {"betas": [0.9, 0.99],
                                                             "staleness": "dynsgd"}
    out = state.handle(_worker("w1", 0.2, ADAM, 1))
    assert match(out[0], Reply, to="r-w1", op="welcome", rank=1)


def test_a_job_whose_servers_started_with_their_rule_refuses_a_scripts_optimizer():
    state = CoordinatorState(job_of())  # a key space given up front
    state.handle(Registered("srv", "server", 0.0, to="r0", link="L0", addr="tcp://h:1"))
    out = state.handle(_worker("w0", 0.1, ADAM, 0))
    assert match(out[-1], Reply, to="r-w0", op="error", code="refused")
    assert "pass the model instead" in out[-1].fields["msg"]


FROZEN = textwrap.dedent("""
    import json, os, sys
    import torch
    import paramserver

    def build():  # a fine-tuning script: the backbone frozen, every parameter in the groups
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 2))
        for p in model[0].parameters():
            p.requires_grad = False
        return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.5)

    def batch(step, workers):
        g = torch.Generator().manual_seed(step)
        return torch.randn(8 * workers, 5, generator=g), torch.randn(8 * workers, 2,
                                                                      generator=g)

    if __name__ == "__main__":
        workers, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        model, opt = build()
        opt = paramserver.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        steps, refused = 0, None
        while not opt.should_stop:
            x, y = batch(steps, workers)
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x[rank::workers]), y[rank::workers]).backward()
            if steps == 3:  # unfrozen after joining: refused, the step not taken
                model[0].bias.requires_grad = True
                try:
                    opt.step()
                except RuntimeError as exc:
                    refused = str(exc)
                model[0].bias.requires_grad = False
            opt.step()
            steps += 1
        if rank == 0:
            with open(sys.argv[1], "w") as f:
                json.dump({"steps": steps, "refused": refused,
                           "state": sorted(opt.state_dict()["state"]),
                           "params": {n: p.detach().tolist()
                                      for n, p in model.named_parameters()}}, f)
        opt.close()
""")


def test_parameters_that_need_no_grad_stay_as_torch_leaves_them_and_unfreezing_is_refused(
        tmp_path):
    """A fine-tuning script puts its frozen backbone (requires_grad=False) in an AdamW group
    with weight decay: torch skips those parameters (their grad is None), so the servers must
    not decay them (they did: every gradient here is a zeroed buffer). Two ranks under BSP end
    on torch's parameters on the global batch, the backbone untouched and without optimizer
    state; a parameter unfrozen after joining is refused at step() in one sentence saying
    what to do, not trained on the old course."""
    from paramserver.launch.jobs import script_job
    from paramserver.launch.local import LocalCluster
    from paramserver.spec.config import TrainConfig
    script, out = tmp_path / "finetune.py", tmp_path / "final.json"
    script.write_text(FROZEN)
    cfg = TrainConfig(sync="bsp", workers=2, steps=8, servers=1)
    LocalCluster(script_job(cfg, tmp_path), tmp_path / "run", job_timeout=180,
                 worker_cmd=[sys.executable, str(script), str(out)]).run()
    got = json.loads(out.read_text())
    assert got["steps"] == 8
    assert "parameter '0.bias' requires grad now" in got["refused"]
    assert "Set requires_grad before creating the DistributedOptimizer" in got["refused"]
    env: dict = {}
    exec(FROZEN, env)
    model, opt = env["build"]()
    for step in range(8):
        x, y = env["batch"](step, 2)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert got["state"] == [2, 3]  # torch's: no state for the frozen 0.weight, 0.bias
    for name, p in model.named_parameters():
        torch.testing.assert_close(torch.tensor(got["params"][name]), p.detach(),
                                   rtol=1e-5, atol=1e-6, msg=name)
