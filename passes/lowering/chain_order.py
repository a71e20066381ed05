"""A schedule that keeps chains together: each op as soon after its producer as the dependencies allow.

Layer groups are contiguous runs of the schedule (layer_group.py). Exporters often interleave independent
branches (YOLOv8's head lists the convs of three branches, then their three sigmoids, then their three
multiplies), so no run of one branch is contiguous and every tensor goes through DDR. `chain_order` is a
topological order that follows each op by its consumers, depth first, in the original order among equals; a
schedule that already does so comes back unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _Op(Protocol):
    inputs: list[str]
    outputs: list[str]


def chain_order(ops: Sequence[_Op]) -> list[_Op]:
    """`ops` (a topological order) reordered depth first along producer -> consumer edges."""
    producer = {name: i for i, op in enumerate(ops) for name in op.outputs if name}
    deps = [{producer[n] for n in op.inputs if n in producer and producer[n] != i} for i, op in enumerate(ops)]
    consumers: list[list[int]] = [[] for _ in ops]
    for i, mine in enumerate(deps):
        for d in sorted(mine):
            consumers[d].append(i)
    waiting = [len(mine) for mine in deps]
    done = [False] * len(ops)
    order: list[int] = []

    def emit(start: int) -> None:
        stack = [start]
        while stack:
            i = stack.pop()
            if done[i]:
                continue
            done[i] = True
            order.append(i)
            ready = []
            for c in consumers[i]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.append(c)
            stack.extend(reversed(ready))  # the first consumer in the original order runs next

    for i in range(len(ops)):
        if not done[i] and waiting[i] == 0:
            emit(i)
    if len(order) != len(ops):
        raise ValueError("chain_order: the ops are not a topological order")
    return [ops[i] for i in order]
