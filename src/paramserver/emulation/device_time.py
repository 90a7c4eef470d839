"""Emulated device time (`--device-time`): how long a step would last on its own accelerator.

Pure logic, no clock: the pacer measures real compute and sleeps for the top-up computed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paramserver.core.units import UnitError, parse_duration
from paramserver.emulation.stragglers import StragglerSpecError

DEVICE_TIME_HELP = """\
emulated device time per sample: each step lasts batch * COST * straggler factor (a sleep that
tops up the real compute); 'off' scales the real compute time by the factor instead.
Examples: off, 2ms, 0.5ms, 250us, 0.002s (a trailing /sample is accepted)"""


@dataclass(frozen=True)
class TopUp:
    """How one step's modelled time splits into real compute and the sleep that tops it up."""

    real: float
    sleep: float
    modelled: float

    @property
    def real_share(self) -> float:
        """Fraction of the step's duration that was real compute (1.0 = model too small)."""
        total = self.real + self.sleep
        return self.real / total if total > 0 else 1.0

    @property
    def overrun(self) -> bool:
        """Real compute took longer than the modelled time, so the model did not hold."""
        return self.real > self.modelled


@dataclass(frozen=True)
class DeviceTime:
    """Per-sample device cost in seconds; None means off (the factor scales real compute)."""

    cost_per_sample: float | None = None
    source: str | None = field(default=None, compare=False, repr=False)  # the text parsed

    @property
    def enabled(self) -> bool:
        return self.cost_per_sample is not None

    def step_time(self, batch: int, factor: float = 1.0) -> float:
        """Modelled seconds of one step: batch * cost_per_sample * factor."""
        if self.cost_per_sample is None:
            raise ValueError("device time is off: a step's time is its real compute time")
        return batch * self.cost_per_sample * factor

    def top_up(self, batch: int, factor: float, real_seconds: float) -> TopUp:
        """Sleep needed after `real_seconds` of compute so the step lasts its modelled time."""
        real = max(0.0, real_seconds)
        modelled = real * factor if self.cost_per_sample is None else self.step_time(batch, factor)
        return TopUp(real=real, sleep=max(0.0, modelled - real), modelled=modelled)

    def text(self) -> str:
        """The --device-time value this was read from (or one that reads back the same)."""
        if self.source is not None:
            return self.source
        return "off" if self.cost_per_sample is None else f"{self.cost_per_sample!r}s"

    def describe(self) -> str:
        return "off" if self.cost_per_sample is None else f"{self.cost_per_sample * 1e3:g}ms/sample"


class ComputeShare:
    """Run-level faithfulness: the share of step time that was real compute, and overruns."""

    def __init__(self) -> None:
        self.real = self.slept = 0.0
        self.steps = self.overruns = 0

    def add(self, top_up: TopUp) -> None:
        self.real += top_up.real
        self.slept += top_up.sleep
        self.steps += 1
        self.overruns += top_up.overrun

    @property
    def share(self) -> float:
        total = self.real + self.slept
        return self.real / total if total > 0 else 1.0

    def summary(self) -> dict:
        """JSON-ready totals for summary.json."""
        return {"real_compute_s": self.real, "device_sleep_s": self.slept, "steps": self.steps,
                "real_compute_share": self.share, "overrun_steps": self.overruns}


def parse_device_time(spec: str | None) -> DeviceTime:
    """Parse a --device-time value (grammar in DEVICE_TIME_HELP; durations as core.units)."""
    text = (spec or "off").strip()
    if text.lower() in ("off", "none"):
        return DeviceTime(None, text)
    body = text[:-len("/sample")].rstrip() if text.endswith("/sample") else text
    try:
        cost = parse_duration(body)
    except UnitError:
        raise StragglerSpecError(f"bad --device-time {spec!r}: expected 'off' or a time per "
                                 f"sample with a unit, e.g. 2ms, 0.5ms, 250us, 0.002s") from None
    if cost <= 0:
        raise StragglerSpecError(f"bad --device-time {spec!r}: the cost must be > 0 "
                                 f"(use 'off' to disable)")
    return DeviceTime(cost, text)
