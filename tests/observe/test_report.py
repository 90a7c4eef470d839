"""`paramserver report`: table, figures and report.html from hand-written run folders."""

import base64
import csv
import html
import io
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from paramserver.cli.main import main
from paramserver.runlog.metrics import summarize
from paramserver.report import VERDICT_TXT, build_report, collect, table_rows
from paramserver.report import figures, series
from paramserver.report.figures import KINDS
from paramserver.report.html import coverage_warnings, plan_section, render_report
from paramserver.report.results_csv import COLUMNS, results_csv
from paramserver.report.table import render_table

TARGET = 0.9
BATCH, WORKERS = 10, 2

# Time to 0.9 per repeat (None: never): medians by hand below.
PLAN_TTA = {"bsp": [2.0, 4.0, 3.0], "asp": [1.0, 1.5, None], "ssp": [None, None, 1.0],
            "single": [6.0]}


def job(sync: str, workers: int = WORKERS, batch: int = BATCH) -> dict:
    return {"sync": {"name": sync}, "workers": workers, "servers": 1, "batch_size": batch,
            "apply_mode": "round" if sync == "bsp" else "arrival",
            "optimizer": {"name": "sgd", "lr": 0.1},
            "task": {"model": "mlp", "dataset": "digits", "straggler": "1:3",
                     "device_time": "1ms"}}


def step(t, worker, n, staleness=0, compute=0.1, wait=0.05, batch=BATCH):
    return {"t": t, "kind": "step", "worker": worker, "step": n, "batch": batch, "loss": 1.0,
            "compute_s": compute, "real_compute_s": compute / 2, "wait_s": wait, "pull_s": 0.01,
            "push_s": 0.02, "pull_bytes": 100, "push_bytes": 100, "staleness": staleness}


def records_for(tta: float | None, staleness: int, workers: int = WORKERS,
                batch: int = BATCH) -> list[dict]:
    """Four steps per worker (the last at t=5.0), evals at t=0.5, tta (0.9) and 8.0."""
    recs = [step(1.0 + n + 0.1 * w, w, n, staleness=staleness * w, batch=batch)
            for n in range(4) for w in range(workers)]
    recs[-1]["t"] = 5.0
    evals = [(0.5, 0.4)] + ([(tta, 0.92)] if tta is not None else []) + [
        (8.0, 0.95 if tta is not None else 0.8)]
    recs += [{"t": t, "kind": "eval", "accuracy": a, "test_loss": 1 - a,
              "samples": int(t * 10), "version": 0, "final": t == 8.0} for t, a in evals]
    return recs


def write_run(path: Path, records: list[dict], job_: dict, summary: bool = True) -> None:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"config": {}, "job": job_}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "events.jsonl").write_text("")
    if summary:
        (path / "summary.json").write_text(json.dumps(summarize(records, job_)))


def make_compare(root: Path, plan_tta=PLAN_TTA) -> Path:
    plan = {"scenarios": {"one-slow": {"straggler": "1:3", "description": "worker 1 is 3x slower"}},
            "policies": ["bsp", "asp", "ssp"], "repeats": 3, "target_accuracy": TARGET,
            "config": {"workers": WORKERS, "batch_size": BATCH},
            "notes": ["digits saturates fast; use mnist to see accuracy differences"]}
    root.mkdir(parents=True, exist_ok=True)
    (root / "compare.json").write_text(json.dumps(plan))
    for policy, ttas in plan_tta.items():
        for k, tta in enumerate(ttas):
            single = policy == "single"
            recs = records_for(tta, staleness=0 if policy in ("bsp", "single") else k + 1,
                               workers=1 if single else WORKERS,
                               batch=BATCH * WORKERS if single else BATCH)
            write_run(root / "runs" / "one-slow" / policy / f"rep-{k}", recs,
                      job("bsp" if single else policy, 1 if single else WORKERS))
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = make_compare(tmp_path_factory.mktemp("report") / "cmp")
    page = build_report(root)
    return root, page


def rows_by_policy(root):
    return {r.policy: r for r in table_rows(collect(root))}


