"""The torch optimizer a launched script passed to DistributedOptimizer: the job's update rule.

A script job's servers wait for the key space, which the first worker's model gives; when
that worker's registration also carries its script's torch optimizer (as an OptimizerSpec:
the registered rule that runs the class, its settings, its groups' key ranges), the servers
are welcomed with it instead of launch's `--optimizer`. Every later rank must send the same
optimizer (they run the same script), or none if the first sent none; a job whose servers had
their update rule before any worker joined (a key space given up front) takes none. Pure.
"""

from __future__ import annotations

import json

from dataclasses import replace

from paramserver.coordinator.events import AppendEvent, Registered
# Launch's --optimizer that composes with a script's torch optimizer (STALENESS_RULES): it
# scales every lr by how stale a push is (optim/torch_rule.py); compare pairs SSP and
# ElasticBSP with dynsgd.
from paramserver.spec.job import STALENESS_RULES, OptimizerSpec


def _text(spec: OptimizerSpec | None) -> str:
    return "none" if spec is None else json.dumps(spec.to_wire(), sort_keys=True)[:300]


class ScriptOptimizer:
    """`learns`: the job learns its key space from the first worker (its servers wait)."""

    def __init__(self, job_optimizer: OptimizerSpec, learns: bool):
        self.job_optimizer = job_optimizer
        self.learns = learns
        self.sent: OptimizerSpec | None = None  # the script's, once the first worker sent it
        self.spec: OptimizerSpec | None = None  # what the servers run: it, composed
        self.decided = False  # the first worker has said (with an optimizer or without)

    def first(self, e: Registered, out: list) -> None:
        """The worker whose model gives the job its key space: its optimizer (if any) becomes
        the servers' update rule."""
        if self.decided or not self.learns:
            return
        self.decided = True
        self.sent = self.spec = e.optimizer
        if self.spec is None:
            return
        job = self.job_optimizer
        if job.name in STALENESS_RULES:
            composed = {"staleness": job.name}
            if job.name == "consgd" and "global_rate" in job.options:
                composed["global_rate"] = job.options["global_rate"]
            self.spec = replace(self.spec, options={**self.spec.options, **composed})
        out.append(AppendEvent(e.now, "script_optimizer", {
            "rule": self.spec.name, "lr": self.spec.lr,
            "groups": len(self.spec.options.get("groups", ())),
            "staleness": self.spec.options.get("staleness", "none")}))

    def check(self, e: Registered) -> None:
        """A worker's optimizer must be the job's: ValueError (its registration refused)."""
        if e.optimizer is None and self.sent is None:
            return
        if not self.learns:
            raise ValueError(
                f"this job's servers were given their update rule before any worker joined "
                f"(--optimizer {self.job_optimizer.name}); a torch optimizer in the script is "
                f"taken only by a job that learns its model from the first worker "
                f"(`paramserver launch -- python script.py`): pass the model instead")
        if e.optimizer != self.sent:
            raise ValueError(
                f"the script's optimizer differs from the job's, which the first worker sent: "
                f"{_text(e.optimizer)} here, {_text(self.sent)} in the job; every rank must "
                f"pass the same torch optimizer (class, settings and parameter groups)")
