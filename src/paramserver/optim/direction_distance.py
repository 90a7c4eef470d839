"""The seed's split of a gradient into direction and distance, distances rescaled per push."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paramserver.optim.adagrad_global import merge_keys
from paramserver.optim.base import Index, UpdateRule
from paramserver.core.options import Configurable, check_choice, check_int, check_range, opt


@dataclass(frozen=True)
class DirectionDistanceOptions:
    alpha: str = opt("equal", "distance weights alpha_c: equal (1 each) or staleness "
                              "(1 / (staleness + 1) of the worker's latest push)")
    refresh: int = opt(1000, "pushes between exact recomputations of the running sums")
    eps: float = opt(1e-12, "norms below this count as zero")

    def __post_init__(self):
        check_choice("alpha", self.alpha, ("equal", "staleness"))
        check_int("refresh", self.refresh, 1)
        check_range("eps", self.eps, 0, lo_open=True)


class DirectionDistance(UpdateRule, Configurable):
    """Each push g_c becomes direction g_c/|g_c| times a distance t * alpha_c, where

        t * | sum_c alpha_c g_c / |g_c| | = | sum_c g_c |

    over the latest gradient g_c of every worker c (seed 001). Interpretation: the distances
    are rescheduled so that the workers' latest gradients, each reduced to alpha_c times its
    direction, still add up to a vector as long as their plain sum; with equal alphas every
    worker moves the parameters by the same distance whatever its gradient's size, while the
    total length is kept. A lone worker (or an aggregated round) gets plain SGD.

    State per shard: each worker's latest gradient (a push overwrites the keys it carries, so
    range pushes of one step assemble), its norm and alpha, and the running sums S = sum g_c
    and D = sum alpha_c g_c / |g_c|, recomputed exactly every `refresh` pushes against drift.
    Memory (N + 2) x shard values; time O(shard) per push, whatever N.
    """

    name = "direction-distance"
    Options = DirectionDistanceOptions

    def __init__(self, lr: float, alpha: str = "equal", refresh: int = 1000, eps: float = 1e-12):
        super().__init__(lr)
        self.opts = DirectionDistanceOptions(alpha, refresh, eps)

    def init_state(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        zeros = torch.zeros_like(params)
        return {"dd/sum": zeros, "dd/dirsum": zeros.clone(),
                "dd/pushes": torch.zeros(1, dtype=torch.int64)}

    def apply(self, params, index: Index, grad, state, staleness, scale=1.0, worker=""):
        if isinstance(index, slice):
            keys, values = index, grad
        else:
            keys, values = merge_keys(index, grad)
        latest = self._latest(state, worker, params)
        self._retract(state, worker, latest)
        state["dd/sum"][keys] += values - latest[keys]
        latest[keys] = values
        alpha = 1.0 if self.opts.alpha == "equal" else 1.0 / (staleness + 1)
        norm = self._admit(state, worker, latest, alpha)
        if norm <= self.opts.eps:
            return
        state["dd/pushes"] += 1
        if int(state["dd/pushes"]) % self.opts.refresh == 0:
            self._recompute(state)
        dirsum = float(torch.linalg.vector_norm(state["dd/dirsum"]))
        if dirsum > self.opts.eps:
            t = float(torch.linalg.vector_norm(state["dd/sum"])) / dirsum
        else:  # the directions cancel out: t is undefined, take the plain step
            t = norm / alpha
        step = -self.lr * scale * t * alpha / norm
        if isinstance(keys, slice):
            params[keys].add_(values, alpha=step)
        else:
            params.index_add_(0, keys, values, alpha=step)

    @staticmethod
    def _latest(state: dict, worker: str, params: torch.Tensor) -> torch.Tensor:
        key = f"dd/latest/{worker}"
        if key not in state:
            state[key] = torch.zeros_like(params)
            state[f"dd/scalars/{worker}"] = torch.zeros(2, dtype=torch.float64)  # norm, alpha
        return state[key]

    @staticmethod
    def _retract(state: dict, worker: str, latest: torch.Tensor) -> None:
        """Take the worker's previous direction out of D before its latest gradient changes."""
        norm, alpha = state[f"dd/scalars/{worker}"].tolist()
        if norm > 0:
            state["dd/dirsum"].add_(latest, alpha=-alpha / norm)

    def _admit(self, state: dict, worker: str, latest: torch.Tensor, alpha: float) -> float:
        norm = float(torch.linalg.vector_norm(latest))
        if norm <= self.opts.eps:
            norm = 0.0
        else:
            state["dd/dirsum"].add_(latest, alpha=alpha / norm)
        state[f"dd/scalars/{worker}"][:] = torch.tensor([norm, alpha], dtype=torch.float64)
        return norm

    @staticmethod
    def _recompute(state: dict) -> None:
        total, dirsum = state["dd/sum"], state["dd/dirsum"]
        total.zero_()
        dirsum.zero_()
        for key, latest in state.items():
            if key.startswith("dd/latest/"):
                norm, alpha = state["dd/scalars/" + key[len("dd/latest/"):]].tolist()
                total.add_(latest)
                if norm > 0:
                    dirsum.add_(latest, alpha=alpha / norm)

    def options(self) -> dict:
        return {"lr": self.lr, **{k: getattr(self.opts, k) for k in ("alpha", "refresh", "eps")}}