def test_table_medians_spreads_and_speedups_match_hand_values(built):
    rows = rows_by_policy(built[0])
    assert list(rows) == ["bsp", "asp", "ssp", "single"]
    bsp, asp, ssp, single = rows.values()
    assert (bsp.tta_median, bsp.tta_min, bsp.tta_max, bsp.reached) == (3.0, 2.0, 4.0, 3)
    assert bsp.speedup == pytest.approx(1.0)
    # A repeat that never reached the target counts as infinitely slow: median of 1, 1.5, inf.
    assert (asp.tta_median, asp.tta_min, asp.tta_max, asp.reached) == (1.5, 1.0, 1.5, 2)
    assert asp.speedup == pytest.approx(3.0 / 1.5)
    assert ssp.tta_median is None and ssp.speedup is None and ssp.reached == 1
    assert single.reference and single.tta_median == 6.0 and single.speedup == pytest.approx(0.5)
    assert asp.final_accuracy == pytest.approx(0.95)  # median of 0.95, 0.95, 0.8
    assert ssp.final_accuracy == pytest.approx(0.8) and ssp.best_accuracy == pytest.approx(0.8)
    # Staleness of repeat k is (k + 1) * worker: means 0.5, 1.0, 1.5 -> 1.0.
    assert asp.staleness == pytest.approx(1.0) and bsp.staleness == 0
    # wait / (compute + wait + pull + push) = 0.05 / 0.18 for every worker.
    assert bsp.wait_fraction == pytest.approx(0.05 / 0.18)
    assert bsp.samples_per_s == pytest.approx(8 * BATCH / 5.0)  # last step at t = 5
    assert bsp.real_compute_share == pytest.approx(0.5)


