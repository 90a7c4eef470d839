"""A run folder's job as the offline readers see it (summary, report, advise, replay, export).

The job a run folder records is a JobSpec's dict (`train`'s config.json, `launch`'s job.json),
an older version of it, or the simulator's own record (which adds `sim` and `apply_mode`). The
readers need a few of its fields and must take older and simulated runs as they are, so this
is a lenient, typed view: every field read here, once, with one set of defaults; a field the
record lacks is None where a reader must tell "not recorded" from a value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class RunTask:
    """What the job trained: the built-in task's fields a reader names."""

    name: str = "train"
    model: str | None = None
    dataset: str | None = None
    seed: int = 0
    straggler: str = "none"
    device_time: str = "off"
    fields: Mapping = field(default_factory=dict)  # the task as recorded (models.workload)


@dataclass(frozen=True)
class RunJob:
    sync: str | None = None
    sync_options: Mapping = field(default_factory=dict)
    workers: int | None = None
    servers: int | None = None
    batch_size: int | None = None
    num_keys: int | None = None
    dtype: str = "float32"
    max_samples: int | None = None
    apply_mode: str = "arrival"
    optimizer: str | None = None
    lr: float | None = None
    task: RunTask = field(default_factory=RunTask)
    links: Any = None  # LinkTable's dict form ({"w": {...}}) or its list of entries
    checkpoint_dir: str | None = None
    has_tables: bool = False

    @property
    def itemsize(self) -> int:
        return 8 if self.dtype == "float64" else 4

    @property
    def model_bytes(self) -> int | None:
        return self.num_keys * self.itemsize if self.num_keys else None

    @classmethod
    def of(cls, job: Mapping[str, Any] | None) -> "RunJob":
        """The view of a recorded job dict (None or not a dict: nothing recorded)."""
        if not isinstance(job, Mapping):
            return cls()
        sync = _map(job.get("sync"))
        optimizer = _map(job.get("optimizer"))
        task = _map(job.get("task"))
        return cls(
            sync=_str(sync.get("name")), sync_options=_map(sync.get("options")),
            workers=_count(job.get("workers")), servers=_count(job.get("servers")),
            batch_size=_count(job.get("batch_size")), num_keys=_count(job.get("num_keys")),
            dtype=_str(job.get("dtype")) or "float32",
            max_samples=_count(job.get("max_samples")),
            apply_mode=_str(job.get("apply_mode")) or "arrival",
            optimizer=_str(optimizer.get("name")), lr=_number(optimizer.get("lr")),
            task=RunTask(_str(task.get("name")) or "train", _str(task.get("model")),
                         _str(task.get("dataset")), _count(task.get("seed")) or 0,
                         _str(task.get("straggler")) or "none",
                         _str(task.get("device_time")) or "off", task),
            links=job.get("links") if isinstance(job.get("links"), (Mapping, list)) else None,
            checkpoint_dir=_str(_map(job.get("checkpoint")).get("dir")),
            has_tables=bool(job.get("tables")))


def _map(value) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _str(value) -> str | None:
    return value if isinstance(value, str) else None


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value) -> float | None:
    """A number as recorded (an int stays an int: summaries write it back as it was)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value
