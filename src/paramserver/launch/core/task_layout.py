"""Which role each task of a scheduler's job step runs (`paramserver task`).

A scheduler starts the same command N times and numbers the copies 0..N-1 (Slurm's
SLURM_PROCID under `srun --ntasks N`, torchrun's RANK). The job file says what the job needs,
so the numbering alone places the roles: task 0 is the coordinator, the next ones the shard
servers (then their backups, with replicas), then the evaluator when the job evaluates, and
every other task a worker. A step of the wrong size is refused naming the count it needs.
Pure: the job and the count in, the layout out.
"""

from __future__ import annotations

from dataclasses import dataclass

from paramserver.spec.job import JobSpec


class LayoutError(ValueError):
    """The step's task count does not fit the job; says the count that would."""


@dataclass(frozen=True)
class TaskLayout:
    servers: int  # shard servers (primaries)
    backups: int  # their backups (replicas 2), one per shard
    evaluator: bool
    workers: int

    @classmethod
    def of(cls, job: JobSpec, count: int) -> "TaskLayout":
        backups = job.servers if job.replicas > 1 else 0
        evaluator = job.eval_interval > 0
        others = 1 + job.servers + backups + int(evaluator)
        least = job.min_workers or job.workers
        workers = count - others
        if not least <= workers <= job.workers:
            need = (f"{others + least} to {others + job.workers}" if least < job.workers
                    else f"{others + job.workers}")
            parts = ["1 coordinator", f"{job.servers} server(s)"]
            if backups:
                parts.append(f"{backups} backup(s)")
            if evaluator:
                parts.append("1 evaluator (eval_interval > 0; write the job with "
                             "--eval-interval 0 for none)")
            workers_text = (f"{least} to {job.workers} workers" if least < job.workers
                            else f"{job.workers} workers")
            raise LayoutError(f"the step has {count} task(s); the job needs {need}: "
                              f"{', '.join(parts)} and {workers_text} (e.g. srun --ntasks "
                              f"{others + job.workers})")
        return cls(job.servers, backups, evaluator, workers)

    @property
    def count(self) -> int:
        return 1 + self.servers + self.backups + int(self.evaluator) + self.workers

    def role(self, index: int) -> tuple[str, int]:
        """(role, its number among its kind) of task `index`: coordinator, server, backup,
        evaluator or worker."""
        if not 0 <= index < self.count:
            raise LayoutError(f"task {index} is outside the step's {self.count} tasks")
        if index == 0:
            return "coordinator", 0
        index -= 1
        for role, n in (("server", self.servers), ("backup", self.backups),
                        ("evaluator", int(self.evaluator))):
            if index < n:
                return role, index
            index -= n
        return "worker", index