def test_results_csv_has_one_row_per_run_with_the_summary_values(built):
    root, _ = built
    with (root / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(COLUMNS)
    runs = [p for p in (root / "runs").glob("*/*/rep-*")]
    assert len(rows) == len(runs) == 10
    assert [(r["policy"], r["repeat"]) for r in rows][:4] == [
        ("bsp", "0"), ("bsp", "1"), ("bsp", "2"), ("asp", "0")]  # report order
    for r in rows:
        folder = Path(r["run_folder"])
        summary = json.loads((folder / "summary.json").read_text())
        assert folder.parts[-3:] == (r["scenario"], r["policy"], f"rep-{r['repeat']}")
        tta = PLAN_TTA[r["policy"]][int(r["repeat"])]
        assert r["time_to_target_s"] == ("" if tta is None else repr(tta))
        assert (r["reached"], r["diverged"]) == (str(int(tta is not None)), "0")
        assert r["outcome"] == ("ok" if tta is not None else "plateaued")
        assert float(r["final_score"]) == summary["final_test_accuracy"]
        assert float(r["wait_fraction"]) == pytest.approx(summary["mean_wait_fraction"])
        assert float(r["mean_staleness"]) == pytest.approx(summary["mean_staleness"])
        assert int(r["steps"]) == summary["steps"]
        assert float(r["samples_per_s"]) == pytest.approx(summary["samples"] / 5.0)
        assert (r["target"], r["score"]) == ("0.9", "accuracy")
    assert "href='results.csv'" in (root / "report.html").read_text()


def test_the_settings_say_which_policies_ran_with_their_own_update_rule(tmp_path):
    root = make_compare(tmp_path / "cmp")
    plan = json.loads((root / "compare.json").read_text())
    plan["config"]["optimizer"] = "sgd"
    plan["policy_optimizers"] = {"ssp": "dynsgd"}  # what compare writes by default
    (root / "compare.json").write_text(json.dumps(plan))
    text = plan_section(collect(root))
    assert "<tr><th>optimizer</th><td>sgd; dynsgd for ssp</td></tr>" in text


def test_time_to_a_target_the_summary_lacks_comes_from_the_evaluations(built):
    c = collect(built[0])
    run = c.select("one-slow", "bsp")[0]  # evals: 0.4 at 0.5 s, 0.92 at 2 s, 0.95 at 8 s
    assert "0.93" not in run.summary["time_to_accuracy"]
    assert run.time_to(0.93) == 8.0 and run.time_to(0.92) == 2.0 and run.time_to(0.99) is None
    assert rows_by_policy(built[0])["bsp"].tta_median == 3.0
    assert {r.policy: r.tta_median for r in table_rows(c, 0.93)}["bsp"] == 8.0


def test_missing_summary_is_recomputed_from_metrics(tmp_path):
    root = make_compare(tmp_path / "cmp", {"bsp": [2.0], "asp": [1.0]})
    (root / "runs/one-slow/asp/rep-0/summary.json").unlink()
    c = collect(root)
    run = c.select("one-slow", "asp")[0]
    assert run.recomputed and run.summary["steps"] == 8 and run.summary["sync"] == "asp"
    assert run.time_to(TARGET) == 1.0
    assert any("recomputed" in w and "asp" in w for w in c.warnings)
    assert rows_by_policy(root)["asp"].speedup == pytest.approx(2.0)


def test_a_corrupt_run_is_skipped_with_a_warning_in_the_report(tmp_path):
    root = make_compare(tmp_path / "cmp", {"bsp": [2.0, 3.0], "asp": [1.0]})
    bad = root / "runs/one-slow/bsp/rep-1"
    (bad / "summary.json").unlink()
    (bad / "metrics.jsonl").write_bytes(b"\x00\xff garbage \xfe\n")
    (root / "runs/one-slow/asp/rep-7").mkdir()  # a run that never started
    plan = json.loads((root / "compare.json").read_text())
    plan["runs"] = [{"folder": str(root / "runs/one-slow/asp/rep-7"), "ok": False,
                     "error": "LaunchError: worker 2 exited"}]
    (root / "compare.json").write_text(json.dumps(plan))
    c = collect(root)
    page = render_report(c, table_rows(c), [])  # figures are not the point here, and cost time
    assert [r.repeat for r in c.select("one-slow", "bsp")] == [0]
    assert sum(str(bad) in w and "skipped" in w for w in c.warnings) == 1
    assert any("rep-7" in w for w in c.warnings)
    assert f"skipped {bad}" in page and "rep-7" in page
    assert "LaunchError: worker 2 exited" in page


def test_a_run_a_ctrl_c_cut_short_is_not_compared(tmp_path):
    """compare's Ctrl-C draws the report from the finished runs: the one it interrupted (its
    summary marked so) was judged beside them, as a policy that never reached the target."""
    root = make_compare(tmp_path / "cmp", {"bsp": [2.0], "asp": [None]})
    cut = root / "runs/one-slow/asp/rep-0"
    summary = json.loads((cut / "summary.json").read_text())
    (cut / "summary.json").write_text(json.dumps({**summary, "interrupted": True}))
    c = collect(root)
    assert [r.policy for r in c.runs] == ["bsp"]
    assert any(f"skipped {cut}: interrupted" in w for w in c.warnings), c.warnings
    page = render_report(c, table_rows(c), [])
    assert f"skipped {cut}: interrupted" in html.unescape(page)


def test_every_figure_is_written_and_not_empty(built):
    root, _ = built
    for kind in KINDS:
        png = root / "figures" / f"{kind}-one-slow.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, kind


def test_report_embeds_every_figure_and_references_nothing_outside(built):
    root, page = built
    text = page.read_text()
    uris = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    embedded = {base64.b64decode(u) for u in uris}
    for png in (root / "figures").glob("*.png"):
        assert png.read_bytes() in embedded, png.name
    assert len(uris) == len(KINDS)
    assert not re.search(r"https?:", text, re.I)
    assert "<link" not in text and "<script" not in text and "@import" not in text
    assert "digits saturates fast" in text and "worker 1 is 3x slower" in text
    assert "never reached 90%" in text  # the asp and ssp repeats that missed


def test_report_opens_with_the_verdict_and_its_figure_and_folds_the_settings(built):
    text = built[1].read_text()
    verdict = text.index("<p class='verdict'>")
    # the fastest policy, by the hand values of PLAN_TTA (asp 1.5 s, bsp 3.0 s)
    assert "asp is the soonest to reach 90% test accuracy: 1.50 s" in text
    assert "×2.00 sooner than BSP" in text
    # ssp's misses: named with the cause and fix, in the verdict and under its table row
    why = ("ssp plateaued below the target in 2 of 3 repeats: the sample budget ran out first "
           "(best 80.0%); stale pushes (mean staleness 1.0) learn less per sample; use more "
           "--epochs")
    assert why in text[verdict:text.index("<figure")]
    ssp_row = text.index("<tr class='missed'><td>ssp</td>")
    assert text.index("<tr class='why'><td colspan='13'>↳ " + why, ssp_row) \
        == text.index("</tr>", ssp_row) + len("</tr>\n")
    first_table = text.index("<table")
    first_figure = text.index("<figure")
    assert verdict < first_figure < first_table  # answer, then its figure, then the numbers
    assert "alt='tta one-slow'" in text[first_figure:first_figure + 40]
    assert text.index("<table class='tta'>") == first_table  # time to target before settings
    details = text.index("<details class='settings'>")
    settings = text.index("Training settings shared by every run")
    assert details < settings < text.index("</details>", details)
    assert text.index("<th>scenario</th><th>straggler</th>") > details


def test_time_to_target_bars_are_the_table_values(built, monkeypatch):
    root, _ = built
    c = collect(root)
    rows = table_rows(c)
    bars = series.tta_series(rows, "one-slow")
    assert [(b["policy"], b["median"]) for b in bars] == [
        ("bsp", 3.0), ("asp", 1.5), ("ssp", None), ("single", 6.0)]
    drawn = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.append(fig) or path)
    figures.plot_tta(bars, "one-slow", TARGET, root / "unused.png")
    heights = [p.get_height() for p in drawn[0].axes[0].patches]
    assert heights == [3.0, 1.5, 6.0]  # ssp never reached: no bar, a "not reached" label
    labels = [t.get_text() for t in drawn[0].axes[0].texts]
    assert "×2.00 vs BSP" in labels[1] and labels[2].startswith("not reached")


