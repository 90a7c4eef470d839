"""Why a worker leaves: the reasons its `bye` carries that others read back from the events.

The user's `DistributedOptimizer` says it (client/api.py) and the launchers' verdict reads it
(launch/core/verdict.py), so it lives below both."""

from __future__ import annotations

# A rank that closed its optimizer (or returned from its script) without one step: launch
# names it as failed, since the others waited for a worker that never trained.
NO_STEP_REASON = "closed without calling step()"
# A worker that finished its part (the budget spent, the job stopped, its script done): a job
# ends finished once one of its workers left so (coordinator/progress.py EndOfJob).
FINISHED = "done"
