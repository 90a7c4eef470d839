"""Straggler attribution (report/attribution.py) on synthetic run folders: who cost how much."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from paramserver.report import build_report, collect
from paramserver.report.attribution import (
    COLUMNS, attribution_csv, attribution_section, blames, run_blames,
)
from ps_helpers import bsp_run


def write_run(run: Path, records: list[dict], policy: str, workers: int = 4,
              links: dict | None = None, preflight: list | None = None) -> Path:
    run.mkdir(parents=True)
    records = sorted(records, key=lambda r: r["t"])
    evals = [{"t": records[-1]["t"], "kind": "eval", "accuracy": 0.5, "test_loss": 1.0,
              "samples": 100, "version": 1, "final": True}]
    with open(run / "metrics.jsonl", "w") as f:
        for r in records + evals:
            f.write(json.dumps(r) + "\n")
    (run / "config.json").write_text(json.dumps({"sync": policy}))
    (run / "job.json").write_text(json.dumps({"sync": {"name": policy}, "links": links or {}}))
    (run / "summary.json").write_text(json.dumps({
        "sync": policy, "workers": workers, "batch_size": 32, "steps": len(records),
        "samples": 32 * len(records), "wall_time_s": records[-1]["t"],
        "final_test_accuracy": 0.5, "best_test_accuracy": 0.5, "time_to_accuracy": {}}))
    if preflight is not None:
        (run / "preflight.json").write_text(json.dumps({"version": 1, "t": 0.0,
                                                       "links": preflight}))
    return run


def with_factor(records: list[dict], slow: dict) -> list[dict]:
    return [{**r, "factor": slow.get(r["worker"], lambda k: 1.0)(r["step"])} for r in records]


@pytest.fixture
def root(tmp_path) -> Path:
    chronic = {1: lambda k: 3.0}
    burst = {1: lambda k: 3.0, 2: lambda k: 3.0 if 25 <= k < 28 else 1.0}
    write_run(tmp_path / "chronic", with_factor(bsp_run(40, chronic), chronic), "bsp",
              links={"w": {"1": "100mbit,5ms"}},
              preflight=[{"worker": "worker-1", "shard": 0, "rtt_ms": 5.2, "mbit_s": 96.0,
                          "bytes": 1}])
    write_run(tmp_path / "burst", with_factor(bsp_run(40, burst), burst), "bsp")
    return tmp_path


def test_the_chronic_straggler_is_blamed_for_nearly_all_the_waiting(root):
    c = collect(root)
    run = next(r for r in c.runs if r.path.name == "chronic")
    rows = run_blames(run)
    top = rows[0]
    assert top.worker == 1 and top.state == "chronic" and top.share > 0.99
    # 40 rounds, 3 others waiting ~1 s each for it
    assert top.lost_s == pytest.approx(120, rel=0.1)
    assert top.chronic_s > 0.6 * top.lost_s and top.chronic_steps >= 25
    assert top.mean_factor == 3.0
    assert top.link == "--link 100mbit,5ms; s0: 5.20 ms 96 Mbit/s"
    assert {r.worker for r in rows} == {0, 1, 2, 3} and rows[1].lost_s < 1.0


def test_a_burst_is_charged_as_transient(root):
    c = collect(root)
    run = next(r for r in c.runs if r.path.name == "burst")
    by = {b.worker: b for b in run_blames(run)}
    # worker 2 as slow as the straggler for 3 rounds: the later of the two closes them
    assert by[2].transient_s + by[2].normal_s == pytest.approx(by[2].lost_s)
    assert by[2].chronic_s == 0.0 and by[2].state == "ok"
    assert by[1].lost_s > 10 * by[2].lost_s


def test_csv_and_section(root, tmp_path):
    rows = blames(collect(root))
    table = list(csv.DictReader(io.StringIO(attribution_csv(rows))))
    assert tuple(table[0]) == COLUMNS and len(table) == 8
    # two plain run folders under one root: one scenario and policy, two repeats
    assert {r["policy"] for r in table} == {"bsp"} and len({r["repeat"] for r in table}) == 2
    first = next(r for r in table if r["run_folder"].endswith("chronic"))
    assert first["worker"] == "1" and first["state"] == "chronic"
    assert float(first["lost_s"]) > 100 and float(first["share"]) > 0.99
    page = attribution_section(rows)
    assert "Who the others waited for" in page and "attribution.csv" in page
    assert page.count("<table>") == 1 and "100mbit" in page
    assert page.index("<tr><td>1</td>") < page.index("<tr><td>2</td>")  # costliest first
    assert attribution_section([]) == ""


def test_the_report_writes_attribution_csv_and_the_section(root):
    page = build_report(root)
    assert "Who the others waited for" in page.read_text()
    assert (root / "attribution.csv").read_text().startswith("scenario,policy,repeat,worker")
