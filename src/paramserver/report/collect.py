"""Find run folders under a directory and load what the report needs from each (logs only)."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from paramserver.policies import SYNC_POLICIES
from paramserver.report.core.timeline import membership_timeline
from paramserver.runlog.metrics import (
    evaluations, read_records, summarize, time_to_accuracy, time_to_auc,
)

DEFAULT_TARGET = 0.95
# What a run is scored by: accuracy, or the test AUC for click models (dlrm), whose accuracy
# sits near the share of the majority class. score -> (label, default target).
SCORES = {"accuracy": ("test accuracy", DEFAULT_TARGET), "auc": ("test AUC", 0.70)}


def fmt_target(score: str, target: float) -> str:
    """'95% test accuracy', 'test AUC 0.7'."""
    return f"{100 * target:g}% test accuracy" if score == "accuracy" else f"test AUC {target:g}"
SINGLE = "single"  # the folder name of the one-worker reference runs in a compare folder
_REP = re.compile(r"rep-(\d+)$")
# Without a plan, policies appear in this order: the BSP baseline first, as in compare's default.
KNOWN_ORDER = tuple(SYNC_POLICIES.names())  # the registry's order: bsp first, as --sync lists


class ReportError(Exception):
    """The folder cannot give a report at all (missing, or no runs in it)."""


@dataclass
class Run:
    """One run folder: its place in the plan, its summary and the series the figures draw."""

    path: Path
    scenario: str
    policy: str
    repeat: int
    summary: dict
    evals: list[dict]  # eval records sorted by time
    staleness: dict[int, int]  # staleness -> steps pushed at it
    train_time: float  # t of the last step record: the final evaluation can come much later
    recomputed: bool = False  # summary.json was missing or unreadable
    # A simulation's steps.npz (sim.core.stepstats): per-step quantile bands, per-worker totals.
    step_stats: dict | None = None
    # Membership changes from events.jsonl (report/core/timeline.py): joins, leaves, waits, losses.
    timeline: tuple = ()

    @property
    def global_batch(self) -> int:
        # The single reference runs one worker with the whole global batch, so this holds for both.
        s = self.summary
        return max(1, int(s.get("batch_size") or 1) * int(s.get("workers") or 1))

    @property
    def samples_per_s(self) -> float:
        """Samples per second of training, not of wall time: the wait for the last evaluation
        says nothing about how fast a policy trains."""
        time = self.train_time or self.summary.get("wall_time_s") or 0.0
        return (self.summary.get("samples") or 0) / time if time else 0.0

    @property
    def evals_in_training(self) -> int:
        return sum(1 for e in self.evals if e["t"] <= self.train_time)

    @property
    def eval_lag(self) -> float:
        """Seconds from the last step to the last evaluation."""
        return max(0.0, self.evals[-1]["t"] - self.train_time) if self.evals else 0.0

    @property
    def score(self) -> str:
        """"auc" when the evaluator scored the run's AUC (a click model), else "accuracy"."""
        return "auc" if any(e.get("auc") is not None for e in self.evals) else "accuracy"

    def time_to(self, target: float) -> float | None:
        """Seconds until the run's score first reached target (the summary's value if any)."""
        key = f"{target:g}"
        auc = self.score == "auc"
        known = self.summary.get("time_to_auc" if auc else "time_to_accuracy") or {}
        if key in known:
            return known[key]
        return (time_to_auc if auc else time_to_accuracy)(self.evals, (target,))[key]


@dataclass
class Collection:
    """Every readable run under a folder, the compare plan (if any) and what went wrong."""

    root: Path
    plan: dict | None
    runs: list[Run]
    warnings: list[str] = field(default_factory=list)

    @property
    def score(self) -> str:
        """What the runs are scored by: AUC when any run is a click model's."""
        return "auc" if any(r.score == "auc" for r in self.runs) else "accuracy"

    @property
    def target(self) -> float:
        """The plan's target on the runs' score, else the score's default."""
        return float((self.plan or {}).get("target_accuracy") or SCORES[self.score][1])

    def scenarios(self) -> list[str]:
        planned = list(((self.plan or {}).get("scenarios") or {}).keys())
        seen = [r.scenario for r in self.runs]
        return [s for s in planned if s in seen] + sorted(set(seen) - set(planned))

    def policies(self, scenario: str | None = None) -> list[str]:
        """Policies in plan order, then any others found, the single reference last."""
        found = {r.policy for r in self.runs if scenario is None or r.scenario == scenario}
        planned = [p for p in (self.plan or {}).get("policies") or KNOWN_ORDER if p in found]
        rest = sorted(found - set(planned) - {SINGLE})
        return planned + rest + ([SINGLE] if SINGLE in found else [])

    def select(self, scenario: str, policy: str) -> list[Run]:
        return sorted((r for r in self.runs if r.scenario == scenario and r.policy == policy),
                      key=lambda r: r.repeat)


STEP_STATS = "steps.npz"  # written by the simulator (sim.records)
_STEP_LINE = '"kind": "step"'


def _read_step_stats(path: Path) -> dict | None:
    try:
        with np.load(path / STEP_STATS) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError):
        return None


