"""The report's PNG figures, drawn with matplotlib's Agg canvas from the series in series.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from paramserver.report import series
from paramserver.report.collect import SCORES, Collection, fmt_target
from paramserver.report.series import policy_color
from paramserver.report.table import Row

# Stacked-bar parts of the per-worker breakdown: dark to light, so "waiting" stands out as pale.
_PARTS = (("compute", "#3b5b92"), ("communication", "#8fb0d9"), ("waiting", "#f2c14e"))
# Reading order: the headline number first, then the curves behind it, then the causes.
KINDS = ("tta", "accuracy_time", "accuracy_steps", "throughput", "breakdown", "staleness")
# Drawn only where the runs have what they need (wait_bands: simulations' steps.npz).
OPTIONAL_KINDS = ("wait_bands",)
_NEEDS_EVALS = ("tta", "accuracy_time", "accuracy_steps")
# Past this many distinct staleness values the histogram is drawn in STALENESS_BINS bins.
MAX_STALENESS_BARS, STALENESS_BINS = 60, 50


@dataclass
class FigureFile:
    scenario: str
    kind: str
    path: Path


def _canvas(width: float = 10.0, height: float = 4.4, ncols: int = 1):
    # No pyplot: no global figure state, and Agg regardless of the user's backend.
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, format="png")
    return path


def plot_accuracy(data: dict, scenario: str, target: float, x: str, path: Path,
                  score: str = "accuracy") -> Path:
    """Test accuracy (or AUC) against wall time or steps: thin lines per repeat, thick median."""
    fig, (ax,) = _canvas()
    for policy, d in data.items():
        color, dashed = policy_color(policy), "--" if policy == "single" else "-"
        if len(d["repeats"]) > 1:
            for xs, ys in d["repeats"]:
                ax.plot(xs, ys, color=color, lw=0.8, alpha=0.45, ls=dashed, marker="o", ms=3,
                        drawstyle="steps-post")
        xs, ys = d["median"]
        label = policy + (f" (median of {len(d['repeats'])})" if len(d["repeats"]) > 1 else "")
        # Markers: short runs have few evaluations, and a single one draws no line at all.
        ax.plot(xs, ys, color=color, lw=2.2, ls=dashed, label=label, drawstyle="steps-post",
                marker="o" if len(xs) < 30 else None, ms=5)
    label = SCORES[score][0]
    ax.axhline(target, color="black", lw=0.8, ls=":",
               label=f"target {100 * target:g}%" if score == "accuracy" else f"target {target:g}")
    ax.set_xlabel("wall time since start (s)" if x == "time" else "steps (samples / global batch)")
    ax.set_ylabel(label)
    top = 1.0 if score == "accuracy" else min(1.0, max(
        [target] + [max(d["median"][1]) for d in data.values() if len(d["median"][1])]) + 0.03)
    ax.set_ylim(_accuracy_floor(data), top)
    ax.set_xlim(left=0)  # every run starts at 0, even where its first evaluation came late
    ax.set_title(f"{scenario}: {label} against {'wall time' if x == 'time' else 'steps'}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    return _save(fig, path)


def _accuracy_floor(data: dict) -> float:
    # Early evaluations near chance squash the interesting top; start just below the median's
    # first value but never above 0.5 so the rise stays visible.
    firsts = [d["median"][1][0] for d in data.values() if len(d["median"][1])]
    return max(0.0, min([0.5] + [f - 0.05 for f in firsts]))


def plot_breakdown(data: dict, scenario: str, path: Path) -> Path:
    """Per-worker seconds of compute, communication and waiting; one bar group per policy."""
    bars = sum(len(workers) + 1 for workers in data.values())
    fig, (ax,) = _canvas(width=min(14.0, max(10.0, 2.5 + 0.4 * bars)))
    pos, ticks, labels, centers = 0.0, [], [], []
    for policy, workers in data.items():
        start = pos
        for worker, parts in workers.items():
            bottom = 0.0
            for (name, color), value in zip(_PARTS, parts):
                ax.bar(pos, value, bottom=bottom, color=color, width=0.8,
                       edgecolor=policy_color(policy), linewidth=1.2,
                       label=name if not ticks else None)
                bottom += value
            ticks.append(pos), labels.append(f"w{worker}" if worker.isdigit() else worker)
            pos += 1
        centers.append(((start + pos - 1) / 2, policy))
        pos += 1  # a gap between policies
    grouped = any(not label.startswith("w") for label in labels)
    ax.set_xticks(ticks, labels, fontsize=8, rotation=45 if grouped else 0)
    for center, policy in centers:
        ax.annotate(policy, (center, 0), xytext=(0, -22), textcoords="offset points",
                    xycoords=("data", "axes fraction"), ha="center", va="top",
                    fontsize=10, fontweight="bold", color=policy_color(policy))
    ax.set_ylabel("seconds per worker (mean over repeats)")
    ax.set_title(f"{scenario}: where each worker's time went" + (
        " (workers by total time, in tenths: mean of each)" if grouped else ""))
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never on a bar
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_staleness(data: dict, scenario: str, path: Path) -> Path:
    """One small histogram per policy: fraction of steps at each staleness."""
    fig, axes = _canvas(width=min(14.0, max(10.0, 2.6 * len(data))), height=3.4,
                        ncols=max(1, len(data)))
    top = max((max(f) for _, f in data.values() if f), default=1.0)
    right = max([3] + [max(v) for v, _ in data.values() if v]) + 0.6  # one x scale for all
    binned = any(len(v) > MAX_STALENESS_BARS for v, _ in data.values())
    if binned:  # thousands of workers: thousands of distinct staleness values, a bar each
        top = max((max(np.histogram(v, bins=STALENESS_BINS, weights=f)[0]) for v, f
                   in data.values() if v), default=1.0)
    for ax, (policy, (values, fractions)) in zip(axes, data.items()):
        if binned and values:
            heights, edges = np.histogram(values, bins=STALENESS_BINS, weights=fractions)
            ax.stairs(heights, edges, fill=True, color=policy_color(policy))
        else:
            ax.bar(values, fractions, width=0.85, color=policy_color(policy))
        mean = sum(v * f for v, f in zip(values, fractions))
        ax.set_title(f"{policy} (mean {mean:.2f})", color=policy_color(policy), fontweight="bold")
        ax.set_xlabel("staleness (versions)")
        ax.set_xlim(-0.6, right)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, top * 1.1)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel(f"fraction of steps (in {STALENESS_BINS} bins)" if binned
                       else "fraction of steps")
    fig.suptitle(f"{scenario}: staleness of the pushed gradients")
    return _save(fig, path)


def plot_wait_bands(data: dict, scenario: str, path: Path) -> Path | None:
    """Wait per step across workers (simulations with steps.npz): the median line in a band
    from the lowest to the highest quantile kept; None when no run has the bands."""
    if not data:
        return None
    fig, (ax,) = _canvas()
    for policy, d in data.items():
        color, q, wait = policy_color(policy), d["q"], d["wait_s"] * 1e3
        ax.fill_between(d["step"], wait[:, 0], wait[:, -1], color=color, alpha=0.2, lw=0)
        ax.plot(d["step"], wait[:, len(q) // 2], color=color, lw=1.8,
                label=f"{policy} (median, band p{100 * q[0]:g}-p{100 * q[-1]:g})")
    ax.set_xlabel("step")
    ax.set_ylabel("wait before the step (ms)")
    ax.set_title(f"{scenario}: wait per step across workers")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    return _save(fig, path)


def plot_throughput(data: dict, scenario: str, path: Path) -> Path:
    """Samples per second per policy: median bar, one dot per repeat."""
    fig, (ax,) = _canvas(width=min(10.0, 1.3 * len(data) + 3))
    for i, (policy, d) in enumerate(data.items()):
        ax.bar(i, d["median"], color=policy_color(policy), width=0.65)
        ax.plot([i] * len(d["repeats"]), d["repeats"], "o", color="black", ms=3.5)
        ax.annotate(f"{d['median']:.0f}", (i, max(d["repeats"])), xytext=(0, 4),
                    textcoords="offset points", ha="center", fontsize=9)
    ax.set_xticks(range(len(data)), list(data))
    ax.set_ylabel("samples / s of training (all workers)")
    ax.set_title(f"{scenario}: training throughput (bar: median, dots: repeats)")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_tta(bars: list[dict], scenario: str, target: float, path: Path,
             score: str = "accuracy") -> Path:
    """Time to target per policy: median bar, min–max whisker, speedup over BSP on top."""
    fig, (ax,) = _canvas(width=min(10.0, 1.3 * len(bars) + 3))
    top = max((b["max"] for b in bars if b["max"] is not None), default=1.0)
    for i, b in enumerate(bars):
        if b["median"] is None:
            ax.annotate(f"not reached\n({b['reached']}/{b['repeats']})", (i, 0), xytext=(0, 8),
                        textcoords="offset points", ha="center", fontsize=9, color="#a00")
            continue
        err = [[b["median"] - b["min"]], [b["max"] - b["median"]]]
        ax.bar(i, b["median"], yerr=err, capsize=5, color=policy_color(b["policy"]), width=0.65)
        note = "" if b["speedup"] is None else f"×{b['speedup']:.2f} vs BSP"
        ax.annotate(f"{b['median']:.1f} s\n{note}".strip(), (i, b["max"]), xytext=(0, 4),
                    textcoords="offset points", ha="center", fontsize=9)
    ax.set_xticks(range(len(bars)), [b["policy"] for b in bars])
    ax.set_xlim(-0.7, len(bars) - 0.3)  # room for a "not reached" label at either end
    ax.set_ylim(0, top * 1.3)
    ax.set_ylabel(f"seconds to {fmt_target(score, target)}")
    ax.set_title(f"{scenario}: time to {fmt_target(score, target)} (median, min–max)")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "scenario"


def draw_all(collection: Collection, rows: list[Row], outdir: Path) -> list[FigureFile]:
    """Every figure of every scenario into outdir; returns them in reading order."""
    outdir.mkdir(parents=True, exist_ok=True)
    target, score, out = collection.target, collection.score, []
    for scenario in collection.scenarios():
        def path(kind):
            return outdir / f"{kind}-{slug(scenario)}.png"
        drawn = {
            "accuracy_time": lambda p: plot_accuracy(series.accuracy_series(
                collection, scenario, "time"), scenario, target, "time", p, score),
            "accuracy_steps": lambda p: plot_accuracy(series.accuracy_series(
                collection, scenario, "steps"), scenario, target, "steps", p, score),
            "breakdown": lambda p: plot_breakdown(series.breakdown_series(collection, scenario),
                                                  scenario, p),
            "staleness": lambda p: plot_staleness(series.staleness_series(collection, scenario),
                                                  scenario, p),
            "throughput": lambda p: plot_throughput(series.throughput_series(collection, scenario),
                                                    scenario, p),
            "wait_bands": lambda p: plot_wait_bands(series.wait_bands(collection, scenario),
                                                    scenario, p),
            "tta": lambda p: plot_tta(series.tta_series(rows, scenario), scenario, target, p,
                                      score),
        }
        # Without any evaluation (a simulation without --train) the accuracy figures would be
        # empty axes: left out, a third of a large report's time.
        scored = any(r.evals for r in collection.runs if r.scenario == scenario)
        for kind in KINDS + OPTIONAL_KINDS:
            if not scored and kind in _NEEDS_EVALS:
                continue
            # A figure that cannot be drawn is reported, not fatal: the table still stands.
            try:
                drawn_path = drawn[kind](path(kind))
                if drawn_path is not None:  # a figure with nothing to show is left out
                    out.append(FigureFile(scenario, kind, drawn_path))
            except Exception as exc:  # noqa: BLE001
                collection.warnings.append(f"figure {kind} of {scenario} failed: {exc!r}")
    return out
