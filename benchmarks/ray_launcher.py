"""Ray launcher against the local launcher: startup time and per-step time, same job, same run.

The job: `train` task, digits MLP, BSP, 2 workers, 1 shard, batch 32, no evaluator, ROUNDS
rounds. Each repeat runs it once under LocalCluster and once under RayCluster (local Ray
instance, `ray.init(num_cpus=2)` once, its time reported apart), interleaved; medians.

  startup    launcher call -> the first step record in the coordinator's metrics (polled by
             the launcher's on_tick, every 0.05 s local / 0.2 s Ray)
  whole run  the launcher's run() (start, training, teardown)
  per round  training wall time the coordinator measured / rounds (ZeroMQ in both)

Usage: python benchmarks/ray_launcher.py [--rounds 200] [--repeats 3]   (needs paramserver[ray])
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from paramserver.launch.jobs import prepare_job
from paramserver.spec.config import TrainConfig
from paramserver.runlog.metrics import read_records, summarize
from paramserver.launch.local import LocalCluster
from paramserver.launch.ray_launcher import RayCluster, Resources


def _metrics_now(cluster, run_dir: Path) -> bytes:
    if isinstance(cluster, LocalCluster):
        path = run_dir / "metrics.jsonl"
        return path.read_bytes() if path.exists() else b""
    import ray
    coordinator = next(a for name, _, a in cluster.actors if name == "coordinator")
    return ray.get(coordinator.read.remote("metrics.jsonl"))


def one_run(kind: str, job: dict) -> tuple[float, float, float]:
    """(s to the first step, s of the whole run, training s per round)."""
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d)
        cluster = (LocalCluster(job, run_dir, job_timeout=600) if kind == "local" else
                   RayCluster(job, run_dir, resources=Resources(0.5, 0.0, 0.5), job_timeout=600))
        first = []
        t = time.perf_counter()

        def tick():  # polled by the launcher: when does the first step show in the metrics?
            if not first and b'"step"' in _metrics_now(cluster, run_dir):
                first.append(time.perf_counter() - t)
        cluster.run(on_tick=tick)
        total = time.perf_counter() - t
        s = summarize(read_records(run_dir / "metrics.jsonl"), {**job, "apply_mode": "round"})
    return (first[0] if first else float("nan"), total,
            s["wall_time_s"] / max(s["updates_applied"], 1))


def main() -> int:
    import ray
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cfg = TrainConfig(sync="bsp", workers=2, servers=1, batch_size=32, lr=0.1,
                      steps=args.rounds, threads=1, seed=0, eval_interval=0)
    job = prepare_job(cfg)
    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray_init = time.perf_counter() - t
    out = {"local": [], "ray": []}
    try:
        for _ in range(args.repeats):
            for kind in out:
                out[kind].append(one_run(kind, job))
    finally:
        ray.shutdown()
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in out.items()}
    print(f"BSP, 2 workers, 1 server, {args.rounds} rounds, median of {args.repeats}; "
          f"ray.init (once): {ray_init:.1f} s")
    for kind, (startup, total, step) in med.items():
        print(f"  {kind:5s}  to first step {startup:6.2f} s   whole run {total:6.2f} s   "
              f"per round {step * 1e3:6.2f} ms")
    (ls, lt, lp), (rs, rt, rp) = med["local"], med["ray"]
    print(f"  ray/local: to first step {rs / ls:.2f}x, whole run {rt / lt:.2f}x, "
          f"per round {rp / lp:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
