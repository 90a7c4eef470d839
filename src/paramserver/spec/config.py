"""Training-job configuration: one dataclass with the defaults, turned into the job description."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from paramserver.emulation.links import parse_links


@dataclass
class TrainConfig:
    """Everything `paramserver train` needs; the defaults are the default job."""

    sync: str = "bsp"
    sync_options: dict = field(default_factory=dict)
    workers: int = 4
    servers: int = 1
    model: str = "mlp"
    dataset: str = "digits"
    data_dir: str | None = None
    dataset_options: dict = field(default_factory=dict)
    epochs: float = 30.0
    steps: int | None = None  # per worker; overrides epochs when given
    max_seconds: float | None = None
    batch_size: int = 32
    lr: float = 0.1
    optimizer: str = "sgd"
    optimizer_options: dict = field(default_factory=dict)
    straggler: str = "none"
    device_time: str = "off"
    seed: int = 0
    threads: int = 1
    eval_interval: float = 1.0  # 0: no evaluator process
    dtype: str = "float32"
    heartbeat_timeout: float = 5.0
    compress: str = "none"
    compress_options: dict = field(default_factory=dict)
    push_range: str = "all"  # keys pushed/pulled per step (compression/ranges.py grammar)
    schedule: str = "off"  # per-layer requests: off, fifo, lifo, stalest
    links: list = field(default_factory=list)  # --link values (paramserver.emulation.links grammar)
    restart_workers: int = 0  # dead workers the launcher replaces over the job's life
    restart_servers: int = 0  # dead servers the launcher restarts from the latest checkpoint
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None  # rounds (round-mode policies) or worker steps
    checkpoint_seconds: float | None = None

    def validate(self) -> None:
        """Fail early, with the field named, on values no run could use."""
        checks = [("workers", self.workers >= 1), ("servers", self.servers >= 1),
                  ("batch_size", self.batch_size >= 1), ("lr", self.lr > 0),
                  ("epochs", self.epochs > 0), ("threads", self.threads >= 1),
                  ("eval_interval", self.eval_interval >= 0),
                  ("steps", self.steps is None or self.steps >= 1),
                  ("dtype", self.dtype in ("float32", "float64")),
                  ("restart_workers", self.restart_workers >= 0),
                  ("restart_servers", self.restart_servers >= 0),
                  ("checkpoint_every", self.checkpoint_every is None or self.checkpoint_every >= 1),
                  ("checkpoint_seconds",
                   self.checkpoint_seconds is None or self.checkpoint_seconds > 0)]
        parse_links(self.links)  # a bad link fails here, naming the part it cannot read
        bad = [name for name, ok in checks if not ok]
        if bad:
            raise ValueError(f"invalid value for {', '.join(bad)}: "
                             + ", ".join(f"{b}={getattr(self, b)!r}" for b in bad))
        if self.restart_servers and not (self.checkpoint_dir and (
                self.checkpoint_every or self.checkpoint_seconds)):
            raise ValueError("restart_servers needs checkpoints to restart from: give "
                             "--checkpoint-every or --checkpoint-seconds")

    def max_samples(self, train_size: int) -> int:
        """The sample budget all workers share: the same work under every sync policy."""
        if self.steps is not None:
            return self.steps * self.batch_size * self.workers
        return int(self.epochs * train_size)

    def to_job(self, num_keys: int, train_size: int) -> dict:
        """The job description handed to the coordinator, servers and workers."""
        self.validate()
        return {
            "num_keys": num_keys, "dtype": self.dtype, "servers": self.servers,
            "workers": self.workers, "batch_size": self.batch_size,
            "sync": {"name": self.sync, "options": dict(self.sync_options)},
            "optimizer": {"name": self.optimizer, "lr": self.lr,
                          "options": dict(self.optimizer_options)},
            "max_samples": self.max_samples(train_size), "max_seconds": self.max_seconds,
            "heartbeat_interval": min(1.0, self.heartbeat_timeout / 4),
            "heartbeat_timeout": self.heartbeat_timeout, "eval_interval": self.eval_interval,
            "restart_servers": self.restart_servers,
            "links": parse_links(self.links),
            "checkpoint": None if not self.checkpoint_dir else {
                "dir": self.checkpoint_dir, "every": self.checkpoint_every,
                "seconds": self.checkpoint_seconds},
            "task": {"name": "train", "model": self.model, "dataset": self.dataset,
                     "data_dir": self.data_dir, "dataset_options": dict(self.dataset_options),
                     "seed": self.seed, "straggler": self.straggler,
                     "device_time": self.device_time, "threads": self.threads,
                     "compress": self.compress, "compress_options": dict(self.compress_options),
                     "push_range": self.push_range, "schedule": self.schedule},
        }

    def as_dict(self) -> dict:
        return asdict(self)
