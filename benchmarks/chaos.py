"""Chaos runs: real training jobs with random SIGKILLs of workers, a server and the coordinator.

Each run trains the digits MLP with 4 workers and 2 shard servers under one sync policy; at
random moments (fractions of the sample budget, so in a random order) it SIGKILLs workers (the
launcher replaces them, --restart-workers), one server (restarted from the latest checkpoint,
--restart-servers) and the coordinator (restarted at its address, --restart-coordinator: it
takes back the live servers and workers). It reports whether the job finished, its accuracy,
how long the take-back took, and the updates the restarted shard lost next to what the
checkpoint interval predicts: the progress at the kill (rounds applied, or worker steps under
arrival-mode policies) minus the checkpoint restored. The coordinator's death loses nothing:
its part is re-derived from the live members, so it adds nothing to the prediction.

The server's and the coordinator's deaths are kept at least `VITAL_GAP` of the budget apart:
each one's recovery is measured on its own (a server restarted during a take-back is handled,
but its lost updates are then not predicted from the progress at its kill).

Usage:
  python benchmarks/chaos.py --policies bsp,asp,ssp,ebsp,r2sp,lbbsp,dssp [--seeds 0]
  python benchmarks/chaos.py --no-coordinator ...   # workers and a server only, as before
  python benchmarks/chaos.py --intervals 5,10,20,40 --policies bsp,asp --seeds 0,1,2
  python benchmarks/chaos.py --replicas 2 --policies bsp,asp   # replicated shards: the killed
      server's backup takes over (or, a backup killed, is rebuilt); lost updates must be 0.
      The coordinator is killed too unless --no-coordinator: its successor takes the backups
      back with the primaries.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from paramserver.launch.jobs import prepare_job
from paramserver.spec.config import TrainConfig
from paramserver.runlog.metrics import read_records, summarize
from paramserver.policies import SYNC_POLICIES
from paramserver.runlog.checkpoint import latest
from paramserver.launch.local import LocalCluster


VITAL_GAP = 0.15  # of the budget, between the server's and the coordinator's deaths


class Watch:
    """Follows a run's metrics and events files: steps and rounds so far, new lines only."""

    def __init__(self, run_dir: Path):
        self.files = {"metrics": run_dir / "metrics.jsonl", "events": run_dir / "events.jsonl"}
        self.offsets = {k: 0 for k in self.files}
        self.steps = self.rounds = 0
        self.summed = 0  # steps in the rounds applied
        self.taken_back = 0  # restarted coordinators that took the job back

    def update(self) -> None:
        for name, path in self.files.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[name])
                    data = f.read()
            except FileNotFoundError:
                continue
            complete = data[:data.rfind(b"\n") + 1]  # a torn last line waits for its end
            self.offsets[name] += len(complete)
            for line in complete.decode().splitlines():
                if name == "metrics" and '"kind": "step"' in line:
                    self.steps += 1
                elif name == "events" and '"event": "apply_round"' in line:
                    self.rounds += 1
                    self.summed += len(json.loads(line).get("contributors", ()))
                elif name == "events" and '"event": "taken_back"' in line:
                    self.taken_back += 1


