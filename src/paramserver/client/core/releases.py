"""The coordinator's releases as a worker takes them, with no sockets: the one pending until it
is taken, the samples it names (an elastic job's), and the lockstep round it names, which a push
of its step belongs to."""

from __future__ import annotations

from typing import Any, Mapping

from paramserver.policies.base import Release


class Releases:
    """The worker's side of the step protocol's releases."""

    def __init__(self):
        self.release: Release | None = None  # sent by the coordinator, not yet taken
        self.drawn: list | None = None  # the samples the last release names (elastic jobs)
        # (step, round id, round size) of the last release that named a lockstep round
        self.lockstep: tuple[int, int, int] | None = None

    def released(self, rank: int, fields: Mapping[str, Any]) -> Release:
        """The coordinator's release to `rank` (the fields of its answer to start or clock),
        kept until taken. A release not taken yet is replaced: only the newest one counts."""
        r = self.release = Release(rank, fields["step"], fields["batch"],
                                   scale=float(fields.get("scale", 1.0)),
                                   min_version=fields["min_version"],
                                   round_size=int(fields.get("round_size", 0)),
                                   stop=bool(fields.get("stop", False)),
                                   round_id=int(fields.get("round_id", 0)))
        # An elastic job's release names the samples to train on (coordinator/ledger.py).
        self.drawn = fields.get("samples")
        self.lockstep = (r.step, r.round_id, r.round_size) if r.round_id else None
        return r

    def take(self) -> Release:
        """The pending release, once: a second take without a new release is an error."""
        release, self.release = self.release, None
        if release is None:
            raise LookupError("no release is pending: the coordinator has sent none since the "
                              "last one was taken")
        return release

    def push_fields(self, step: int, batch: int, scale: float, round_size: int = 0,
                    round_id: int = 0) -> dict:
        """The fields every push message of one step carries. A push of the step a lockstep
        release named (auto's bsp and lbbsp) that names no round itself is that round's: a
        client written against the plain KV API (push(..., step=release.step)) is summed
        with the round's other pushes, as under fixed BSP, not applied whole on arrival."""
        lockstep = self.lockstep
        if not round_id and lockstep is not None and lockstep[0] == step:
            round_id, round_size = lockstep[1], round_size or lockstep[2]
        fields = {"step": step, "batch": batch, "scale": float(scale)}
        if round_size:
            fields["round_size"] = round_size
        if round_id:
            fields["round_id"] = round_id
        return fields
