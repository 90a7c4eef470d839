"""The one reading of parsed flags into a TrainConfig, for every command that builds a job
(train, compare, launch, serve): each field from the flag whose dest is its name, the few
flags spelled otherwise mapped below, and a field whose flag a command does not offer left
at TrainConfig's default. A new flag named as its field reaches the job with no edit here."""

from __future__ import annotations

from paramserver.cli import args as flag
from paramserver.spec.config import TrainConfig


def _max(count):
    return count if isinstance(count, int) else count.max


def _elastic_min(count):
    """MIN of an elastic --workers MIN:MAX; 0 for a fixed count."""
    return count.min if getattr(count, "elastic", False) else 0


# field -> (the dest of the flag it comes from, what makes the field of the flag's value)
SPELLED = {
    "sync_options": ("sync_opt", flag.options),
    "model_options": ("model_opt", flag.options),
    "dataset_options": ("dataset_opt", flag.options),
    "optimizer_options": ("optimizer_opt", flag.options),
    "compress_options": ("compress_opt", flag.options),
    "links": ("link", flag.links),
    "workers": ("workers", _max),
    "min_workers": ("workers", _elastic_min),
    "servers": ("servers", lambda count: getattr(count, "min", count)),
    "max_servers": ("servers", lambda count: getattr(count, "max", 0)),
    "max_message_bytes": ("max_message_bytes", lambda n: None if n is None else int(n)),
}


def config_from_args(args, **fixed) -> TrainConfig:
    """The flags in `args` (already parsed by their `type=`) as a TrainConfig; `fixed`: fields
    the command sets itself (compare's base policy, say)."""
    if flag.given(args, "epochs") and getattr(args, "steps", None) is not None:
        raise ValueError(f"--epochs {args.epochs:g} and --steps {args.steps} both set the sample "
                         f"budget: give one of them")
    values = {}
    for name in TrainConfig.__dataclass_fields__:
        dest, read = SPELLED.get(name, (name, None))
        # A field the command sets itself is not read from its flag: compare's --sync-opt
        # holds POLICY.KEY=VALUE triples that compare takes apart per policy.
        if name not in fixed and hasattr(args, dest):
            value = getattr(args, dest)
            values[name] = value if read is None else read(value)
    values.update(fixed)
    return TrainConfig(**values)
