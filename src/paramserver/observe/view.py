"""The `paramserver top` screen: a Snapshot drawn with rich (no I/O besides the console)."""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from paramserver.observe.source import Link
from paramserver.observe.core.stats import CHRONIC, PHASES, TRANSIENT, Snapshot, WorkerRow

# One colour per phase, in the split bar and its legend.
PHASE_STYLE = {"data": "magenta", "compute": "green", "push": "cyan", "wait": "red",
               "pull": "blue"}
STATE_STYLE = {CHRONIC: "bold white on red", TRANSIENT: "bold black on yellow", "ok": "dim"}
BAR = 20


@dataclass(frozen=True)
class Header:
    """What the view says about the job beside the statistics."""

    source: str
    policy: str | None
    finished: bool
    members: dict
    preflight: list[Link] | None = None
    note: str = ""  # a line under the header: why nothing shows, say


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}" if seconds >= 0.0095 else f"{seconds * 1e3:.1f}"


def split_bar(phases: dict, width: int = BAR) -> Text:
    """The step's split as a bar of `width` cells, one colour per phase (largest remainders)."""
    total = sum(phases.values())
    bar = Text()
    if total <= 0:
        return Text("·" * width, style="dim")
    exact = {p: phases[p] / total * width for p in PHASES}
    cells = {p: int(v) for p, v in exact.items()}
    left = width - sum(cells.values())
    for p in sorted(PHASES, key=lambda p: cells[p] - exact[p])[:left]:
        cells[p] += 1
    for p in PHASES:
        bar.append("█" * cells[p], style=PHASE_STYLE[p])
    return bar


def _legend() -> Text:
    t = Text("split: ")
    for p in PHASES:
        t.append("█ ", style=PHASE_STYLE[p])
        t.append(p + "  ")
    t.append("  x med: work per sample over the others' median;  lost s: seconds the other "
             "workers waited for this one", style="dim")
    return t


def _order(rows: list[WorkerRow], limit: int) -> tuple[list[WorkerRow], int]:
    """All rows by rank when they fit; else the flagged and costliest first."""
    if len(rows) <= limit:
        return rows, 0
    rank = {CHRONIC: 0, TRANSIENT: 1}
    chosen = sorted(rows, key=lambda r: (rank.get(r.state, 2), -r.lost_s, r.worker))[:limit]
    return sorted(chosen, key=lambda r: r.worker), len(rows) - limit


# Console widths below which the workers table sheds columns rather than squeeze every one
# into an ellipsis: first the phases' own columns (the split bar still shows them), then the
# batch and x-med columns, with a shorter bar (an 80-column terminal).
PHASE_COLUMNS_FROM = 140
ALL_BUT_PHASES_FROM = 100
NARROW_BAR = 10


def workers_table(snap: Snapshot, limit: int = 32, width: int | None = None) -> Table:
    """The per-worker table; `width` (the console's) picks the columns that fit it."""
    phases = width is None or width >= PHASE_COLUMNS_FROM
    extras = width is None or width >= ALL_BUT_PHASES_FROM
    bar = BAR if extras else NARROW_BAR
    table = Table(title="workers (means over each one's last steps; times in ms)",
                  title_justify="left", expand=False, pad_edge=False, box=box.SIMPLE_HEAD,
                  header_style="bold", show_edge=False)
    columns = [("worker", "right", True), ("step", "right", True),
               ("samples/s", "right", True), ("batch", "right", extras),
               ("stale", "right", True), ("step ms", "right", True),
               *((p, "right", phases) for p in PHASES), ("split", "left", True),
               ("x med", "right", extras), ("state", "left", True), ("lost s", "right", True)]
    shown = [on for _, _, on in columns]
    for name, justify, on in columns:
        if on:
            table.add_column(name, justify=justify, no_wrap=True)

    def add(*cells, style=None) -> None:
        table.add_row(*(c for c, on in zip(cells, shown) if on), style=style)

    rows, hidden = _order(snap.workers, limit)
    for r in rows:
        state = Text(r.state if not r.left else f"{r.state}, left",
                     style=STATE_STYLE.get(r.state, ""))
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        add(str(r.worker), str(r.step), f"{r.samples_per_s:.1f}", str(r.batch),
            f"{r.staleness:.1f}", _ms(r.step_s), *(_ms(r.phases[p]) for p in PHASES),
            split_bar(r.phases, bar), ratio, state, f"{r.lost_s:.1f}",
            style="dim" if r.left else None)
    if hidden:
        add("", f"+{hidden} more", *[""] * (len(columns) - 2))
    table.add_section()
    spreads = snap.spreads
    for label, pick in (("min", "low"), ("median", "median"), ("max", "high")):
        def cell(col: str, fmt) -> str:
            s = spreads.get(col)
            return "" if s is None else fmt(getattr(s, pick))
        add(Text(label, style="italic"), "", cell("samples_per_s", "{:.1f}".format),
            "", cell("staleness", "{:.1f}".format), cell("step_s", _ms),
            *(cell(p, _ms) for p in PHASES), "", "", "", "", style="italic")
    return table


