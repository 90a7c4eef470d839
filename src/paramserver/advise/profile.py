"""Where a profile comes from: a live run folder, a recorded trace CSV, or a short live run
started here (a built-in model through `train`'s machinery, or the user's script through
`launch`'s), bounded in time. Each gives an advise.core.cluster.Profile for the pure fit."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from paramserver.advise.core.cluster import ClusterFitError, Profile, StepSample
from paramserver.emulation.links import LinkTable
from paramserver.spec.run_job import RunJob
from paramserver.runlog.folders import runs_hint

TRACE_COLUMNS = "worker,step,compute_s[,batch][,pull_s,push_s,bytes][,wait_s]"


class ProfileError(ValueError):
    """A profile source that cannot be read: missing, not a run folder, a bad CSV."""


def load_profile(source: str | Path, *, batch_size: int | None = None,
                 link: str | None = None) -> Profile:
    """A run folder (metrics.jsonl beside config.json) or a trace CSV; `link` (a --link value)
    says what link a CSV's times were recorded on, when they were shaped."""
    path = Path(source)
    if not path.exists():
        raise ProfileError(f"profile {str(source)!r} does not exist (give a run folder of "
                           f"`paramserver train` or a CSV {TRACE_COLUMNS})")
    if path.is_dir():
        return load_run_folder(path)
    if path.suffix.lower() == ".csv":
        return load_trace_csv(path, batch_size=batch_size, link=link)
    if path.name == "metrics.jsonl":
        return load_run_folder(path.parent)
    raise ProfileError(f"profile {str(source)!r} is neither a run folder nor a .csv trace "
                       f"({TRACE_COLUMNS})")


