"""Which of a script's parameters got no gradient since its last zero_grad(): the keys a push
names `idle`, which the servers' torch rule leaves out of the step.

torch's optimizers skip a parameter whose `.grad` is None: an unused branch, an auxiliary head
trained on some steps only, DDP's `find_unused_parameters=True` case keep their moments, step
counts and weight decay as they were. Here every `.grad` is a view of the flat gradient buffer
(models/flat_binding.py), zeroed, never None, so an unused parameter would be pushed as zeros
and stepped. A hook on each trainable parameter (`register_post_accumulate_grad_hook`, which
runs once its gradient is accumulated in a backward) marks it used; zero_grad() clears the
marks. Hooks stand beside DeviceStaging's (its own, on cuda, copy each finished layer): each
only marks or counts, neither changes the gradient.

Only a DistributedOptimizer wrapping the script's torch optimizer builds this (the servers then
run that optimizer's rule); a job of the servers' own rule hooks nothing.
"""

from __future__ import annotations

from torch import nn

from paramserver.models import ModelKeys


class IdleParams:
    """Marks, per step, the trainable parameters a backward reached; their complement's keys."""

    def __init__(self, model: nn.Module, keys: ModelKeys, trains: tuple[bool, ...]):
        """`trains`: which of model.parameters() train (a frozen one is the servers' lr 0
        group already, and takes no hook: it needs no grad)."""
        pairs = [(p, (slot.keys.lo, slot.keys.hi))
                 for p, slot, t in zip(model.parameters(), keys.params, trains)
                 if t and slot.keys.size]  # (an empty parameter has no keys to name)
        self.params = [p for p, _ in pairs]
        self.ranges = [r for _, r in pairs]
        self.got = [False] * len(self.params)
        self._none = list(self.got)
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._mark(i))

    def _mark(self, i: int):
        got = self.got

        def hook(_param) -> None:
            got[i] = True
        return hook

    def zeroed(self) -> None:
        """A new step's gradients begin: none reached yet."""
        self.got[:] = self._none

    def runs(self, bound: bool, grads=None) -> list[list[int]] | None:
        """The keys of the trainable parameters that got no gradient since zeroed(), as sorted
        runs with touching ones joined; None when every one got one. `bound`: every .grad is
        still its view of the flat buffer `grads`; when not (the script set them to None and
        backward made new ones, flatten_grads gathers them), a parameter whose .grad is None
        got none, and so did one still bound that no backward reached."""
        got = self.got
        if bound:
            if all(got):
                return None
            idle = [r for r, g in zip(self.ranges, got) if not g]
        else:
            lo = grads.data_ptr()
            hi = lo + grads.numel() * grads.element_size()
            idle = [r for r, p, g in zip(self.ranges, self.params, got)
                    if p.grad is None or not g and lo <= p.grad.data_ptr() < hi]
            if not idle:
                return None
        out: list[list[int]] = []
        for a, b in idle:  # (in key order: parameters are laid out in order)
            if out and out[-1][1] == a:
                out[-1][1] = b
            else:
                out.append([a, b])
        return out