def shards_table(snap: Snapshot) -> Table:
    table = Table(title="shards (the last heartbeats)", title_justify="left", box=None,
                  pad_edge=False, header_style="bold")
    for name in ("shard", "apply ms/update", "updates/s", "queue (held pulls)",
                 "backlog (msgs)"):
        table.add_column(name, justify="right", no_wrap=True)
    for s in snap.shards:
        table.add_row(str(s.server), f"{s.apply_ms:.2f}", f"{s.applies_per_s:.1f}",
                      str(s.queue), str(s.backlog))
    return table


def preflight_table(links: list[Link]) -> Table:
    shards = sorted({link.shard for link in links})
    # The title is a line of its own: a table's title wraps at the (narrow) table's width.
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("worker", no_wrap=True)
    for s in shards:
        table.add_column(f"shard {s}", justify="right", no_wrap=True)
    by = {(link.worker, link.shard): link for link in links}
    for w in sorted({link.worker for link in links}):
        cells = []
        for s in shards:
            link = by.get((w, s))
            cells.append("-" if link is None else f"{link.rtt_ms:.2f} / {link.mbit_s:.0f}")
        table.add_row(w, *cells)
    return table


def flags_text(snap: Snapshot, last: int = 6) -> Text:
    text = Text("flags: ", style="bold")
    if not snap.changes:
        text.append("none yet", style="dim")
        return text
    for i, c in enumerate(snap.changes[-last:]):
        if i:
            text.append("; ")
        text.append(f"t={c.t:.1f}s worker {c.worker} step {c.step} -> ")
        text.append(c.state, style=STATE_STYLE.get(c.state, ""))
    return text


def header_text(snap: Snapshot, head: Header) -> Text:
    mode = "round" if snap.round_mode else "arrival"
    t = Text()
    t.append("paramserver top", style="bold")
    t.append(f"  {head.source}  ")
    t.append(f"policy {head.policy or '?'} ({mode} mode)  ")
    t.append(f"t={snap.t:.1f}s  steps {snap.steps}  samples {snap.samples}  ")
    live = sum(1 for r in snap.workers if not r.left)
    t.append(f"workers {live}/{len(snap.workers)}  ")
    t.append("finished" if head.finished else "running",
             style="bold green" if head.finished else "bold cyan")
    t.append("   q: quit", style="dim")
    return t


def render(snap: Snapshot, head: Header, max_workers: int = 32,
           width: int | None = None) -> RenderableType:
    """The whole screen; `width` (the console's) trims the workers table to fit."""
    parts: list[RenderableType] = [header_text(snap, head)]
    if head.note:
        parts.append(Text(head.note, style="bold yellow"))
    if not snap.workers:
        parts.append(Text("waiting for the first step records...", style="dim"))
    else:
        parts.append(workers_table(snap, max_workers, width))
        parts.append(_legend())
        parts.append(flags_text(snap))
    if snap.shards:
        parts.append(shards_table(snap))
    if head.preflight:
        parts.append(Text("preflight: rtt ms / Mbit/s per worker -> shard", style="italic"))
        parts.append(preflight_table(head.preflight))
    return Panel(Group(*parts), border_style="grey50", padding=(0, 1))