def _other_records(path: Path) -> list[dict]:
    """The records of metrics.jsonl that are not steps, without parsing the step lines (a
    simulation with --detail steps has millions)."""
    records = []
    with open(path) as f:
        for line in f:
            if _STEP_LINE in line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def load_run(path: Path, scenario: str, policy: str | None, repeat: int,
             warnings: list[str]) -> Run:
    """Read one run folder; the summary is recomputed from metrics.jsonl if summary.json fails.
    A simulation's steps come from its steps.npz when it has one (and its summary.json)."""
    stats = _read_step_stats(path) if (path / STEP_STATS).exists() else None
    summary = _read_json(path / "summary.json")
    if stats is not None and isinstance(summary, dict) and "wall_time_s" in summary:
        records = _other_records(path / "metrics.jsonl")
        evals = evaluations(records)
        for e in evals:
            float(e["accuracy"]), float(e["t"])
        stale = dict(zip(stats["staleness_values"].tolist(), stats["staleness_counts"].tolist()))
        return Run(path, scenario, policy or summary.get("sync") or "unknown", repeat, summary,
                   evals, stale, float(stats["train_time"]), False, stats,
                   timeline=_timeline(path / "events.jsonl"))  # a simulated membership's
    records = read_records(path / "metrics.jsonl")
    if not records:
        raise ValueError("metrics.jsonl holds no records")
    summary, recomputed = _read_json(path / "summary.json"), False
    if not isinstance(summary, dict) or "wall_time_s" not in summary:
        config = _read_json(path / "config.json") or {}
        summary, recomputed = summarize(records, config.get("job") or {}), True
        warnings.append(f"{path}: summary.json missing or unreadable; "
                        "recomputed from metrics.jsonl")
    evals = evaluations(records)
    for e in evals:
        float(e["accuracy"]), float(e["t"])  # fail here, not in a figure, on a malformed record
    steps = [r for r in records if r.get("kind") == "step"]
    stale = dict(Counter(int(r.get("staleness") or 0) for r in steps))
    train_time = max((float(r["t"]) for r in steps), default=0.0)
    return Run(path, scenario, policy or summary.get("sync") or "unknown", repeat, summary, evals,
               stale, train_time, recomputed, timeline=_timeline(path / "events.jsonl"))


def _timeline(path: Path) -> tuple:
    """The run's membership changes; none when it has no (readable) events.jsonl."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ()
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a kill: the rest still tells the story
    return tuple(membership_timeline(events))


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _try_load(path: Path, scenario: str, policy: str | None, repeat: int,
              warnings: list[str]) -> Run | None:
    # One bad run must not sink the report: any failure becomes a warning.
    try:
        return load_run(path, scenario, policy, repeat, warnings)
    except Exception as exc:  # noqa: BLE001 - anything a damaged file can raise
        warnings.append(f"skipped {path}: {type(exc).__name__}: {exc}")
        return None


def _compare_runs(root: Path, warnings: list[str]) -> list[tuple]:
    """(path, scenario, policy, repeat) of the runs/<scenario>/<policy>/rep-<k>/ folders."""
    found = []
    for rep in sorted((root / "runs").glob("*/*/rep-*")):
        match = _REP.search(rep.name)
        if not rep.is_dir() or not match:
            continue
        if not (rep / "metrics.jsonl").exists():
            warnings.append(f"skipped {rep}: no metrics.jsonl (the run did not start?)")
            continue
        if (_read_json(rep / "summary.json") or {}).get("interrupted") is True:
            # A Ctrl-C cut it short: set beside whole runs it would be judged as a policy's
            # outcome ("fell to chance" after ten steps). Its folder keeps what it did.
            warnings.append(f"skipped {rep}: interrupted before its end (its folder keeps "
                            "the steps done)")
            continue
        found.append((rep, rep.parent.parent.name, rep.parent.name, int(match.group(1))))
    return found


def _plain_runs(root: Path) -> list[tuple]:
    """Run folders anywhere under root, grouped by their summary's sync, a scenario per setting."""
    paths = sorted(p.parent for p in root.rglob("metrics.jsonl"))
    settings = {p: _setting(p) for p in paths}
    one_setting = len(set(settings.values())) <= 1
    counts: dict[tuple, int] = {}
    found = []
    for p in paths:
        scenario = root.name if one_setting else settings[p]
        # A one-worker reference run says "bsp" in its summary; its folder name says what it is.
        policy = SINGLE if SINGLE in p.relative_to(root).parts else (
            (_read_json(p / "summary.json") or {}).get("sync") or _config_sync(p))
        key = (scenario, policy)
        counts[key] = counts.get(key, -1) + 1
        found.append((p, scenario, policy, counts[key]))
    return found


def _setting(path: Path) -> str:
    cfg = (_read_json(path / "config.json") or {}).get("config") or {}
    summary = _read_json(path / "summary.json") or {}
    straggler = summary.get("straggler", cfg.get("straggler", "none"))
    device = summary.get("device_time", cfg.get("device_time", "off"))
    return f"straggler {straggler}, device time {device}"


def _config_sync(path: Path) -> str | None:
    return ((_read_json(path / "config.json") or {}).get("config") or {}).get("sync")


def collect(root: str | Path) -> Collection:
    """All runs under root: a compare folder, a folder of run folders, or one run folder."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"no such folder: {root}")
    warnings: list[str] = []
    plan = None
    if (root / "compare.json").exists():
        plan = _read_json(root / "compare.json")
        if not isinstance(plan, dict):
            warnings.append(f"{root / 'compare.json'} is unreadable; the plan is not shown")
            plan = None
        found = _compare_runs(root, warnings)
        warnings += [f"run failed: {r.get('folder')}: {r.get('error', 'no reason given')}"
                     for r in (plan or {}).get("runs") or [] if isinstance(r, dict)
                     and r.get("ok") is False]
    elif (root / "metrics.jsonl").exists():
        found = [(root, "run", None, 0)]
    else:
        found = _plain_runs(root)
    runs = [r for r in (_try_load(*f, warnings) for f in found) if r is not None]
    if not runs:
        raise ReportError(f"no readable runs under {root}"
                          + (f" ({len(warnings)} skipped)" if warnings else ""))
    return Collection(root, plan, runs, warnings)
