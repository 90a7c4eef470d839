"""Discrete-event simulator: the live sync policies, thousands of virtual workers, virtual time."""

from __future__ import annotations

from paramserver.sim.core.compute import COMPUTE_HELP, ComputeSpecError, parse_compute
from paramserver.sim.core.engine import Engine, Network, NullSink, SimError
from paramserver.sim.run import SimConfig, Simulation, simulate

__all__ = ["COMPUTE_HELP", "ComputeSpecError", "Engine", "Network", "NullSink", "SimConfig",
           "SimError", "Simulation", "parse_compute", "simulate"]
