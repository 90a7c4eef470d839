"""Replay a live run in the simulator and compare the two: decisions, wall time, throughput, waits.

The mirror (`mirror_config`): the run's policy and options, workers, batch size and sample
budget (stop semantics of the coordinator); each worker's recorded compute_s (`trace:`), pull_s
and push_s, step by step, plus the per-step time no field records and the wait before the start
barrier (sim.trace.CommReplay); the coordinator's message latency calibrated on the run itself
(`calibrate`): the mean wait_s of the steps whose release the policy gave at the worker's own
clock, split evenly between the clock and the release. Only the waits the policy imposes are
left to the simulation; the straggler factor is already inside the recorded compute_s.

Decisions are compared through `decision_log`: the policy re-run over a run's clocks, in the
order the coordinator (or the engine) handled them, names for every release the event that
triggered it: the worker's own push (released at once), another worker's push (it was held:
a BSP round's last push, SSP's slowest worker, an ElasticBSP barrier), a join or a departure.
The same object makes the same decisions from the same events, so the log is the run's own
(checked against events.jsonl: rounds applied, ElasticBSP plans and barriers). The one input
the records do not keep exactly is the time the policy saw (metrics `t` is stamped a few
microseconds before the policy runs, and rounded to 1 us): ElasticBSP's ZipLine search can
flip between near-equal spreads on that, so the re-run takes each plan from events.jsonl, where
the coordinator (or the engine) wrote the plan it made. Two runs agree when each release has the
same trigger, batch size and scale, and the same notes (plans) come out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from paramserver.runlog.metrics import read_records, summarize
from paramserver.policies import (
    ApplyRound, Note, PolicyError, PolicyHost, Pushed, Release, make_policy,
)
from paramserver.sim.run import SimConfig, simulate
from paramserver.zipline.plan import SyncPlan
from paramserver.core.bounded import json_value
from paramserver.spec.run_job import RunJob


@dataclass
class RunFolder:
    """A run's configuration, metrics records (file order) and coordinator events."""

    folder: Path
    job: dict
    config: dict
    records: list[dict]
    events: list[dict]

    @property
    def steps(self) -> list[dict]:
        return [r for r in self.records if r.get("kind") == "step"]

    def event_list(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]


def load_run(folder: str | Path) -> RunFolder:
    folder = Path(folder)
    cfg = json_value((folder / "config.json").read_text())
    job = cfg.get("job") or json_value((folder / "job.json").read_text())
    events = read_records(folder / "events.jsonl") if (folder / "events.jsonl").exists() else []
    return RunFolder(folder, job, cfg.get("config", {}), read_records(folder / "metrics.jsonl"),
                     events)


