"""Training-job configuration as the command line gives it; `JobSpec.from_config` makes the job.

The defaults are the job spec's (spec/job.py): a TrainConfig field that becomes a job field
takes its default from there. Quantities arrive parsed: `links` is a LinkTable, `straggler` a
ParsedStraggler (its text, with the model), `device_time` a DeviceTime (the command line
parses each flag once, with
argparse `type=`); text given by a Python caller or read back from config.json is parsed here,
once, on construction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from paramserver.emulation.device_time import DeviceTime, parse_device_time
from paramserver.emulation.links import LinkTable
from paramserver.emulation.stragglers import ParsedStraggler
from paramserver.spec.job import JobSpec, JobSpecError, Limits, OptimizerSpec, SyncSpec, TaskSpec


@dataclass
class TrainConfig:
    """Everything `paramserver train` needs; the defaults are the default job."""

    sync: str = SyncSpec.name
    sync_options: dict = field(default_factory=dict)
    workers: int = JobSpec.workers
    servers: int = JobSpec.servers
    model: str = TaskSpec.model
    model_options: dict = field(default_factory=dict)  # --model-opt (dlrm: dim, row_budget, ...)
    model_size: int | None = None  # parameters, for a model sized by count (--model-size)
    dataset: str = TaskSpec.dataset
    data_dir: str | None = TaskSpec.data_dir
    dataset_options: dict = field(default_factory=dict)
    epochs: float = 30.0
    steps: int | None = None  # per worker; overrides epochs when given
    max_seconds: float | None = JobSpec.max_seconds
    batch_size: int = JobSpec.batch_size
    lr: float = OptimizerSpec.lr
    optimizer: str = OptimizerSpec.name
    optimizer_options: dict = field(default_factory=dict)
    straggler: str = TaskSpec.straggler  # a ParsedStraggler once constructed
    device_time: DeviceTime = field(default_factory=DeviceTime)  # or its text
    seed: int = TaskSpec.seed
    threads: int = TaskSpec.threads
    eval_interval: float = JobSpec.eval_interval  # 0: no evaluator process
    dtype: str = JobSpec.dtype
    heartbeat_timeout: float = Limits.heartbeat_timeout
    max_message_bytes: int | None = Limits.max_message_bytes  # None: from the model size
    stall_timeout: float | None = Limits.stall_timeout  # None: from the step time
    compress: str = TaskSpec.compress
    compress_options: dict = field(default_factory=dict)
    pull_compress: str = TaskSpec.pull_compress  # a codec for delta pulls (compression/wire.py)
    pull_refresh: int = TaskSpec.pull_refresh  # a dense pull every N
    push_range: str = TaskSpec.push_range  # keys pushed/pulled per step (compression/ranges.py)
    schedule: str = TaskSpec.schedule  # per-layer requests: off, fifo, lifo, stalest
    device: str = TaskSpec.device  # where workers compute: cpu, cuda, auto (--device)
    amp: str = TaskSpec.amp  # mixed precision: off, bf16, fp16 (--amp)
    links: LinkTable = field(default_factory=LinkTable)  # or --link texts
    restart_workers: int = 0  # dead workers the launcher replaces over the job's life
    restart_servers: int = JobSpec.restart_servers  # dead servers restarted from a checkpoint
    replicas: int = JobSpec.replicas  # copies of each shard (2: primary and backup)
    restart_coordinator: int = 0  # dead coordinators restarted at the same address
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None  # rounds (round-mode policies) or worker steps
    checkpoint_seconds: float | None = None
    metrics_port: int | None = JobSpec.metrics_port  # --metrics-port (0: a free port)
    metrics_host: str = JobSpec.metrics_host  # --metrics-host
    preflight: bool = JobSpec.preflight  # --preflight/--no-preflight
    min_workers: int = 0  # elastic (--workers MIN:MAX): MIN, and `workers` is MAX; 0: fixed
    max_servers: int = 0  # --servers MIN:MAX: MAX, and `servers` is MIN; 0: a fixed count
    batch_rule: str = "fixed"  # the global-batch rule of an elastic job (--batch-rule)

    def __post_init__(self):
        # Text from a Python caller or a saved config.json: parsed here, once.
        if not isinstance(self.links, LinkTable):
            self.links = LinkTable.parse(self.links)
        if not isinstance(self.straggler, ParsedStraggler):
            self.straggler = ParsedStraggler(self.straggler, self.seed)
        if not isinstance(self.device_time, DeviceTime):
            self.device_time = parse_device_time(self.device_time)

    def validate(self) -> None:
        """Fail early, with the field named, on values no run could use."""
        checks = [("epochs", self.epochs > 0, "a number > 0"),
                  ("steps", self.steps is None or self.steps >= 1, "a whole number >= 1"),
                  ("restart_workers", self.restart_workers >= 0, "a whole number >= 0"),
                  ("restart_coordinator", self.restart_coordinator >= 0, "a whole number >= 0")]
        bad = [(name, want) for name, ok, want in checks if not ok]
        if bad:
            raise JobSpecError("invalid value for " + ", ".join(
                f"{b}={getattr(self, b)!r} (expected {want})" for b, want in bad))
        try:
            self.job(0, 0)  # the job's own checks, each naming its field
        except JobSpecError as exc:
            raise JobSpecError(self.as_flags(str(exc))) from None

    @classmethod
    def as_flags(cls, message: str) -> str:
        """A job check's message with the job fields that a flag sets named by the flag: the
        user gave --max-message-bytes, not job field 'max_message_bytes'."""
        def flag(m: re.Match) -> str:
            name = m.group(1).removeprefix("task.").replace("checkpoint.", "checkpoint_")
            name = {"optimizer.lr": "lr", "optimizer.name": "optimizer"}.get(name, name)
            if name in cls.__dataclass_fields__:
                return "--" + name.replace("_", "-")
            return m.group(0)
        return re.sub(r"job field '([a-z_.]+)'", flag, message)

    def max_samples(self, train_size: int) -> int:
        """The sample budget all workers share: the same work under every sync policy."""
        if self.steps is not None:
            return self.steps * self.batch_size * self.workers
        return int(self.epochs * train_size)

    def job(self, num_keys: int, train_size: int, tables: tuple = ()) -> JobSpec:
        return JobSpec.from_config(self, num_keys, train_size, tables)

    def to_job(self, num_keys: int, train_size: int) -> dict:
        """The job dict handed to the coordinator, servers and workers (JobSpec.to_dict)."""
        self.validate()
        return self.job(num_keys, train_size).to_dict()

    def as_dict(self) -> dict:
        """JSON-able, and TrainConfig(**as_dict()) reads it back (config.json, --resume)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out.update(straggler=str(self.straggler), device_time=self.device_time.text(),
                   links=self.links.args())
        for key in ("sync_options", "model_options", "dataset_options", "optimizer_options",
                    "compress_options"):
            out[key] = dict(out[key])
        return out
