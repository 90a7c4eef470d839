"""Replay check: a live comparison's runs fed to the simulator, live vs sim, policy by policy.

Usage: python benchmarks/replay_check.py COMPARE_FOLDER [--out FOLDER] [--ablation] [--json FILE]
       [--tolerance 0.15]

Make the live runs first: `paramserver compare --out COMPARE_FOLDER --quiet` (every policy,
4 workers, emulated device time, worker 1 3x slower). Every run folder under
COMPARE_FOLDER/runs/<scenario>/<policy>/rep-*/ (the single-process reference excepted) is
mirrored by paramserver.sim.replay: its policy, budget, recorded compute/pull/push times and the
coordinator's round trip calibrated on the run; then the simulated run is compared with it:
training time (last step record), samples/s, mean wait fraction, and the policy's decisions.

--ablation also replays without the pieces the mirror adds to the recorded times (the
unrecorded per-step time, the waits before the start barrier, the coordinator round trip) to
show what each is worth. Exit status 1 when a timing error exceeds the tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from paramserver.policies import SYNC_POLICIES
from paramserver.sim.replay import load_run, mirror_config, replan_check, replay, timing
from paramserver.sim.run import simulate

KEYS = ("wall_s", "throughput", "wait_fraction")


def run_folders(root: Path) -> list[Path]:
    order = {name: i for i, name in enumerate(SYNC_POLICIES.names())}
    found = sorted((p.parent for p in root.glob("runs/*/*/rep-*/metrics.jsonl")),
                   key=lambda f: (f.parent.parent.name, order.get(f.parent.name, 99), f.name))
    return [f for f in found if f.parent.name != "single"] or (
        [root] if (root / "metrics.jsonl").exists() else [])


def decisions_text(d: dict) -> str:
    steps = "steps =" if d["steps_live"] == d["steps_sim"] else (
        f"steps {d['steps_live']} vs {d['steps_sim']}")
    parts = [f"{d['headline']} {d['agreement']:.1%}", steps,
             f"held {d['held_live']}/{d['held_sim']}",
             f"triggers {d['trigger_agreement']:.1%}"]
    if "rounds_live" in d:
        parts.append(f"rounds {d['rounds_live']}/{d['rounds_sim']}")
    if "barriers_live" in d:
        parts.append(f"barriers {d['barriers_live']}/{d['barriers_sim']}, plan r "
                     f"{d['plan_steps_live']:.1f}/{d['plan_steps_sim']:.1f}, spread "
                     f"{d['plan_spread_live'] * 1e3:.1f}/{d['plan_spread_sim'] * 1e3:.1f} ms")
    if "delayed_live" in d:
        parts.append(f"gap-held {d['delayed_live']}/{d['delayed_sim']}")
    return ", ".join(parts)


def print_table(results: list[dict], tol: float) -> bool:
    head = (f"{'policy':7s} {'wall live':>9s} {'sim':>7s} {'err':>6s}  {'samples/s':>9s} {'sim':>6s} "
            f"{'err':>6s}  {'wait live':>9s} {'sim':>6s} {'err':>6s}  {'RT ms':>5s}")
    print(head)
    print("-" * len(head))
    ok = True
    for r in results:
        L, S, E = r["live"], r["sim"], r["error"]
        bad = [k for k in KEYS if abs(E[k]) > tol]
        ok &= not bad
        print(f"{r['policy']:7s} {L['wall_s']:9.3f} {S['wall_s']:7.3f} {E['wall_s']:+6.1%}  "
              f"{L['throughput']:9.0f} {S['throughput']:6.0f} {E['throughput']:+6.1%}  "
              f"{L['wait_fraction']:9.3f} {S['wait_fraction']:6.3f} {E['wait_fraction']:+6.1%}  "
              f"{r['calibration']['round_trip_s'] * 1e3:5.2f}" + ("  > tol" if bad else ""))
    print("\ndecisions (live/sim):")
    for r in results:
        print(f"  {r['policy']:6s} {decisions_text(r['decisions'])}")
        problems = r["log_check"]["live"] + r["log_check"]["sim"]
        for p in problems:
            print(f"         note: {p}")
        if r["policy"] == "ebsp":
            c = replan_check(load_run(r["folder"]))
            if "searched_index" in c:
                print(f"         note: searching again from the live records' own times gives "
                      f"plan {c['same_before_first_difference'] + 1} as {c['searched_index']} "
                      f"(spread {c['searched_spread'] * 1e3:.3f} ms), the coordinator made "
                      f"{c['recorded_index']} ({c['recorded_spread'] * 1e3:.3f} ms)")
    return ok


def ablation(folders: list[Path], out: Path) -> list[dict]:
    """Errors without each piece the mirror adds to the recorded compute/pull/push times."""
    variants = [("no unrecorded step time", {"residual": False}, None),
                ("no pre-barrier waits", {"start_waits": False}, None),
                ("no coordinator round trip", {}, 0.0)]
    rows = []
    for folder in folders:
        live = load_run(folder)
        base = timing(live)
        for label, options, rt in variants:
            if rt is None:
                r = replay(folder, out / "ablation" / folder.parent.name, **options)
                err = r["error"]
            else:
                sim_dir = out / "ablation" / folder.parent.name
                simulate(mirror_config(live, rt, **options), sim_dir)
                t = timing(load_run(sim_dir))
                err = {k: (t[k] - base[k]) / base[k] if base[k] else float("nan") for k in KEYS}
            rows.append({"policy": live.job["sync"]["name"], "variant": label, "error": err})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a compare folder (or one run folder)")
    p.add_argument("--out", type=Path, help="simulated runs (default: a temporary folder)")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--ablation", action="store_true")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    folders = run_folders(args.folder)
    if not folders:
        print(f"no run folders under {args.folder}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        results = [replay(f, out / f.parent.parent.name / f.parent.name) for f in folders]
        ok = print_table(results, args.tolerance)
        rows = ablation(folders, out) if args.ablation else []
    if rows:
        print("\nablation (sim error vs live: wall, samples/s, wait fraction):")
        for r in rows:
            e = r["error"]
            print(f"  {r['policy']:6s} {r['variant']:27s} {e['wall_s']:+6.1%} "
                  f"{e['throughput']:+6.1%} {e['wait_fraction']:+6.1%}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "ablation": rows}, indent=2))
    print(f"\n{'all' if ok else 'NOT all'} timing errors within {args.tolerance:.0%}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