class Chaos:
    """The kill plan of one run, carried out from the launcher's supervision tick."""

    def __init__(self, cluster: LocalCluster, rng: random.Random, worker_kills: int,
                 kill_server: bool, round_mode: bool, budget_steps: int,
                 kill_coordinator: bool = False):
        self.cluster, self.rng, self.round_mode = cluster, rng, round_mode
        self.watch = Watch(cluster.run_dir)
        self.worker_at = sorted(rng.uniform(0.15, 0.6) * budget_steps for _ in range(worker_kills))
        self.server_at = rng.uniform(0.25, 0.7) * budget_steps if kill_server else None
        self.coordinator_at = None
        if kill_coordinator:
            at = rng.uniform(0.2, 0.75)
            while self.server_at is not None and abs(
                    at * budget_steps - self.server_at) < VITAL_GAP * budget_steps:
                at = rng.uniform(0.2, 0.75)
            self.coordinator_at = at * budget_steps
        self.coordinator_kill: dict | None = None
        self.order: list[str] = []  # what was killed, in order
        self.killed_pids: set[int] = set()
        self.ckpt = Path(cluster.job["checkpoint"]["dir"]) if cluster.job.get("checkpoint") \
            else None
        self.workers_killed: list[int] = []
        self.server_kill: dict | None = None

    def tick(self) -> None:
        self.watch.update()
        steps = self.watch.steps
        if self.worker_at and steps >= self.worker_at[0]:
            self.worker_at.pop(0)
            self._kill_worker()
        if self.server_at is not None and steps >= self.server_at and self.server_kill is None:
            self._kill_server()
        if (self.coordinator_at is not None and steps >= self.coordinator_at
                and self.coordinator_kill is None):
            self._kill_coordinator()
        kill = self.coordinator_kill
        if kill is not None and "take_back_s" not in kill and self.watch.taken_back:
            kill["take_back_s"] = round(time.monotonic() - kill["t"], 2)

    def _kill_coordinator(self) -> None:
        coord = self.cluster.coordinator
        if coord.proc.poll() is not None:
            return
        os.kill(coord.proc.pid, signal.SIGKILL)
        self.order.append("coordinator")
        self.coordinator_kill = {"t": time.monotonic(), "steps_at_kill": self.watch.steps,
                                 "pids": self._pids()}

    def _pids(self) -> dict:
        return {f"{c.role} {c.index}": c.proc.pid for c in self.cluster.children
                if c.role in ("server", "worker") and c.proc.poll() is None}

    def _live(self, role: str) -> list:
        return [c for c in self.cluster.children
                if c.role == role and not c.replaced and c.proc.poll() is None]

    def _kill_worker(self) -> None:
        live = self._live("worker")
        if live:
            victim = self.rng.choice(live)
            os.kill(victim.proc.pid, signal.SIGKILL)
            self.workers_killed.append(victim.index)
            self.order.append("worker")
            self.killed_pids.add(victim.proc.pid)

    def _primary(self, live: list):
        """With replicas: the process serving a random shard as its primary now (the address
        of its last promotion, else the one it joined with), so that a backup takes over."""
        import psutil
        addrs: dict[int, str] = {}
        for e in _events(self.cluster.run_dir):
            if e["event"] in ("server_joined", "replica_promoted"):
                addrs[e["rank"]] = e["addr"]
        if not addrs:
            return None
        port = int(addrs[self.rng.choice(sorted(addrs))].rsplit(":", 1)[1])
        for c in live:
            try:
                conns = psutil.Process(c.proc.pid).net_connections("tcp")
            except psutil.Error:
                continue
            if any(x.laddr.port == port and x.status == psutil.CONN_LISTEN for x in conns):
                return c
        return None

    def _kill_server(self) -> None:
        live = self._live("server")
        if not live:
            return
        if self.cluster.spec.replicas > 1:
            victim = self._primary(live)
            if victim is None:
                return  # (tried again at the next tick)
            live = [victim]
        tag = latest(self.ckpt)  # read before the kill: a later commit is seen as such
        w = self.watch  # what the shards' versions count (auto: a lockstep round once)
        progress = w.rounds if self.round_mode else w.steps - w.summed + w.rounds
        victim = self.rng.choice(live)
        os.kill(victim.proc.pid, signal.SIGKILL)
        self.order.append("server")
        self.killed_pids.add(victim.proc.pid)
        self.server_kill = {"index": victim.index, "latest_at_kill": tag,
                            "progress_at_kill": progress, "t": time.monotonic()}


def expected_lost(kill: dict, restored_tag: str, round_mode: bool, workers: int):
    """(low, high): the updates the restore can have discarded, from the progress at the kill.

    Round mode: the shard saved at round `tag` exactly; at most one apply_round was in flight
    when the events were read, and at most one more round can complete while it is down (all
    of its pushes acknowledged before the kill). Arrival mode: each worker may have had one
    push applied but not yet clocked, at the save and at the kill.
    """
    base = kill["progress_at_kill"] - int(restored_tag)
    return (base - 1, base + 2) if round_mode else (base - workers, base + workers)


