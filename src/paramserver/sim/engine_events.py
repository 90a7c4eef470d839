"""Event kinds, worker states and SimError, shared by the sim Engine and its mixins."""

READ, COMPUTED, APPLIED, CLOCK, LEAVE, TICK, DELIVER = range(7)
WAITING, RELEASED, BUSY, GONE = range(4)


class SimError(RuntimeError):
    """The policy broke the protocol (a release for a busy worker, a deadlock...)."""
