"""torch's own optimizers as server update rules: each shard runs the optimizer's implementation
over its slice of each parameter group, not a copy of its math.

A shard is one flat tensor; a torch optimizer wants parameters. For every apply the rule hands
the optimizer views of the shard (one per piece of a parameter group inside the pushed range)
with their gradients, and binds the optimizer's per-element state (Adam's `exp_avg`, SGD's
`momentum_buffer`, ...) to views of shard-sized state tensors, so the optimizer updates values
and state in place. Those tensors live in the store's `state` like any rule's, so checkpoints,
replicas and resharding carry them key by key. torch keeps one step count per parameter; the
shard keeps one per key (`state["step"]`), and pieces whose keys have stepped a different number
of times (a range push of one layer) are stepped as separate parameters, as torch would. Keys
a push or round says got no gradient (`idle`, server/idle_keys.py) are left out of the step,
as torch leaves out a parameter whose grad is None: their values, state and counts stay.

A piece that has never stepped is left to the optimizer's own first-step initialisation (SGD's
momentum buffer is the first gradient, Adagrad's sum its initial value), then copied into the
shard's state. `groups` gives each group's key ranges (global keys) and the settings that
differ from the rule's; keys outside every group follow the rule's own settings. Staleness is
not used: pair a torch optimizer with a sync policy, not a staleness rule. Pure: no I/O.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, ClassVar

import torch

from paramserver.core.keyspace import clip_runs, subtract_runs, union_runs
from paramserver.core.words import did_you_mean
from paramserver.optim.base import Index, UpdateRule

# Constructor arguments that are not the optimizer's math (or are this rule's to decide).
_NOT_OPTIONS = {"self", "params", "lr", "foreach", "capturable", "differentiable", "fused"}


@functools.cache
def _torch_options(cls: type) -> dict:
    # (read on every retune, i.e. every push once a schedule moved: read from the signature
    # once per class)
    sig = inspect.signature(cls.__init__)
    return {n: (None if p.default is inspect.Parameter.empty else p.default,
                f"torch.optim.{cls.__name__}'s {n}")
            for n, p in sig.parameters.items() if n not in _NOT_OPTIONS}


def _plain(name: str, value: Any, default: Any) -> Any:
    """A JSON list, or a flag's "0.9,0.99", as the tuple torch takes where its default is one
    (Adam's betas, Rprop's etas); text where the default is a number is refused."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(default, tuple) and isinstance(value, str):
        try:
            return tuple(float(x) for x in value.split(","))
        except ValueError:
            raise ValueError(f"option {name} takes numbers separated by commas, e.g. "
                             f"{','.join(map(str, default))}; got {value!r}") from None
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ValueError(f"option {name} takes true or false (default "
                         f"{str(default).lower()}); got {value!r}")
    if isinstance(default, (int, float)) and not isinstance(default, bool) \
            and isinstance(value, str):
        raise ValueError(f"option {name} takes a number (default {default}); got {value!r}")
    return value


