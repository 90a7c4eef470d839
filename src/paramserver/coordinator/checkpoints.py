"""Coordinator checkpoints: when to take one, the servers' confirmations, resuming from one."""

from __future__ import annotations

import logging
import time

from paramserver.net import rpc
from paramserver.coordinator.checkpoint_keeper import load_coordinator_state
from paramserver.wire import Message

log = logging.getLogger(__name__)


class CheckpointMixin:
    """Part of the Coordinator: shares its state (keeper, roster, policy, counters)."""

    # ---- checkpoints ---------------------------------------------------------------------------
    def _resume(self, resume: dict) -> None:
        state = load_coordinator_state(resume["dir"], resume["tag"])
        self.rounds_applied = state["rounds_applied"]
        self.samples_done = state["samples_done"]
        self.steps_done = state["steps_done"]
        self.worker_samples = {int(k): v for k, v in state["worker_samples"].items()}
        self.policy.resume(state["policy"])
        self.keeper.last_count = self._progress()
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        log.info("resuming from checkpoint %s: %d samples done", resume["tag"], self.samples_done)

    def _progress(self) -> int:
        return self.rounds_applied if self.policy.apply_mode == "round" else self.steps_done

    def _maybe_checkpoint(self, final: bool = False) -> None:
        count = self._progress()
        if not (final or self.keeper.due(count)) or self.keeper.pending_tag is not None:
            return
        tag = f"{count:09d}"
        self.keeper.begin(tag, [m.rank for m in self.roster.servers.values()], count)
        for m in self.roster.servers.values():
            rpc.send(self.sock, Message("checkpoint", {"tag": tag, "dir": str(self.keeper.root)},
                                        src="coord"), m.ident)

    def _on_saved(self, ident: bytes, msg: Message) -> None:
        member = self.roster.servers.get(msg.src)
        if member is None or not self.keeper.saved(member.rank, msg["tag"]):
            return
        state = {"rounds_applied": self.rounds_applied, "samples_done": self.samples_done,
                 "steps_done": self.steps_done, "policy": self.policy.resume_state(),
                 "worker_samples": {str(k): v for k, v in self.worker_samples.items()},
                 "sync": self.policy.name, "num_keys": self.job["num_keys"],
                 "elapsed_s": time.monotonic() - (self.t_start or time.monotonic())}
        tag = self.keeper.complete(state)
        self.record("checkpoint", tag=tag, samples=self.samples_done)