def test_other_figures_plot_the_summaries_and_logs(built):
    c = collect(built[0])
    rows = {r.policy: r for r in table_rows(c)}
    tput = series.throughput_series(c, "one-slow")
    assert all(tput[p]["median"] == pytest.approx(rows[p].samples_per_s) for p in rows)
    parts = series.breakdown_series(c, "one-slow")
    assert "single" not in parts and list(parts["bsp"]) == ["0", "1"]
    assert parts["bsp"]["0"] == pytest.approx((0.4, 0.12, 0.2))  # 4 steps of the step() record
    values, fractions = series.staleness_series(c, "one-slow")["asp"]
    assert values == [0, 1, 2, 3] and fractions == pytest.approx([0.5, 1 / 6, 1 / 6, 1 / 6])
    acc = series.accuracy_series(c, "one-slow", "steps")
    first = c.select("one-slow", "bsp")[0]
    assert acc["bsp"]["repeats"][0] == ([e["samples"] / 20 for e in first.evals],
                                        [e["accuracy"] for e in first.evals])


def test_median_curve_holds_each_curve_at_its_last_value():
    xs, ys = series.median_curve([([0, 2], [0.1, 0.9]), ([0, 1], [0.3, 0.5]),
                                  ([0, 4], [0.2, 0.6])])
    assert list(xs) == [0, 1, 2, 4]
    assert list(ys) == pytest.approx([0.2, 0.2, 0.5, 0.6])
    # Curves that start apart: the median starts where the last one starts.
    xs, ys = series.median_curve([([7.0], [0.95]), ([12.0], [0.91])])
    assert list(xs) == [12.0] and list(ys) == pytest.approx([0.93])


def test_runs_evaluated_too_rarely_are_flagged(tmp_path):
    dense = [step(0.1 * n, 0, n) for n in range(50)] + [
        {"t": 0.5 * k, "kind": "eval", "accuracy": 0.5 + 0.05 * k, "samples": 50 * k}
        for k in range(1, 11)]
    sparse = [step(0.1 * n, 0, n) for n in range(50)] + [
        {"t": 12.0, "kind": "eval", "accuracy": 0.96, "samples": 500}]
    write_run(tmp_path / "runs" / "bsp", dense, job("bsp", workers=1))
    write_run(tmp_path / "runs" / "asp", sparse, job("asp", workers=1))
    c = collect(tmp_path / "runs")
    flagged = coverage_warnings(c)
    assert len(flagged) == 1 and flagged[0].startswith("asp in runs: 0 evaluation(s)")
    assert "7.1 s after the last step" in flagged[0]
    assert c.select("runs", "asp")[0].samples_per_s == pytest.approx(500 / 4.9)


