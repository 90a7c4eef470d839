"""Large simulations: step records as columns (steps.npz) instead of metrics.jsonl lines, a
summary from them equal to the one the full log gives, and a report that reads them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paramserver.cli.main import main
from paramserver.runlog.metrics import read_records, summarize
from paramserver.sim import SimConfig, simulate
from paramserver.sim.run import DETAIL_LIMIT


def _same(a, b, path=""):
    """Equal field by field; floats to the 6 decimals the log keeps of each record."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-5), path
    else:
        assert a == b, path


@pytest.mark.parametrize("sync,straggler", [("ssp", "none"), ("bsp", "random:0.2:3"),
                                            ("ebsp", "none"), ("r2sp", "random:0.1:2")])
def test_the_summary_from_columns_equals_the_summary_of_the_full_log(sync, straggler, tmp_path):
    def run(detail):
        cfg = SimConfig(sync=sync, workers=40, steps=15, param_bytes="1MB", straggler=straggler,
                        compute="lognormal:1ms:0.4", detail=detail)
        return simulate(cfg, tmp_path / detail)

    full, columns = run("steps"), run("summary")
    assert full["simulator"].pop("detail") == "steps"
    assert columns["simulator"].pop("detail") == "summary"
    _same(columns, full)
    job = json.loads((tmp_path / "steps" / "job.json").read_text())
    _same({k: v for k, v in columns.items() if k != "simulator"},
          summarize(read_records(tmp_path / "steps" / "metrics.jsonl"), job))
    # the columnar run's log holds no step, its events are the same
    recs = read_records(tmp_path / "summary" / "metrics.jsonl")
    assert {r["kind"] for r in recs} == {"left"} and len(recs) == 40
    assert ((tmp_path / "summary" / "events.jsonl").read_bytes()
            == (tmp_path / "steps" / "events.jsonl").read_bytes())


def test_steps_npz_holds_totals_histogram_and_bands(tmp_path):
    cfg = SimConfig(sync="asp", workers=30, steps=12, param_bytes="1MB",
                    compute="classes:0.8=1,0.2=4+lognormal:0.2", detail="steps")
    s = simulate(cfg, tmp_path)
    with np.load(tmp_path / "steps.npz") as z:
        stats = {k: z[k] for k in z.files}
    steps = [r for r in read_records(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    assert stats["worker"].tolist() == list(range(30)) and stats["steps"].tolist() == [12] * 30
    hist = dict(zip(stats["staleness_values"].tolist(), stats["staleness_counts"].tolist()))
    assert hist == {v: sum(r["staleness"] == v for r in steps) for v in hist}
    assert sum(hist.values()) == len(steps) == s["steps"]
    assert stats["band_step"].tolist() == list(range(12))
    assert stats["band_count"].tolist() == [30] * 12
    waits = sorted(r["wait_s"] for r in steps if r["step"] == 5)
    assert stats["band_wait_s"][5][1] == pytest.approx(np.median(waits), abs=1e-6)
    assert stats["train_time"] == pytest.approx(max(r["t"] for r in steps), abs=1e-6)


def test_auto_detail_keeps_small_runs_in_full_and_large_ones_in_columns(tmp_path):
    small = SimConfig(workers=10, steps=10)
    large = SimConfig(workers=DETAIL_LIMIT // 10 + 1, steps=10)
    assert small.step_detail and not large.step_detail
    assert SimConfig(workers=10, steps=10, detail="summary").step_detail is False
    assert SimConfig(workers=10**5, steps=10, detail="steps").step_detail is True
    with pytest.raises(ValueError, match="detail"):
        simulate(SimConfig(workers=2, steps=2, detail="bogus"), tmp_path)


def test_cli_detail_summary_run_folder_and_its_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--sync", "ebsp", "--workers", "300", "--steps", "8",
                 "--compute", "lognormal:2ms:0.3", "--param-bytes", "1MB", "--detail",
                 "summary", "--out", str(out), "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 2400 and s["simulator"]["detail"] == "summary"
    assert len(s["per_worker"]) == 300
    assert (out / "steps.npz").exists()
    assert not any(r["kind"] == "step" for r in read_records(out / "metrics.jsonl"))
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "ebsp" in page
    # no accuracy without --train: the verdict answers by throughput, nothing "plateaued"
    assert "no test accuracy was measured" in page and "plateaued" not in page
    assert "have no test evaluation" in page and "evaluation(s) during training" not in page
    from paramserver.report import collect
    run = collect(out).runs[0]
    assert sum(run.staleness.values()) == 2400
    assert run.train_time == pytest.approx(s["wall_time_s"], abs=1e-3)
