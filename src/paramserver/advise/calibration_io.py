"""Reads the calibration shipped as package data; beside the pure convergence model, which
gets the parsed JSON and never opens a file itself."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from paramserver.spec.run_job import RunJob

DEFAULT_NAME = "default_calibration.json"


def read_default() -> dict:
    text = resources.files("paramserver.advise").joinpath("data", DEFAULT_NAME).read_text(
        encoding="utf-8")
    return json.loads(text)


def default_convergence():
    """The shipped fit as a ConvergenceModel: the built-in digits MLP at compare's defaults."""
    from paramserver.predict.convergence import ConvergenceModel
    return ConvergenceModel.from_json(read_default())


def read_calibration(path) -> dict:
    """A calibration.json (or a bare convergence model) as the parsed JSON."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None


def _records(path: Path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a killed run


@dataclass(frozen=True)
class RunFolder:
    """What calibrate needs of one live run folder (compare's layout:
    .../runs/SCENARIO/POLICY/rep-K)."""
    folder: Path
    scenario: str
    policy: str
    repeat: int
    config: dict  # config.json's "config"
    job: RunJob  # config.json's "job"
    summary: dict
    evals: list  # (seconds, samples, accuracy), in time order

    @property
    def link(self) -> str:
        links = self.config.get("links") or []
        text = ";".join(links) if isinstance(links, list) else str(links)
        # One link for every worker reads as it was given (`w*=1gbit,1ms` -> `1gbit,1ms`).
        return text.removeprefix("w*=") if text and ";" not in text else text or "unlimited"


def read_run(folder: Path) -> RunFolder:
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    evals = sorted((r["t"], r.get("samples", 0), r["accuracy"])
                   for r in _records(folder / "metrics.jsonl")
                   if r.get("kind") == "eval" and r.get("accuracy") is not None)
    rep = folder.name.removeprefix("rep-")
    return RunFolder(folder, folder.parent.parent.name, folder.parent.name,
                     int(rep) if rep.isdigit() else 0, cfg["config"], RunJob.of(cfg.get("job")),
                     summary, evals)


def find_runs(root: Path) -> list[RunFolder]:
    """Every finished run (one with summary.json) under `root`, in path order; a run a Ctrl-C
    cut short (its summary.json marked interrupted) did not finish: its steps would be fitted
    as the policy's whole run."""
    return [read_run(p.parent) for p in sorted(Path(root).rglob("rep-*/summary.json"))
            if (p.parent / "config.json").exists() and (p.parent / "metrics.jsonl").exists()
            and not _interrupted(p)]


def _interrupted(summary: Path) -> bool:
    try:
        return json.loads(summary.read_text(encoding="utf-8")).get("interrupted") is True
    except (OSError, ValueError, AttributeError):
        return False  # (read_run says what is wrong with it)