def test_a_diverged_run_is_named_in_the_warnings(tmp_path):
    root = make_compare(tmp_path / "cmp")
    folder = root / "runs" / "one-slow" / "asp" / "rep-1"
    recs = records_for(None, staleness=2)
    recs[-1]["test_loss"] = float("nan")  # the last evaluation, at t=8.0
    shutil.rmtree(folder)
    write_run(folder, recs, job("asp"))
    c = collect(root)
    text = render_report(c, table_rows(c), [])
    assert text.count(") diverged: its test loss") == 1  # (the folder name has the word too)
    assert "asp in one-slow (repeat 1) diverged: its test loss is not a finite number from " \
           "8.0 s" in text
    verdict = re.search(r"<p class='verdict'>(.*?)</p>", text).group(1)
    assert ("asp diverged in 1 of 3 repeats (and plateaued below the target in 1 of 3 "
            "repeats): test loss NaN or infinite from 8.0 s; ASP applies every push at the full "
            "lr 0.1 with mean staleness 1.0: stale gradients overshoot; use --optimizer dynsgd "
            "or --lr 0.033") in verdict


def test_plain_folders_group_by_sync_and_one_run_folder_is_one_run(tmp_path):
    for name, sync, tta in (("a", "bsp", 2.0), ("b", "asp", 1.0), ("c", "bsp", 4.0)):
        write_run(tmp_path / "runs" / name, records_for(tta, 0), job(sync))
    c = collect(tmp_path / "runs")
    assert c.scenarios() == ["runs"] and c.policies() == ["bsp", "asp"]  # named after the folder
    assert c.target == 0.95  # no plan: the default target
    assert {r.policy: r.speedup for r in table_rows(c, TARGET)}["asp"] == pytest.approx(3.0)
    single = collect(tmp_path / "runs" / "a")
    assert [(r.scenario, r.policy) for r in single.runs] == [("run", "bsp")]


