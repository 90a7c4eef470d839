"""Per-layer request scheduling: in which order layer pushes go out and layer pulls are asked.

Pull orders (`--schedule`), given the order the last step's layer pushes went out (backward
order: the last layer first):
    fifo     the layer pushed first is pulled first (the last layer first)
    lifo     the layer pushed last is pulled first (the first layer first: what forward needs)
    stalest  the layer whose local copy is oldest first (ties: lifo); the worker judges age by
             the staleness its last push of the layer was acknowledged with

Pushes: of the layers whose gradients are ready together, a push that advances the minimum
per-layer step (its layer is among those pushed longest ago) goes first; the rest keep the
order backward produced them in.
"""

from __future__ import annotations

ORDERS = ("fifo", "lifo", "stalest")


def check_order(name: str) -> str:
    if name not in ORDERS:
        raise ValueError(f"unknown --schedule {name!r}; known: {', '.join(ORDERS)}, off")
    return name


def pull_order(order: str, pushed: list[int], fresh: list[int]) -> list[int]:
    """Layer indices in the order to pull them.

    `pushed`: layer indices in the order their pushes went out last step (every layer once);
    `fresh[i]`: how recent layer i's local values are (a step; lower is staler)."""
    check_order(order)
    lifo = list(reversed(pushed))
    if order == "fifo":
        return list(pushed)
    if order == "lifo":
        return lifo
    rank = {layer: i for i, layer in enumerate(lifo)}
    return sorted(lifo, key=lambda layer: (fresh[layer], rank[layer]))


def push_order(ready: list[int], pushed_at: list[int]) -> list[int]:
    """Ready layers, those that advance the minimum per-layer step first (stable otherwise).

    `pushed_at[i]`: the last step layer i was pushed at (-1: never)."""
    if not ready:
        return []
    low = min(pushed_at)
    return sorted(ready, key=lambda layer: pushed_at[layer] != low)
