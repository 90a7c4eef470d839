"""`simulate --train`: real gradients at the versions the schedule says, checked by recomputation."""

import json

import pytest
import torch
from torch import nn

from paramserver.cli.main import main
from paramserver.runlog.metrics import read_records
from paramserver.models.workload import build
from paramserver.sim import SimConfig, Simulation


def run(tmp_path, **kw):
    cfg = SimConfig(**{"model": "logreg", "dataset": "digits", "workers": 4, "steps": 6,
                       "compute": "classes:0.5=1,0.5=2.5+lognormal:0.3", "lr": 0.2,
                       "eval_interval": 0.05, "train": True, **kw})
    sim = Simulation(cfg, tmp_path)
    sim.advance()
    summary = sim.close(complete=True)
    steps = [r for r in read_records(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    return sim, summary, steps


class Replayer:
    """Sequential SGD that follows the log: the same shards, batches and versions."""

    def __init__(self, cfg):
        self.ds, self.model, self.keys = build(cfg.task(), cfg.dtype)
        self.samplers = {w: self.ds.sampler(w, cfg.workers, seed=cfg.seed)
                         for w in range(cfg.workers)}
        self.params = self.keys.flatten_params(self.model).clone()

    def grad(self, params, worker, batch):
        self.keys.load_flat(self.model, params)
        self.model.zero_grad()
        X, y = self.samplers[worker].next_batch(batch)
        nn.CrossEntropyLoss()(self.model(X), y).backward()
        return self.keys.flatten_grads(self.model).clone()


@pytest.mark.parametrize("sync", ["asp", "r2sp", "ssp"])
def test_arrival_mode_gradients_are_taken_at_the_pulled_version(sync, tmp_path):
    sim, _, steps = run(tmp_path, sync=sync, latency="0")
    rep = Replayer(sim.cfg)
    history = [rep.params.clone()]  # version i = after i applied pushes; the log is push order
    for i, r in enumerate(steps):
        g = rep.grad(history[i - r["staleness"]], r["worker"], r["batch"])
        history.append(history[-1] - sim.cfg.lr * g)
    assert max(r["staleness"] for r in steps) > 0
    assert torch.allclose(sim.trainer.store.values, history[-1], atol=1e-6)


def test_round_mode_applies_the_batch_weighted_average_once_per_round(tmp_path):
    sim, summary, steps = run(tmp_path, sync="lbbsp", workers=3, steps=5,
                              compute="classes:0.34=1,0.66=3")
    rep = Replayer(sim.cfg)
    for k in range(5):
        pushes = [r for r in steps if r["step"] == k]
        total = sum(r["batch"] for r in pushes)
        update = sum(r["batch"] * rep.grad(rep.params, r["worker"], r["batch"]) for r in pushes)
        rep.params = rep.params - sim.cfg.lr * update / total
    assert len({r["batch"] for r in steps}) > 1  # LB-BSP did move the batches
    assert torch.allclose(sim.trainer.store.values, rep.params, atol=1e-6)
    assert summary["simulator"]["peak_snapshots"] == 0  # nobody holds an old version in BSP


def test_old_versions_are_kept_only_while_referenced(tmp_path):
    sim, summary, _ = run(tmp_path, sync="asp", workers=12, steps=8)
    assert 0 < summary["simulator"]["peak_snapshots"] <= 12
    assert not sim.trainer.snapshots and not sim.trainer.refcount


def test_evaluations_at_virtual_time_intervals_and_a_final_one(tmp_path):
    sim, summary, steps = run(tmp_path, sync="bsp", workers=8, steps=40, eval_interval=0.1)
    evals = [r for r in read_records(tmp_path / "metrics.jsonl") if r["kind"] == "eval"]
    assert [e["t"] for e in evals[:-1]] == pytest.approx([0.1 * i for i in range(len(evals) - 1)])
    assert evals[-1]["final"] and not any(e["final"] for e in evals[:-1])
    assert evals[-1]["t"] == pytest.approx(max(r["t"] for r in steps), abs=0.01)
    assert evals[-1]["samples"] == 8 * 40 * 32
    assert summary["final_test_accuracy"] >= 0.85 > evals[0]["accuracy"]
    assert all("loss" in r and "epoch" in r for r in steps)


def test_cli_train(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--train", "--model", "logreg", "--sync", "ssp", "--workers", "6",
                 "--steps", "10", "--eval-interval", "0.1", "--out", str(out), "--quiet"]) == 0
    assert "final test accuracy" in capsys.readouterr().out
    job = json.loads((out / "job.json").read_text())
    assert job["optimizer"]["name"] == "sgd" and job["sim"]["train"]


def test_auto_sums_its_lockstep_rounds_as_fixed_bsp_does(tmp_path):
    """The simulator's store under auto stays in arrival mode and sums each lockstep round
    (round_id): with bsp the only candidate the trained values are fixed BSP's; a run that
    switches between lockstep and asp trains to its end, the store's staleness checked
    against the engine's at every push (they disagreed under auto before)."""
    fixed, _, _ = run(tmp_path / "bsp", sync="bsp")
    auto, _, steps = run(tmp_path / "auto", sync="auto", sync_options={"candidates": "bsp"})
    torch.testing.assert_close(auto.trainer.store.values, fixed.trainer.store.values,
                               rtol=0, atol=1e-7)
    assert {r["staleness"] for r in steps} == {0}
    _, summary, steps = run(tmp_path / "switch", sync="auto", steps=60, workers=4,
                            sync_options={"candidates": "bsp,asp", "interval": 0.02,
                                          "margin": 0.0}, straggler="schedule:1:0.3-=4")
    events = [json.loads(line) for line in (tmp_path / "switch" / "events.jsonl").open()]
    assert [e["to"] for e in events if e.get("event") == "sync_switch"][:2] == ["bsp", "asp"]
    assert len(steps) == 240 and max(r["staleness"] for r in steps) > 0
