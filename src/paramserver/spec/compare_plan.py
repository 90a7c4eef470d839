"""The plan of a comparison: scenarios x policies x repeats, each a TrainConfig and a run folder."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from paramserver.emulation.stragglers import ParsedStraggler, TraceReader
from paramserver.spec.config import TrainConfig

# Built-in straggler scenarios; `--scenario NAME=SPEC` adds others.
SCENARIOS = {
    "homogeneous": ("none", "every worker at the same speed"),
    "one-slow": ("1:3", "worker 1 computes 3x slower than the others"),
    "two-slow": ("1:3,2:2", "worker 1 is 3x and worker 2 2x slower"),
    "random": ("random:0.1:4", "each step, each worker is 4x slower with probability 0.1"),
    "shifting": ("schedule:1:0-10=3;2:10-20=3;3:20-=3",
                 "the 3x straggler moves from worker 1 to 2 to 3 over time"),
    "come-and-go": ("schedule:1:0-5=4;2:5-10=4",
                    "worker 1 is 4x slower for 5 s, then worker 2 for 5 s, then none"),
}
SINGLE = "single"  # the single-process reference at the same global batch


@dataclass(frozen=True)
class PlannedRun:
    scenario: str
    policy: str
    repeat: int
    config: TrainConfig
    folder: Path


def parse_scenarios(specs: list[str] | None, read_trace: TraceReader | None = None
                    ) -> dict[str, tuple[str, str]]:
    """Scenario names or NAME=SPEC pairs into name -> (straggler spec, description).

    Each spec is parsed here once (a ParsedStraggler, equal to its text): every run of the
    scenario shares it, and a bad one (with `read_trace`, an unreadable trace too) fails before
    the first run."""
    out = {}
    for spec in specs or ["one-slow"]:
        name, sep, straggler = spec.partition("=")
        if sep:
            out[name] = (ParsedStraggler(straggler, read_trace=read_trace), f"custom: --straggler {straggler}")
        elif spec in SCENARIOS:
            straggler, description = SCENARIOS[spec]
            out[spec] = (ParsedStraggler(straggler), description)
        else:
            raise ValueError(f"unknown scenario {spec!r}; known: {', '.join(SCENARIOS)} "
                             f"(or NAME=STRAGGLER_SPEC)")
    return out


def single_reference(base: TrainConfig) -> TrainConfig:
    """One worker with the global batch of the distributed runs: what distribution must beat.
    (An elastic comparison's is the global batch it starts with, MIN workers', which the
    keep-global rule holds.)"""
    return dataclasses.replace(base, sync="bsp", sync_options={}, workers=1, straggler="none",
                               batch_size=base.batch_size * (base.min_workers or base.workers),
                               min_workers=0, batch_rule="fixed")


@dataclass(frozen=True)
class JoinAt:
    """When the joiners of an elastic comparison (`compare --workers MIN:MAX`) join each run:
    after `seconds` of training (since the start barrier), or once a `share` of the run's
    sample budget is trained (of its --max-seconds, with no sample budget). The same point in
    every run: a share of the budget is the same work under every policy."""

    seconds: float | None = None
    share: float | None = None

    def __post_init__(self):
        if (self.seconds is None) == (self.share is None):
            raise ValueError("join at: give seconds or a share of the budget, one of them")
        if self.share is not None and not 0 <= self.share < 1:
            raise ValueError(f"join at {self.share:.0%} of the budget: expected 0% to 99%")
        if self.seconds is not None and not self.seconds >= 0:
            raise ValueError(f"join at {self.seconds} s: expected seconds >= 0")

    @classmethod
    def parse(cls, text: str) -> "JoinAt":
        """'20s', '20' (seconds), '500ms', or 'N%' of the budget."""
        from paramserver.core.units import parse_seconds
        raw = str(text).strip()
        if raw.endswith("%"):
            try:
                share = float(raw[:-1]) / 100
            except ValueError:
                raise ValueError(f"join at {text!r}: expected N% of the budget, e.g. "
                                 f"33%") from None
            return cls(share=share)
        return cls(seconds=parse_seconds(raw, "join time"))

    def text(self) -> str:
        return f"{self.share:.0%}" if self.share is not None else f"{self.seconds:g}s"

    def describe(self) -> str:
        return (f"after {self.seconds:g} s of training" if self.seconds is not None else
                f"at {self.share:.0%} of the budget")

    def due(self, trained_s: float, samples: int, max_samples: int | None,
            max_seconds: float | None) -> bool:
        """Whether the joiners go now: `trained_s` seconds trained and `samples` seen, of a
        run with budget `max_samples` (or `max_seconds`)."""
        if self.seconds is not None:
            return trained_s >= self.seconds
        if max_samples:
            return samples >= self.share * max_samples
        if max_seconds:
            return trained_s >= self.share * max_seconds
        return True  # no budget to take a share of: at the start


THIRD = JoinAt(share=1 / 3)  # compare's default: a third of the way through each run


# A variant's own pull settings (`--compress-variant bf16:pull=bf16:pull_refresh=50`): they
# replace --pull-compress and --pull-refresh for its runs; the other options are --compress's.
VARIANT_PULL = {"pull": "pull_compress", "pull_refresh": "pull_refresh"}


def variant_settings(options: dict, pull_compress: str, pull_refresh: int
                     ) -> tuple[dict, str, int]:
    """A variant's options into (--compress-opt options, its pull codec, its pull refresh),
    the pull settings defaulting to the base's."""
    rest = {k: v for k, v in options.items() if k not in VARIANT_PULL}
    return (rest, str(options.get("pull", pull_compress)),
            options.get("pull_refresh", pull_refresh))