def _num(value, what: str, where: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: {what} must be a number, got {value!r}") from None
    if not math.isfinite(x) or x < 0:
        raise ProfileError(f"{where}: {what} must be a finite number >= 0, got {value!r}")
    return x


def _worker_link(table: dict | list | None) -> tuple[float | None, float]:
    """The link the workers share in a run's config (bytes/s or None, latency): its default
    workers' entry. A link named for one worker is that worker's own: it shows in that
    worker's step records, and the fit keeps it to that worker's share."""
    if not table:
        return None, 0.0
    links = LinkTable.parse(table) if isinstance(table, list) else LinkTable.from_dict(table)
    spec = next((e.spec for e in links.entries if e.role == "w" and e.target == "*"), None)
    if spec is None:
        return None, 0.0
    return spec.bytes_per_s, spec.latency


def load_run_folder(folder: Path) -> Profile:
    metrics = folder / "metrics.jsonl"
    if not metrics.exists():
        raise ProfileError(f"{folder} is not a run folder: it has no metrics.jsonl"
                           f"{runs_hint(folder)}")
    try:
        doc = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{folder}: no readable config.json ({exc})") from None
    job, config = RunJob.of(doc.get("job")), doc.get("config") or {}
    steps, busy = [], {}
    with open(metrics) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a crashed run
            if r.get("kind") == "server" and "busy_s" in r:
                busy[int(r.get("server", 0))] = float(r["busy_s"])
            if r.get("kind") != "step":
                continue
            where = f"{metrics}:{n}"
            try:
                steps.append(StepSample(
                    worker=int(r["worker"]), step=int(r["step"]), batch=int(r.get("batch", 1)),
                    compute_s=(math.nan if "compute_s" not in r
                               else _num(r["compute_s"], "compute_s", where)),
                    pull_s=_num(r.get("pull_s"), "pull_s", where),
                    push_s=_num(r.get("push_s"), "push_s", where),
                    pull_bytes=_num(r.get("pull_bytes"), "pull_bytes", where),
                    push_bytes=_num(r.get("push_bytes"), "push_bytes", where),
                    wait_s=_num(r.get("wait_s"), "wait_s", where),
                    t=_num(r.get("t"), "t", where),
                    real_compute_s=_num(r.get("real_compute_s"), "real_compute_s", where)))
            except (KeyError, TypeError, ValueError) as exc:
                if isinstance(exc, ProfileError):
                    raise
                raise ProfileError(f"{where}: bad step record ({exc})") from None
    steps = _derive_compute(steps)
    if not steps:
        raise ProfileError(f"{folder}: metrics.jsonl has no step records with compute_s or t")
    rate, latency = _worker_link(job.links or config.get("links"))
    summary = None
    if (folder / "summary.json").exists():
        try:
            summary = json.loads((folder / "summary.json").read_text())
        except json.JSONDecodeError:
            summary = None
    return Profile(
        steps=tuple(steps), source=str(folder),
        workers=int(job.workers or len({s.worker for s in steps})),
        servers=int(job.servers or 1), batch_size=job.batch_size,
        link_rate=rate, link_latency=latency,
        server_busy_s=sum(busy.values()) if busy else None,
        model_bytes=job.model_bytes, sync=job.sync, round_trip_s=_round_trip(folder, job),
        summary=summary, device_s_per_sample=_device_time(config.get("device_time")))


def _device_time(text) -> float | None:
    """The run's emulated device time per sample (config.json's text), None when off."""
    from paramserver.emulation.device_time import parse_device_time
    from paramserver.emulation.stragglers import StragglerSpecError
    try:
        return parse_device_time(text if isinstance(text, str) else None).cost_per_sample
    except StragglerSpecError:
        return None


def _round_trip(folder: Path, job: RunJob) -> float | None:
    """The coordinator's round trip of the releases the policy gave at once, as sim.replay
    finds them (the policy re-run over the run's clocks); None when that cannot be done."""
    if not job.sync or not job.batch_size:
        return None
    from paramserver.sim.replay import calibrate, load_run
    try:
        cal = calibrate(load_run(folder))
    except Exception:  # noqa: BLE001  a run the re-run cannot follow: the fit falls back
        return None
    return cal["round_trip_s"] if cal["source"] == "immediate releases" else None


def _derive_compute(steps: list[StepSample]) -> list[StepSample]:
    """Records without compute_s (a user's script through the worker API records waits and
    pushes): a step's compute is the time since the worker's previous record less what the
    record accounts for. A worker's first such record has no previous one and is left out."""
    if all(math.isfinite(s.compute_s) for s in steps):
        return steps
    out, last = [], {}
    for s in sorted(steps, key=lambda s: (s.worker, s.step)):
        prev, last[s.worker] = last.get(s.worker), s.t
        if math.isfinite(s.compute_s):
            out.append(s)
        elif s.t is not None and prev is not None:
            c = s.t - prev - (s.wait_s or 0) - (s.pull_s or 0) - (s.push_s or 0)
            out.append(replace(s, compute_s=max(c, 1e-6)))
    return out


def load_trace_csv(path: Path, *, batch_size: int | None = None,
                   link: str | None = None) -> Profile:
    steps, seen = [], {}
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = {"worker", "compute_s"} - set(reader.fieldnames or ())
            if missing:
                raise ProfileError(f"{path}: the CSV header needs {TRACE_COLUMNS}; missing "
                                   f"{', '.join(sorted(missing))}")
            for row in reader:
                where = f"{path}:{reader.line_num}"
                worker = _num(row.get("worker"), "worker", where)
                if worker is None or worker != int(worker):
                    raise ProfileError(f"{where}: worker must be a rank 0, 1, 2...")
                w = int(worker)
                step = _num(row.get("step"), "step", where)
                nbytes = _num(row.get("bytes"), "bytes", where)
                batch = _num(row.get("batch"), "batch", where) or batch_size or 1
                compute = _num(row.get("compute_s"), "compute_s", where)
                if compute is None:
                    raise ProfileError(f"{where}: compute_s is empty")
                steps.append(StepSample(
                    worker=w, step=int(step) if step is not None else seen.get(w, 0),
                    batch=int(batch), compute_s=compute,
                    pull_s=_num(row.get("pull_s"), "pull_s", where),
                    push_s=_num(row.get("push_s"), "push_s", where),
                    pull_bytes=nbytes, push_bytes=nbytes,
                    wait_s=_num(row.get("wait_s"), "wait_s", where)))
                seen[w] = steps[-1].step + 1
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not steps:
        raise ProfileError(f"{path}: the trace has no rows")
    rate, latency = _worker_link([link]) if link else (None, 0.0)
    return Profile(steps=tuple(steps), source=str(path), workers=len(seen), servers=1,
                   batch_size=batch_size, link_rate=rate, link_latency=latency)


# ---- a short live run ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LiveProfileSpec:
    """A short live run to profile: a built-in model (`train`) or the user's script
    (`command`, through `launch`), at most `seconds` of training."""

    out: Path
    seconds: float = 20.0
    workers: int = 4
    servers: int = 1
    sync: str = "asp"  # arrival mode: no worker waits for another, so each one's pace shows
    model: str = "mlp"
    dataset: str = "digits"
    data_dir: str | None = None  # the MNIST files (--dataset mnist)
    batch_size: int = 32
    straggler: str = "none"
    device_time: str = "off"
    links: tuple[str, ...] = ()
    command: tuple[str, ...] = ()  # the user's worker command: through launch
    timeout: float = 300.0


def profile_live(spec: LiveProfileSpec, quiet: bool = True) -> Profile:
    """Run `spec` to its time limit and load its run folder."""
    if spec.command:
        _launch_script(spec)
    else:
        from paramserver.launch.jobs import run_training
        from paramserver.spec.config import TrainConfig
        cfg = TrainConfig(sync=spec.sync, workers=spec.workers, servers=spec.servers,
                          model=spec.model, dataset=spec.dataset, data_dir=spec.data_dir,
                          batch_size=spec.batch_size,
                          straggler=spec.straggler, device_time=spec.device_time,
                          links=list(spec.links), max_seconds=spec.seconds, epochs=1000.0,
                          eval_interval=0.0)
        run_training(cfg, spec.out, quiet=quiet, timeout=spec.timeout)
    return load_run_folder(spec.out)


def _launch_script(spec: LiveProfileSpec) -> None:
    from paramserver.launch.jobs import script_job
    from paramserver.launch.local import LaunchError, LocalCluster
    from paramserver.spec.config import TrainConfig
    job = script_job(TrainConfig(sync=spec.sync, servers=spec.servers, workers=spec.workers,
                                 batch_size=spec.batch_size, max_seconds=spec.seconds)).to_dict()
    spec.out.mkdir(parents=True, exist_ok=True)
    (spec.out / "config.json").write_text(json.dumps({"config": {}, "job": job}, indent=2))
    try:
        LocalCluster(job, spec.out, job_timeout=spec.timeout,
                     worker_cmd=list(spec.command)).run()
    except LaunchError as exc:
        raise ProfileError(f"the profiling run of {' '.join(spec.command)} failed: "
                           f"{exc}") from None
    except OSError as exc:  # the command itself cannot be started
        raise ProfileError(f"cannot start {' '.join(spec.command)!r}: "
                           f"{exc.strerror or exc}") from None


__all__ = ["ClusterFitError", "LiveProfileSpec", "ProfileError", "load_profile",
           "load_run_folder", "load_trace_csv", "profile_live"]