class TorchRule(UpdateRule):
    """An update rule running `torch_class` (a torch.optim.Optimizer) on the shard."""

    torch_class: ClassVar[type[torch.optim.Optimizer]]
    linear_in_grad = False
    sparse_keys = False
    skips_idle = True

    def __init__(self, lr: float, groups: list | None = None, staleness: str = "none",
                 global_rate: float = 1.0, **options):
        super().__init__(lr)
        # A staleness rule composed with the optimizer: it scales every group's lr by how
        # stale each push is (DynSGD 1/(s+1), staleness-aware 1/max(s,1), ConSGD a constant).
        if staleness not in STALENESS_RULES:
            raise ValueError(f"staleness must be one of {', '.join(STALENESS_RULES)}; got "
                             f"{staleness!r}")
        if not global_rate > 0 or (global_rate != 1.0 and staleness != "consgd"):
            raise ValueError("global_rate is consgd's (staleness=consgd), a number > 0")
        self.staleness, self.global_rate = staleness, float(global_rate)
        self.staleness_aware = staleness != "none"
        self._check(options, f"--optimizer {self.name}")
        self.options_given = self._plain(options)
        self.groups: list[tuple[list[tuple[int, int]], dict]] = []
        # Keys no group of the script's optimizer holds, or whose parameter needs no grad:
        # never given to the optimizer, as torch never steps them (values, state and step
        # counts stay). The last group, marked `frozen`, names them.
        self.frozen: list[tuple[int, int]] = []
        groups = list(groups or [])
        for i, g in enumerate(groups):
            if not isinstance(g, dict) or not isinstance(g.get("ranges"), list):
                raise ValueError(f"{self.name} group {i} must be a dict with 'ranges' "
                                 f"[[lo, hi], ...]; got {g!r}")
            ranges = []
            for r in g["ranges"]:
                if (not isinstance(r, (list, tuple)) or len(r) != 2
                        or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                        or not 0 <= r[0] < r[1]):
                    raise ValueError(f"{self.name} group {i}: a key range is [lo, hi) with "
                                     f"0 <= lo < hi; got {r!r}")
                ranges.append((r[0], r[1]))
            if "frozen" in g:
                if g != {"ranges": g["ranges"], "frozen": True} or i != len(groups) - 1:
                    raise ValueError(f"{self.name} group {i}: a frozen group is the last one "
                                     f"and holds only its ranges and 'frozen': true; got {g!r}")
                self.frozen = union_runs(ranges, [])
                continue
            settings = {k: v for k, v in g.items() if k != "ranges"}
            self._check(settings, f"{self.name} group {i}", allow_lr=True)
            settings = self._plain(settings)
            self.groups.append((ranges, settings))
        self._lo, self._hi = 0, None
        self._frozen_here: list[tuple[int, int]] = []  # frozen, as local keys (bind)
        self._runs: list | None = None  # (a, b, times stepped) over the shard's keys
        # What each group's optimizer keeps per element, found by stepping it once on a
        # two-element probe (the options decide: momentum 0 keeps no buffer).
        self._keeps = [self._state_keys(self._settings(g)) for g in range(len(self.groups) + 1)]
        self._per_element = sorted(set().union(*(k for k, _ in self._keeps)))

    # ---- settings ---------------------------------------------------------------------------
    @classmethod
    def torch_options(cls) -> dict:
        """name -> (default, help) of the torch optimizer's own options."""
        return _torch_options(cls.torch_class)

    @classmethod
    def option_help(cls) -> dict:
        """The torch optimizer's options, and the staleness rule composed with it."""
        return {**cls.torch_options(),
                "staleness": ("none", f"scale every lr by a staleness rule: "
                                      f"{', '.join(STALENESS_RULES)}"),
                "global_rate": (1.0, "consgd's constant rate (staleness=consgd)")}

    def _check(self, settings: dict, what: str, allow_lr: bool = False) -> None:
        known = list(self.torch_options()) + (["lr"] if allow_lr else [])
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ValueError(f"{what}: torch.optim.{self.torch_class.__name__} has no option "
                             f"{unknown[0]!r}; its options: {', '.join(known)}"
                             f"{did_you_mean(unknown[0], known)}")

    def _plain(self, settings: dict) -> dict:
        defaults = {k: d for k, (d, _) in self.torch_options().items()}
        return {k: _plain(k, v, defaults.get(k)) for k, v in settings.items()}

    def _settings(self, group: int) -> dict:
        """What group `group` sets beyond the constructor's (len(groups): the keys outside
        every group, which take the constructor's own)."""
        return self.groups[group][1] if group < len(self.groups) else {}

    def _optimizer(self, groups: list[dict], factor: float = 1.0) -> torch.optim.Optimizer:
        # The rule's settings go to the constructor, as a user's script passes them: some
        # are read there only (Adagrad's initial accumulator, SGD's nesterov check).
        return self.torch_class(groups, lr=self.lr * factor, **self.options_given)

    def _factor(self, staleness: int) -> float:
        """What the composed staleness rule makes of every lr for a push `staleness` old."""
        rule = self.staleness
        if rule == "dynsgd":
            return 1.0 / (staleness + 1)
        if rule == "staleness-aware":
            return 1.0 / max(staleness, 1)
        return self.global_rate if rule == "consgd" else 1.0

    def _group(self, views: list, g: int, factor: float) -> dict:
        settings = self._settings(g)
        if factor != 1.0 and "lr" in settings:
            settings = {**settings, "lr": settings["lr"] * factor}
        return {"params": views, **settings}

    def _state_keys(self, settings: dict) -> tuple[list[str], bool]:
        probe = torch.zeros(2)
        try:
            opt = self._optimizer([{"params": [probe], **settings}])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"torch.optim.{self.torch_class.__name__}: {exc}") from None
        probe.grad = torch.ones(2)
        opt.step()
        state = opt.state[probe]
        keys = [k for k, v in state.items()
                if isinstance(v, torch.Tensor) and v.shape == probe.shape]
        return keys, "step" in state

    def retune(self, groups: list) -> None:
        """The script's groups' settings as its schedule left them: [[group, {name: value}],
        ...]. A change of what the optimizer keeps per key (SGD's momentum from 0) is refused:
        the shard's state has no room for it."""
        if not isinstance(groups, list):
            raise ValueError(f"settings for groups must be a list, got {type(groups).__name__}")
        for item in groups:
            if (not isinstance(item, (list, tuple)) or len(item) != 2
                    or not isinstance(item[0], int) or isinstance(item[0], bool)
                    or not 0 <= item[0] < len(self.groups) or not isinstance(item[1], dict)):
                raise ValueError(f"a group's settings are [group 0..{len(self.groups) - 1}, "
                                 f"{{name: value}}]; got {item!r}")
            g, given = item
            self._check(given, f"{self.name} group {g}", allow_lr=True)
            ranges, settings = self.groups[g]
            new = {**settings, **self._plain(given)}
            if new == settings:
                continue
            # What a group keeps per key turns on settings being zero or not (momentum,
            # amsgrad, centered): only such a flip is checked against a probe.
            base = {**{k: d for k, (d, _) in self.torch_options().items()},
                    **self._rule_settings()}
            before, after = {**base, **settings}, {**base, **new}
            if any(bool(after[k]) != bool(before[k]) for k in after):
                keeps = self._state_keys(after)
                if keeps != self._keeps[g]:
                    raise ValueError(f"{self.name} group {g}: {given} changes what the "
                                     f"optimizer keeps per key ({keeps[0]} against "
                                     f"{self._keeps[g][0]}); the servers cannot follow")
            self.groups[g] = (ranges, new)

    def _rule_settings(self) -> dict:
        return {"lr": self.lr, **self.options_given}

    def options(self) -> dict:
        out = {"lr": self.lr, **self.options_given}
        if self.staleness != "none":
            out["staleness"] = self.staleness
            if self.staleness == "consgd":
                out["global_rate"] = self.global_rate
        if self.groups or self.frozen:
            out["groups"] = [{"ranges": [list(r) for r in ranges], **s}
                             for ranges, s in self.groups]
            if self.frozen:
                out["groups"].append({"ranges": [list(r) for r in self.frozen], "frozen": True})
        return out

    # ---- the shard ------------------------------------------------------------------------------
    def bind(self, lo: int, hi: int) -> None:
        self._lo, self._hi = lo, hi
        self._frozen_here = clip_runs(self.frozen, lo, hi, lo)

    def init_state(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        state = {k: torch.zeros_like(params) for k in self._per_element}
        state["step"] = torch.zeros(len(params), dtype=torch.float32)
        self._runs = [(0, len(params), 0)]
        return state

    def state_loaded(self) -> None:
        self._runs = None  # read again from state["step"] at the next apply

    def _step_runs(self, steps: torch.Tensor, start: int, stop: int) -> list:
        """(a, b, times stepped) of the keys [start, stop), from the runs of equal step
        counts this rule keeps beside state["step"] (one pass over it only after a load)."""
        if self._runs is None:
            counts, sizes = torch.unique_consecutive(steps, return_counts=True)
            runs, at = [], 0
            for n, size in zip(counts.tolist(), sizes.tolist()):
                runs.append((at, at + size, int(n)))
                at += size
            self._runs = runs
        return [(max(a, start), min(b, stop), n) for a, b, n in self._runs
                if a < stop and start < b]

    def _stepped(self, start: int, stop: int) -> None:
        """Keys [start, stop) have stepped once more: the runs split and merge to match."""
        out: list = []
        for a, b, n in self._runs:
            parts = [(a, b, n)] if b <= start or stop <= a else [
                (a, start, n), (max(a, start), min(b, stop), n + 1), (stop, b, n)]
            for p in parts:
                if p[0] >= p[1]:
                    continue
                if out and out[-1][1] == p[0] and out[-1][2] == p[2]:
                    out[-1] = (out[-1][0], p[1], p[2])
                else:
                    out.append(p)
        self._runs = out

    def keyed(self, name: str, tensor: torch.Tensor, params: torch.Tensor) -> bool:
        # (step counts stay float32 whatever the values' dtype: float16 counts only to 2048)
        return name == "step" or super().keyed(name, tensor, params)

    def _pieces(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(a, b, group) covering local keys [start, stop), in key order."""
        lo = self._lo
        marks: list[tuple[int, int, int]] = []
        for g, (ranges, _) in enumerate(self.groups):
            for a, b in ranges:
                a, b = max(a - lo, start), min(b - lo, stop)
                if a < b:
                    marks.append((a, b, g))
        marks.sort()
        pieces, at, rest = [], start, len(self.groups)
        for a, b, g in marks:
            if a > at:
                pieces.append((at, a, rest))
            pieces.append((max(a, at), b, g))
            at = max(at, b)
        if at < stop:
            pieces.append((at, stop, rest))
        return [p for p in pieces if p[0] < p[1]]

    def apply(self, params: torch.Tensor, index: Index, grad: torch.Tensor,
              state: dict[str, torch.Tensor], staleness: int, scale: float = 1.0,
              worker: str = "", idle: list | None = None) -> None:
        if not isinstance(index, slice):
            raise ValueError(f"--optimizer {self.name} updates dense and range pushes; sparse "
                             f"keys go to a table (its own optimizer) or to --optimizer sgd")
        start, stop, _ = index.indices(len(params))
        # Keys that got no gradient are not given to the optimizer at all, as torch skips a
        # parameter whose grad is None: their values, state and step counts stay.
        spans = [(start, stop)] if not idle else subtract_runs([(start, stop)], idle)
        if self._frozen_here:
            spans = subtract_runs(spans, self._frozen_here)
        steps = state["step"]
        groups: dict[int, list] = {}
        bound: list[tuple] = []  # (view, a, b, group, times stepped)
        for lo, hi in spans:
            for a, b, g in self._pieces(lo, hi):
                for ra, rb, n in self._step_runs(steps, a, b):
                    view = params[ra:rb]
                    view.grad = grad[ra - start:rb - start]
                    groups.setdefault(g, []).append(view)
                    bound.append((view, ra, rb, g, n))
        if not bound:
            return
        # A push's weight (auto's arrival stretches: a round's share; R2SP's batch) scales
        # its lr, as a staleness rule's factor does: torch's steps are not linear in the
        # gradient (Adam's normalises a scaled one back), so a scaled gradient would step as
        # far as a whole one.
        factor = self._factor(staleness) * scale
        opt = self._optimizer([self._group(views, g, factor) for g, views in groups.items()],
                              factor)
        for view, a, b, g, n in bound:
            if n == 0:
                continue  # the optimizer's own first step initialises it
            keys, has_step = self._keeps[g]
            st = opt.state[view]
            for k in keys:
                st[k] = state[k][a:b]
            if has_step:
                st["step"] = torch.tensor(float(n))
        opt.step()
        for view, a, b, g, n in bound:
            st = opt.state[view]
            for k in self._keeps[g][0]:
                whole = state[k][a:b]
                if st[k].data_ptr() != whole.data_ptr():
                    whole.copy_(st[k])
            view.grad = None
        for lo, hi in spans:
            steps[lo:hi] += 1
            self._stepped(lo, hi)


def torch_rule(name: str, cls: type[torch.optim.Optimizer]) -> type[TorchRule]:
    """The TorchRule class of torch optimizer `cls`, registered as `name`."""
    return type(f"Torch{cls.__name__}", (TorchRule,), {
        "name": name, "torch_class": cls,
        "__doc__": f"torch.optim.{cls.__name__}, run by each shard on its keys."})


# Staleness rules a torch optimizer composes with (optim/staleness.py's, scaling its lr).
STALENESS_RULES = ("none", "dynsgd", "consgd", "staleness-aware")

# name -> torch class: the optimizers a job may run on its servers.
TORCH_OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
                    "adagrad": torch.optim.Adagrad, "rmsprop": torch.optim.RMSprop,
                    "adamax": torch.optim.Adamax, "torch-sgd": torch.optim.SGD}
