"""Held-out check of `paramserver advise`: its predicted time to target for each candidate
against live `paramserver compare` runs of the same situation.

    paramserver advise --live ... --out A          # the prediction, from a short profile
    paramserver compare --sync ... --repeats 2 --out C   # the same cluster, live
    python benchmarks/advise_heldout.py A/advise.json C [--scenario NAME]

Prints per policy the predicted band, the live repeats and their median, the ratio of the
two and whether it is within 15%; then the pick against the live-fastest median, and the
share of predictions within 15%. A candidate with options (ssp(staleness=3)) is matched to
the live runs of its policy when compare ran it with those options (its defaults); a
candidate that compare did not run is listed as such.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

WITHIN = 0.15


def live_times(folder: Path, scenario: str | None) -> dict[str, list[float | None]]:
    """Per policy its repeats' times to target (None: not reached), from results.csv."""
    out: dict[str, list[float | None]] = {}
    with open(folder / "results.csv", newline="") as f:
        for row in csv.DictReader(f):
            if scenario and row["scenario"] != scenario:
                continue
            t = row["time_to_target_s"]
            out.setdefault(row["policy"], []).append(
                float(t) if t and row["reached"] == "1" else None)
    return out


def default_label(policy: str) -> str:
    """The advise label of a policy run at its defaults (ssp and dssp: their staleness)."""
    from paramserver.policies import SYNC_POLICIES
    cls = SYNC_POLICIES.get(policy)
    defaults = getattr(cls, "Options", None)
    if defaults is not None and hasattr(defaults(), "staleness") and any(
            dict(o).get("staleness") is not None for o in cls.advise_options):
        return f"{policy}(staleness={defaults().staleness})"
    return policy


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("advice", type=Path, help="advise.json")
    ap.add_argument("compare", type=Path, help="the compare run's folder (results.csv)")
    ap.add_argument("--scenario", help="the scenario of the compare run to read (default all)")
    args = ap.parse_args(argv)
    rec = json.loads(args.advice.read_text())["recommendation"]
    live = live_times(args.compare, args.scenario)
    medians = {p: statistics.median(t for t in ts if t is not None)
               for p, ts in live.items() if all(t is not None for t in ts)}
    never_live = {p for p, ts in live.items() if all(t is None for t in ts)}
    predicted = {r["label"]: r for r in rec["ranked"]}
    print(f"{'policy':<20} {'predicted s (band)':>24} {'live s (repeats)':>24} "
          f"{'live median':>11} {'pred/live':>9}  within {WITHIN:.0%}")
    within = checked = 0
    for policy in sorted(live, key=lambda p: medians.get(p, float("inf"))):
        label = default_label(policy)
        r = predicted.get(label)
        ts = ", ".join("never" if t is None else f"{t:.1f}" for t in live[policy])
        if r is None:
            print(f"{policy:<20} {'not among the candidates':>24} {ts:>24}")
            continue
        band = r["time_to_target_s"]
        shown = "never" if band is None else f"{band['mid']:.3g} ({band['lo']:.3g}-{band['hi']:.3g})"
        med = medians.get(policy)
        if band is None or med is None:
            ok = (band is None) == (policy in never_live) and (band is None or med is not None)
            ratio = "-"
        else:
            ok = abs(band["mid"] / med - 1) <= WITHIN
            ratio = f"{band['mid'] / med:.2f}"
        checked += 1
        within += ok
        print(f"{label:<20} {shown:>24} {ts:>24} "
              f"{'-' if med is None else f'{med:.1f}':>11} {ratio:>9}  {'yes' if ok else 'no'}")
    if medians:
        fastest = min(medians, key=medians.get)
        pick = rec["pick"]
        pick_policy = pick.split("(")[0] if pick else None
        if pick and pick_policy in medians and pick != default_label(pick_policy):
            print(f"\npick {pick} ({rec['confidence']}): not run live with those options; "
                  f"{default_label(pick_policy)} took {medians[pick_policy]:.1f} s, "
                  f"{medians[pick_policy] / medians[fastest]:.2f}x the live-fastest "
                  f"{fastest} ({medians[fastest]:.1f} s)")
        elif pick_policy in medians:
            print(f"\npick {pick} ({rec['confidence']}): live median {medians[pick_policy]:.1f} s, "
                  f"{medians[pick_policy] / medians[fastest]:.2f}x the live-fastest "
                  f"{fastest} ({medians[fastest]:.1f} s)")
        else:
            print(f"\npick {pick}: not run live; the live-fastest is {fastest}")
    print(f"within {WITHIN:.0%}: {within} of {checked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