def chaos_run(sync: str, out: Path, seed: int = 0, worker_kills: int = 1,
              kill_server: bool = True, checkpoint_every: int = 10, epochs: float = 6.0,
              workers: int = 4, servers: int = 2, timeout: float = 400.0,
              kill_coordinator: bool = False, replicas: int = 1) -> dict:
    """One chaos run; returns what happened and what was predicted. With `replicas` 2 a
    killed server's backup takes over (no restart from a checkpoint)."""
    cfg = TrainConfig(sync=sync, workers=workers, servers=servers, epochs=epochs, seed=seed,
                      heartbeat_timeout=4.0, eval_interval=1.0,
                      restart_workers=worker_kills + 2,  # slack for a worker starved at startup
                      restart_servers=1 if kill_server and replicas == 1 else 0,
                      replicas=replicas,
                      restart_coordinator=1 if kill_coordinator else 0,
                      checkpoint_dir=str(out / "checkpoints"), checkpoint_every=checkpoint_every)
    job = prepare_job(cfg)
    round_mode = SYNC_POLICIES.get(sync).apply_mode == "round"
    cluster = LocalCluster(job, out, job_timeout=timeout, restart_workers=cfg.restart_workers,
                           restart_servers=cfg.restart_servers,
                           restart_coordinator=cfg.restart_coordinator)
    budget_steps = job["max_samples"] // cfg.batch_size
    # Seeded by policy too: each policy's run gets its own kill order.
    chaos = Chaos(cluster, random.Random(f"{sync}:{seed}"), worker_kills, kill_server, round_mode,
                  budget_steps, kill_coordinator)
    t0 = time.monotonic()
    cluster.run(on_tick=chaos.tick)
    wall = time.monotonic() - t0
    records = read_records(out / "metrics.jsonl")
    summary = summarize(records, {**job, "apply_mode": SYNC_POLICIES.get(sync).apply_mode})
    restarts = [r for r in records if r["kind"] == "restart"]
    since = restarts[0]["t"] if restarts else 0.0
    after = [r["accuracy"] for r in records if r["kind"] == "eval" and r["t"] >= since]
    result = {"sync": sync, "seed": seed, "checkpoint_every": checkpoint_every,
              "round_mode": round_mode, "wall_s": round(wall, 1), "steps": summary["steps"],
              "final_accuracy": summary["final_test_accuracy"],
              # the best evaluation from the server's restart on (from the start without one)
              "best_accuracy_after_restart": max(after, default=None),
              "workers_killed": len(chaos.workers_killed), "worker_restarts": cluster.restarts,
              "server_restarts": summary["server_restarts"],
              "lost_updates": summary["lost_updates"], "server_kill": chaos.server_kill,
              "replicas": replicas, "promotions": summary["replica_promotions"],
              "membership": [e["event"] for e in _events(out) if e["event"] in (
                  "replica_promoted", "backup_lost", "backup_rebuilt", "backup_taken_back")],
              "restored": [r["checkpoint"] for r in restarts],
              "order": chaos.order, "coordinator_restarts": cluster.coordinator_restarts}
    kill = chaos.coordinator_kill
    if kill is not None:
        # Taken back, not restarted: every server and worker alive at the kill ended on its
        # own (exit 0), unless the plan killed it later.
        at_kill = set(kill["pids"].values())
        result["take_back_s"] = kill.get("take_back_s")
        result["members_kept"] = sum(
            1 for c in cluster.children if c.proc.pid in at_kill and (
                c.proc.pid in chaos.killed_pids or c.proc.returncode == 0))
        result["members_at_kill"] = len(kill["pids"])
    if chaos.server_kill and restarts:
        result["expected_lost"] = expected_lost(chaos.server_kill, restarts[0]["checkpoint"],
                                                round_mode, workers)
    return result


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _sweep(args) -> list[dict]:
    results = []
    intervals = [int(x) for x in args.intervals.split(",")] if args.intervals else [args.every]
    for sync in args.policies.split(","):
        for every in intervals:
            for seed in (int(s) for s in args.seeds.split(",")):
                with tempfile.TemporaryDirectory() as tmp:
                    r = chaos_run(sync, Path(tmp), seed=seed, checkpoint_every=every,
                                  worker_kills=0 if args.intervals else args.worker_kills,
                                  epochs=args.epochs, replicas=args.replicas,
                                  kill_coordinator=not (args.intervals or args.no_coordinator))
                print(json.dumps(r), file=sys.stderr, flush=True)
                results.append(r)
    return results


def _print_runs(results: list[dict]) -> None:
    print("| policy | seed | kill order | wall s | steps | final acc | best acc after restart "
          "| workers killed/restarted | server restarts | coordinator restarts | take-back s "
          "| members kept | lost updates | predicted | replicas | promotions | membership |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        acc, best = ("-" if a is None else f"{a:.3f}"
                     for a in (r["final_accuracy"], r["best_accuracy_after_restart"]))
        kept = (f"{r['members_kept']}/{r['members_at_kill']}" if "members_kept" in r else "-")
        order = ", ".join(r["order"])
        print(f"| {r['sync']} | {r['seed']} | {order} | {r['wall_s']} | "
              f"{r['steps']} | {acc} | {best} | {r['workers_killed']}/{r['worker_restarts']} | "
              f"{r['server_restarts']} | {r['coordinator_restarts']} | "
              f"{r.get('take_back_s', '-')} | {kept} | {r['lost_updates']} | "
              f"{r.get('expected_lost')} | {r['replicas']} | {r['promotions']} | "
              f"{', '.join(r['membership']) or '-'} |")


def _print_intervals(results: list[dict]) -> None:
    print("\n| policy | every | runs | median lost | mean lost | max lost |")
    print("|---|---|---|---|---|---|")
    keys = sorted({(r["sync"], r["checkpoint_every"]) for r in results})
    for sync, every in keys:
        lost = [r["lost_updates"] for r in results
                if r["sync"] == sync and r["checkpoint_every"] == every]
        print(f"| {sync} | {every} | {len(lost)} | {statistics.median(lost)} | "
              f"{statistics.mean(lost):.1f} | {max(lost)} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", default="bsp,asp,ssp,ebsp,r2sp,lbbsp,dssp")
    p.add_argument("--seeds", default="0")
    p.add_argument("--every", type=int, default=10, help="checkpoint interval (default 10)")
    p.add_argument("--intervals", help="comma-separated checkpoint intervals: lost-update "
                                       "measurement (server kill only)")
    p.add_argument("--worker-kills", type=int, default=2)
    p.add_argument("--no-coordinator", action="store_true",
                   help="do not kill the coordinator (workers and a server only)")
    p.add_argument("--epochs", type=float, default=6.0)
    p.add_argument("--replicas", type=int, choices=(1, 2), default=1,
                   help="2: replicated shards; the server killed is taken over by its backup")
    args = p.parse_args()
    results = _sweep(args)
    _print_runs(results)
    if args.intervals:
        _print_intervals(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