# ---- decisions ----------------------------------------------------------------------------------
@dataclass
class DecisionLog:
    """What the policy decided over a run: per release (worker, step) its trigger and terms."""

    releases: dict[tuple[int, int], dict] = field(default_factory=dict)
    rounds: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    notes: list[tuple[str, dict]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # where the re-run left the records
    marks: dict[str, int] = field(default_factory=dict)  # note kind -> releases before its first

    def immediate(self) -> set[tuple[int, int]]:
        """Releases given at the worker's own clock, not held for a later time."""
        return {k for k, r in self.releases.items()
                if r["trigger"] == ("push", k[0], k[1] - 1) and not r["delayed"]}


def decision_log(run: RunFolder, workers: int | None = None,
                 recorded_plans: bool = True) -> DecisionLog:
    """Re-run the run's policy, hosted as the coordinator hosts it, over the run's joins,
    clocks and departures (coordinator order); time goes by as the records say.

    recorded_plans=False lets ElasticBSP search its plans again from the records' times.
    """
    job = RunJob.of(run.job)
    policy = make_policy(job.sync, job.batch_size, **job.sync_options)
    log = DecisionLog()
    if recorded_plans:
        _follow_recorded_plans(policy, run, log)
    trigger: tuple = ()  # the event the policy is deciding on

    def watch(d, now: float) -> None:
        # Each decision as it is made: a held release belongs to the event that decided it.
        if isinstance(d, Release):
            log.releases[(d.worker, d.step)] = {
                "trigger": trigger, "batch": d.batch_size, "scale": round(d.scale, 9),
                "delayed": d.not_before is not None and d.not_before > now,
                "stop": host.stopping}
        elif isinstance(d, ApplyRound):
            log.rounds.append((d.step, tuple(d.contributors)))
        elif isinstance(d, Note):
            log.notes.append((d.kind, d.data))
            log.marks.setdefault(d.kind, len(log.releases))

    host = PolicyHost(policy, job.max_samples or None, on_decision=watch)
    # As the coordinator opens its start barrier: every worker joins before any release goes
    # out (auto's lockstep candidates count a worker that joins after a release as a late
    # joiner, who waits for the next round).
    trigger = ("join",)
    host.joined_all(range(workers or job.workers), 0.0)
    for i, r in enumerate(run.records):
        kind = r.get("kind")
        if kind not in ("step", "left"):
            continue
        try:
            trigger = ("tick", r["t"])
            host.advance(r["t"])  # held releases due by now go out, timers fire
            if kind == "step":
                trigger = ("push", r["worker"], r["step"])
                host.pushed(Pushed(r["worker"], r["step"], r["t"], r["batch"], r["compute_s"]))
            else:
                trigger = ("left", r["worker"])
                host.left(r["worker"], r["t"], r.get("reason", "done"))
        except PolicyError as exc:
            log.problems.append(f"re-run left the records at line {i + 1}: {exc}")
            break
    return log


def _follow_recorded_plans(policy, run: RunFolder, log: DecisionLog) -> None:
    """ElasticBSP: take each barrier plan from events.jsonl instead of searching again."""
    recorded = iter(run.event_list("ebsp_plan"))
    search = getattr(policy, "_search", None)
    if search is None or not run.event_list("ebsp_plan"):
        return

    def replayed(histories, offsets):
        plan = next(recorded, None)
        if plan is None or len(plan["sync_index"]) != len(histories):
            log.problems.append("more plans than recorded: searched again")
            return search(histories, offsets)
        return SyncPlan(plan["spread"], plan["barrier"], plan["low"], tuple(plan["sync_index"]))
    policy._search = replayed


def _plan(data: dict) -> tuple:
    return tuple(data["workers"]), data.get("waiting"), tuple(data["sync_step"])


def check_log(run: RunFolder, log: DecisionLog) -> list[str]:
    """Where the re-run disagrees with what the coordinator recorded (empty: it is the run's)."""
    problems = list(log.problems)
    rounds = run.event_list("apply_round")
    if len(rounds) != len(log.rounds) or any(
            e["step"] != s or tuple(e["contributors"]) != c for e, (s, c) in zip(rounds, log.rounds)):
        problems.append(f"rounds: recorded {len(rounds)}, re-run {len(log.rounds)}")
    keys = {"ebsp_plan": _plan, "ebsp_barrier": lambda d: d["workers"],
            "r2sp_rotation": lambda d: d["first"],
            "lbbsp_batches": lambda d: (d["round"], d["workers"], d["batch"])}
    for kind, key in keys.items():
        recorded = run.event_list(kind)
        rerun = [d for k, d in log.notes if k == kind]
        if len(recorded) != len(rerun) or any(key(a) != key(b) for a, b in zip(recorded, rerun)):
            problems.append(f"{kind}: recorded {len(recorded)}, re-run {len(rerun)}")
    return problems


def _steps_per_worker(run: RunFolder) -> list[int]:
    out: dict[int, int] = {}
    for r in run.steps:
        out[r["worker"]] = out.get(r["worker"], 0) + 1
    return [out.get(w, 0) for w in range(max(out, default=-1) + 1)]


def _share(hits: int, total: int) -> float:
    return hits / total if total else 1.0


def compare_decisions(live: DecisionLog, sim: DecisionLog, live_run: RunFolder,
                      sim_run: RunFolder) -> dict:
    """Agreement of two decision logs, with what matters for each kind of policy.

    Always: steps per worker, releases held (not given at the worker's own clock), and per
    release (worker, step) in both logs (`compared`: their share of all releases) the share
    with the same trigger and terms, and with the same held/immediate status. `headline` names the measure that carries the policy's
    decisions: round composition and batch sizes (BSP, LB-BSP), who unblocked whom (ASP, SSP,
    DSSP), the rotation's order (R2SP), the barriers (ElasticBSP).
    """
    name = RunJob.of(live_run.job).sync
    common = live.releases.keys() & sim.releases.keys()
    n = max(len(live.releases), len(sim.releases))
    li, si = live.immediate(), sim.immediate()
    steps_live, steps_sim = _steps_per_worker(live_run), _steps_per_worker(sim_run)
    out = {"steps_live": steps_live, "steps_sim": steps_sim,
           "steps_max_diff": max((abs(a - b) for a, b in zip(steps_live, steps_sim)), default=0)
           if len(steps_live) == len(steps_sim) else None,
           "releases_live": len(live.releases), "releases_sim": len(sim.releases),
           "held_live": len(live.releases) - len(li), "held_sim": len(sim.releases) - len(si),
           "compared": _share(len(common), n),
           "trigger_agreement": _share(sum(live.releases[k] == sim.releases[k] for k in common),
                                       len(common)),
           "held_agreement": _share(sum((k in li) == (k in si) for k in common), len(common))}
    headline = ("who released whom", out["trigger_agreement"])
    if live.rounds or sim.rounds:
        same = sum(a == b for a, b in zip(live.rounds, sim.rounds))
        out.update(rounds_live=len(live.rounds), rounds_sim=len(sim.rounds), rounds_same=same)
        headline = ("rounds identical", _share(same, max(len(live.rounds), len(sim.rounds))))
    batches = {(r["worker"], r["step"]): r["batch"] for r in live_run.steps}
    sim_batches = {(r["worker"], r["step"]): r["batch"] for r in sim_run.steps}
    if len(set(batches.values()) | set(sim_batches.values())) > 1:
        keys = batches.keys() & sim_batches.keys()
        out["batch_agreement"] = _share(sum(batches[k] == sim_batches[k] for k in keys),
                                        max(len(batches), len(sim_batches)))
        headline = ("rounds and batches identical", min(headline[1], out["batch_agreement"]))
    if name == "ebsp":
        for tag, log in (("live", live), ("sim", sim)):
            plans = [d for k, d in log.notes if k == "ebsp_plan"]
            out[f"barriers_{tag}"] = sum(k == "ebsp_barrier" for k, _ in log.notes)
            out[f"plan_steps_{tag}"] = (sum(sum(p["sync_index"]) / len(p["sync_index"])
                                            for p in plans) / len(plans)) if plans else 0.0
            out[f"plan_spread_{tag}"] = (sum(p["spread"] for p in plans) / len(plans)
                                         if plans else 0.0)
        a, b = out["barriers_live"], out["barriers_sim"]
        headline = ("barriers (count)", 1 - abs(a - b) / max(a, b, 1))
    if name == "r2sp":
        for tag, log in (("live", live), ("sim", sim)):
            rot = [d for k, d in log.notes if k == "r2sp_rotation"]
            out[f"rotation_first_{tag}"] = rot[0]["first"] if rot else None
            out[f"delayed_{tag}"] = sum(r["delayed"] for r in log.releases.values())
        # After the warm-up the permissions go round the ids in order: compare that sequence.
        order = [[w for w, _ in list(log.releases)[log.marks.get("r2sp_rotation", 0):]]
                 for log in (live, sim)]
        m = min(len(order[0]), len(order[1]))
        out["grant_order_agreement"] = _share(sum(order[0][i] == order[1][i] for i in range(m)),
                                              max(len(order[0]), len(order[1])))
        headline = ("grant order (worker ids)", out["grant_order_agreement"])
    out["headline"], out["agreement"] = headline
    return out


def replan_check(run: RunFolder) -> dict:
    """ElasticBSP: do the records' own times give the recorded plans when searched again?"""
    log = decision_log(run, recorded_plans=False)
    searched = [d for k, d in log.notes if k == "ebsp_plan"]
    recorded = run.event_list("ebsp_plan")
    same = 0
    for a, b in zip(searched, recorded):
        if _plan(a) != _plan(b):
            break
        same += 1
    out = {"recorded": len(recorded), "same_before_first_difference": same}
    if same < min(len(searched), len(recorded)):
        a, b = searched[same], recorded[same]
        out.update(searched_index=a["sync_index"], searched_spread=a["spread"],
                   recorded_index=b["sync_index"], recorded_spread=b["spread"])
    return out


# ---- timing -------------------------------------------------------------------------------------
def timing(run: RunFolder) -> dict:
    """Training time (the last step record's t), samples/s and the mean wait fraction."""
    steps = run.steps
    s = summarize(steps, run.job)
    wall = max((r["t"] for r in steps), default=0.0)
    samples = sum(r["batch"] for r in steps)
    return {"wall_s": wall, "samples": samples, "steps": len(steps),
            "throughput": samples / wall if wall else 0.0,
            "wait_fraction": s["mean_wait_fraction"]}


def calibrate(run: RunFolder, log: DecisionLog | None = None) -> dict:
    """The coordinator's round trip: mean wait_s of the steps released at their own clock."""
    log = log or decision_log(run)
    immediate = log.immediate()
    waits = [r["wait_s"] for r in run.steps if r["step"] > 0
             and (r["worker"], r["step"]) in immediate]
    source = "immediate releases"
    if not waits:  # no step was released at once: the quickest fifth of all waits
        waits = sorted(r["wait_s"] for r in run.steps if r["step"] > 0)
        waits = waits[:max(1, len(waits) // 5)]
        source = "quickest fifth of the waits"
    rt = sum(waits) / len(waits) if waits else 0.0
    return {"round_trip_s": rt, "samples": len(waits), "source": source}


# ---- the replay ---------------------------------------------------------------------------------
def mirror_config(run: RunFolder, round_trip: float, **comm_options) -> SimConfig:
    """The SimConfig that mirrors a live run, with its recorded times."""
    job = RunJob.of(run.job)
    budget = job.max_samples or sum(r["batch"] for r in run.steps)
    return SimConfig(
        sync=job.sync, sync_options=dict(job.sync_options),
        workers=job.workers, steps=None, max_samples=budget, batch_size=job.batch_size,
        compute=f"trace:{run.folder}", straggler="none", comm=f"trace:{run.folder}",
        comm_options=comm_options, latency=f"{round_trip / 2 * 1e6:.3f}us",
        servers=job.servers or 1, model=job.task.model or "mlp",
        dataset=job.task.dataset or "digits", param_bytes=str(job.model_bytes),
        dtype=job.dtype, seed=job.task.seed)


def _errors(live: dict, sim: dict) -> dict:
    return {k: (sim[k] - live[k]) / live[k] if live[k] else math.nan
            for k in ("wall_s", "throughput", "wait_fraction")}


def replay(folder: str | Path, out: str | Path, **comm_options) -> dict:
    """Simulate the mirror of the live run in `folder` into `out`; live vs sim, side by side."""
    live = load_run(folder)
    live_log = decision_log(live)
    cal = calibrate(live, live_log)
    cfg = mirror_config(live, cal["round_trip_s"], **comm_options)
    simulate(cfg, out)
    sim = load_run(out)
    sim_log = decision_log(sim)
    t_live, t_sim = timing(live), timing(sim)
    return {"policy": cfg.sync, "folder": str(folder), "sim_folder": str(out),
            "calibration": cal, "live": t_live, "sim": t_sim, "error": _errors(t_live, t_sim),
            "decisions": compare_decisions(live_log, sim_log, live, sim),
            "log_check": {"live": check_log(live, live_log), "sim": check_log(sim, sim_log)}}