def test_cli_prints_the_page_and_fails_in_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "no such folder" in err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no readable runs" in capsys.readouterr().err
    write_run(tmp_path / "one", records_for(2.0, 0), job("bsp"))
    assert main(["report", str(tmp_path / "one"), "--target", "0.5"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "one" / "report.html")
    assert (tmp_path / "one" / "results.csv").read_text().count("\n") == 2  # header + run


# CI setup: apt-get update && apt-get install -y chromium   (Debian package)
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--window-size=1280,800"]
# Added to a copy of the page (the report itself holds no script): once laid out, write where
# the opening elements landed into the DOM, for --dump-dom to print.
LAYOUT_PROBE = """<script>
addEventListener('load', () => {
  const box = sel => { const r = document.querySelector(sel).getBoundingClientRect();
                       return {top: r.top, bottom: r.bottom, height: r.height}; };
  const out = {h1: box('h1'), verdict: box('p.verdict'), figure: box('figure'),
               table: box('table.tta'), screen: innerHeight, width: innerWidth,
               page_width: document.documentElement.scrollWidth,
               order: [...document.body.children].slice(0, 5).map(
                 e => e.tagName.toLowerCase() + (e.className ? '.' + e.className : ''))};
  const pre = document.createElement('pre'); pre.id = 'layout';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


@pytest.mark.skipif(not shutil.which("chromium"), reason="chromium is not installed "
                    "(apt-get install -y chromium) so report.html is not rendered")
def test_report_renders_in_headless_chromium_with_the_verdict_first(built, tmp_path):
    _, page = built
    profile = f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}"
    shot = tmp_path / "report.png"
    subprocess.run([*CHROMIUM, profile, f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.stat().st_size > 50_000
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    dom = subprocess.run([*CHROMIUM, profile, "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False).stdout
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom)
    assert found, dom[-2000:]
    layout = json.loads(html.unescape(found.group(1)))
    # As laid out: the title, one line on where the numbers come from, then the verdict and
    # its figure, the first things a reader meets...
    assert layout["order"] == ["h1", "p.sub", "h2", "p.verdict", "figure"]
    v, f, t = layout["verdict"], layout["figure"], layout["table"]
    assert layout["h1"]["bottom"] <= v["top"] and v["bottom"] <= f["top"] <= t["top"]
    # ...on the first screen: all of the verdict, and the top of its figure
    assert v["height"] > 0 and v["bottom"] <= layout["screen"]
    assert f["top"] < layout["screen"] and f["height"] > 200
    # Nothing wider than the window: a wide table scrolls in its own box, the page does not.
    assert layout["page_width"] <= layout["width"], layout
    narrow = subprocess.run([*CHROMIUM[:-1], "--window-size=640,800", profile, "--dump-dom",
                             probe.as_uri()], capture_output=True, text=True, timeout=120,
                            check=False).stdout
    small = json.loads(html.unescape(re.search(r'<pre id="layout">(.*?)</pre>', narrow).group(1)))
    assert small["page_width"] <= small["width"], small


def test_codec_runs_show_their_bytes_and_formats_in_table_and_csv(tmp_path):
    """A bf16 run (pushes and pulls: 2 bytes a value) beside a dense one: the table and
    results.csv show half the dense bytes per step, and which format each run used."""
    values = 9610  # the digits MLP's parameters
    dense, half = 4 * values, 2 * values
    root = tmp_path / "cmp"
    root.mkdir()
    (root / "compare.json").write_text(json.dumps(
        {"scenarios": {"slow-link": {"straggler": "none"}}, "policies": ["bsp", "asp"],
         "repeats": 1, "target_accuracy": TARGET, "config": {"workers": WORKERS}}))
    for policy, nbytes, codec in (("bsp", dense, "none"), ("asp", half, "bf16")):
        recs = records_for(2.0, staleness=0)
        for r in recs:
            if r["kind"] == "step":
                r.update(push_bytes=nbytes, pull_bytes=nbytes, push_codec=codec,
                         pull_codec=codec)
        write_run(root / "runs" / "slow-link" / policy / "rep-0", recs, job(policy))
    c = collect(root)
    rows = {r.policy: r for r in table_rows(c)}
    assert (rows["bsp"].push_bytes, rows["bsp"].pull_bytes) == (dense, dense)
    assert (rows["asp"].push_bytes, rows["asp"].pull_bytes) == (dense / 2, dense / 2)
    assert (rows["asp"].push_codecs, rows["asp"].pull_codecs) == (("bf16",), ("bf16",))
    page = render_table(list(rows.values()), TARGET)
    assert "<td>38.4 kB</td><td>38.4 kB</td><td>none / none</td>" in page
    assert "<td>19.2 kB</td><td>19.2 kB</td><td>bf16 / bf16</td>" in page
    assert "pull bytes/step" in page and "codec (push / pull)" in page
    with io.StringIO(results_csv(c)) as f:
        out = {r["policy"]: r for r in csv.DictReader(f)}
    for policy, nbytes, codec in (("bsp", dense, "none"), ("asp", half, "bf16")):
        r = out[policy]
        assert float(r["push_bytes_per_step"]) == float(r["pull_bytes_per_step"]) == nbytes
        assert r["push_codec"] == r["pull_codec"] == codec
    assert float(out["asp"]["push_bytes_per_step"]) * 2 == float(out["bsp"]["push_bytes_per_step"])


def test_bytes_cells_say_what_a_format_saved_against_float32():
    from paramserver.report.table import fmt_bytes_saved
    assert fmt_bytes_saved(1_864_724, 1_864_724) == "1.86 MB (−50%)"
    assert fmt_bytes_saved(3_729_448, None) == "3.73 MB"  # a dense run says nothing
    assert fmt_bytes_saved(3_729_448, 0) == "3.73 MB" and fmt_bytes_saved(None, 5) == "–"


def test_the_verdict_is_written_in_plain_words_beside_the_page(built):
    """verdict.txt (what compare prints when it ends) holds the page's verdict paragraphs, in
    the page's order, as text."""
    root, page = built
    html_paragraphs = [html.unescape(p) for p in
                       re.findall(r"<p class='verdict'>(.*?)</p>", page.read_text(), re.S)]
    text = (root / VERDICT_TXT).read_text(encoding="utf-8")
    assert html_paragraphs and text.rstrip("\n").split("\n\n") == html_paragraphs
    assert "asp is the soonest to reach 90% test accuracy" in text