def _per_variant(run: PlannedRun, variants: dict[str, tuple[str, dict]]) -> list[PlannedRun]:
    """`run` once per compression variant (the single-process reference stays one run)."""
    if run.policy == SINGLE:
        return [run]
    out = []
    for label, (name, options) in variants.items():
        policy = f"{run.policy}+{label}"
        opts, pull, refresh = variant_settings(options, run.config.pull_compress,
                                               run.config.pull_refresh)
        config = dataclasses.replace(run.config, compress=name, compress_options=opts,
                                     pull_compress=pull, pull_refresh=refresh)
        out.append(dataclasses.replace(run, policy=policy, config=config,
                                       folder=run.folder.parent.with_name(policy) / run.folder.name))
    return out


def plan_runs(base: TrainConfig, policies: list[str], scenarios: dict[str, tuple[str, str]],
              repeats: int, out: Path, single: bool = True,
              policy_options: dict[str, dict] | None = None,
              variants: dict[str, tuple[str, dict]] | None = None,
              policy_optimizers: dict[str, str] | None = None) -> list[PlannedRun]:
    """Every run of the comparison, in the order they will execute (repeats interleaved).

    With `variants` (label -> compressor, options) each policy runs once per variant, the
    row named POLICY+LABEL. `policy_optimizers` (policy -> update rule) gives those policies
    their own rule instead of the base's (with no rule options: they were the base rule's)."""
    if variants:
        return [v for r in plan_runs(base, policies, scenarios, repeats, out, single,
                                     policy_options, policy_optimizers=policy_optimizers)
                for v in _per_variant(r, variants)]
    runs = []
    for rep in range(repeats):
        for scenario, (straggler, _) in scenarios.items():
            for policy in [*policies, *([SINGLE] if single else [])]:
                if policy == SINGLE:
                    cfg = single_reference(dataclasses.replace(base, seed=base.seed + rep))
                else:
                    cfg = dataclasses.replace(
                        base, sync=policy, straggler=straggler, seed=base.seed + rep,
                        sync_options=dict((policy_options or {}).get(policy, {})))
                    rule = (policy_optimizers or {}).get(policy)
                    if rule is not None and rule != base.optimizer:
                        cfg = dataclasses.replace(cfg, optimizer=rule, optimizer_options={})
                folder = out / "runs" / scenario / policy / f"rep-{rep}"
                runs.append(PlannedRun(scenario, policy, rep, cfg, folder))
    return runs
