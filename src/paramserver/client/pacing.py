"""Emulated device time and injected slowness applied to a live worker: the sleep after compute."""

from __future__ import annotations

import time

from paramserver.emulation.device_time import DeviceTime, parse_device_time
from paramserver.emulation.stragglers import parse_straggler
from paramserver.emulation.trace_io import read_trace


class Pacer:
    """Stretches a worker's real compute to its modelled duration with a CPU-free sleep.

    Without device time a straggler factor f stretches the real compute to f times itself; with
    device time the step lasts batch * cost_per_sample * f, whatever the real compute took
    (the real gradient is computed first, then the wait is topped up).
    """

    def __init__(self, rank: int, straggler: str = "none", device_time: str = "off",
                 seed: int = 0):
        self.rank = rank
        self.straggler = parse_straggler(straggler, seed, read_trace)
        self.device: DeviceTime = parse_device_time(device_time)

    def stretch(self, step: int, t: float, batch: int, real_s: float) -> tuple[float, float]:
        """Sleep as needed; returns (modelled compute seconds, slowdown factor used)."""
        factor = self.straggler.factor(self.rank, step, t)
        top_up = self.device.top_up(batch, factor, real_s)
        if top_up.sleep > 0:
            time.sleep(top_up.sleep)
        return max(top_up.modelled, top_up.real), factor
