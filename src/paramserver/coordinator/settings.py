"""The coordinator's settings: read from the job dict once, at the node's edge, with defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Mapping


@dataclass(frozen=True)
class CoordinatorSettings:
    """What the coordinator's core needs of a job. `worker_job` and `optimizer` are payloads
    it forwards (in welcomes) without reading them."""

    workers: int
    servers: int
    batch_size: int
    sync: str = "bsp"
    sync_options: Mapping[str, Any] = field(default_factory=dict)
    num_keys: int = 0  # 0: the first worker to register tells it (a user's own model)
    dtype: str = "float32"
    optimizer: Mapping[str, Any] = field(default_factory=lambda: {"name": "sgd", "lr": 0.1})
    heartbeat_interval: float = 1.0  # told to the servers
    coordinator_timeout: float = 60.0  # told to the servers
    heartbeat_timeout: float = 5.0
    start_timeout: float = 120.0
    start_grace: float = 30.0  # before its start a member may be silent this long
    server_timeout: float | None = None  # None: max(6 heartbeat timeouts, 30 s)
    restart_servers: bool = False
    restart_timeout: float = 120.0
    evaluator: bool = False  # an evaluator must be ready before the start barrier opens
    max_samples: int | None = None
    max_seconds: float | None = None
    observer_grace: float = 30.0
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    checkpoint_seconds: float | None = None
    resume: Mapping[str, Any] | None = None  # {"dir", "tag"} of the checkpoint resumed from
    worker_job: Mapping[str, Any] = field(default_factory=dict)  # the welcome's job, less sync

    @property
    def silent_server_limit(self) -> float:
        if self.server_timeout is not None:
            return self.server_timeout
        return max(6 * self.heartbeat_timeout, 30.0)

    @classmethod
    def from_job(cls, job: Mapping[str, Any]) -> "CoordinatorSettings":
        """The one place the coordinator reads the job dict."""
        sync = job["sync"]
        ckpt = job.get("checkpoint") or {}
        server_timeout = job.get("server_timeout")
        return cls(
            workers=int(job["workers"]), servers=int(job["servers"]),
            batch_size=int(job["batch_size"]), sync=sync["name"],
            sync_options=dict(sync.get("options", {})), num_keys=int(job["num_keys"] or 0),
            dtype=job["dtype"], optimizer=job["optimizer"],
            heartbeat_interval=job.get("heartbeat_interval", 1.0),
            coordinator_timeout=job.get("coordinator_timeout", 60.0),
            heartbeat_timeout=float(job.get("heartbeat_timeout", 5.0)),
            start_timeout=float(job.get("start_timeout", 120.0)),
            start_grace=float(job.get("start_grace", 30.0)),
            server_timeout=None if server_timeout is None else float(server_timeout),
            restart_servers=bool(job.get("restart_servers")),
            restart_timeout=float(job.get("restart_timeout", 120.0)),
            evaluator=bool(job.get("eval_interval")),
            max_samples=job.get("max_samples") or None,
            max_seconds=job.get("max_seconds") or None,
            observer_grace=float(job.get("observer_grace", 30.0)),
            checkpoint_dir=str(PurePath(ckpt["dir"])) if ckpt.get("dir") else None,
            checkpoint_every=ckpt.get("every"), checkpoint_seconds=ckpt.get("seconds"),
            resume=dict(job["resume"]) if job.get("resume") else None,
            worker_job={k: v for k, v in job.items() if k != "sync"})
