"""Global-memory plan of one program: where every activation tensor lives (specs/cv18xx.md §2.2).

- model inputs and outputs: one io region each (3, 4, ...; at most 5, the rest go to private memory);
- io tensors beyond the fifth: the private region;
- every other activation, CPU routine operands included: the shared region, where tensors whose lifetimes
  do not meet share bytes (placed largest first or first-fit in time, whichever needs less, 16-byte
  aligned: compiler/allocator.py place_blocks); a reshape's output is the same bytes as its input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npuc.backends.cv18xx.lmem import ALIGN, align
from npuc.compiler.allocator import place_blocks
from npuc.compiler.ir import Graph, Op

REGION_SHARED, REGION_PRIVATE, REGION_IO0 = 0, 2, 3
MAX_IO_REGIONS = 5
ELEMENT_BYTES = {"int8": 1, "uint8": 1, "bf16": 2, "float32": 4, "int32": 4}


@dataclass(frozen=True)
class Placement:
    region: int
    offset: int
    size: int


@dataclass
class MemoryPlan:
    places: dict[str, Placement] = field(default_factory=dict)
    shared_size: int = 0
    private_size: int = 0
    overwritten: set[str] = field(default_factory=set)  # tensors whose bytes a later tensor reuses


def tensor_bytes(graph: Graph, name: str, fmt: str) -> int:
    return int(np.prod(graph.shape(name), dtype=np.int64)) * ELEMENT_BYTES[fmt]


def plan_memory(
    graph: Graph,
    ops: list[Op],
    fmt: dict[str, str],
    io_tensors: list[str],
    private: list[str],
    aliases: dict[str, str],
) -> MemoryPlan:
    """Place the tensors of `ops` (in execution order). `fmt`: element format per tensor; `aliases`: tensor ->
    the tensor whose bytes it shares (reshape outputs)."""
    plan = MemoryPlan()

    def root(name: str) -> str:
        while name in aliases:
            name = aliases[name]
        return name

    private_top = 0
    for i, name in enumerate(io_tensors):
        size = tensor_bytes(graph, name, fmt[name])
        if i < MAX_IO_REGIONS:
            plan.places[name] = Placement(REGION_IO0 + i, 0, size)
        else:
            private.append(name)
    for name in private:
        if name in plan.places:
            continue
        size = tensor_bytes(graph, name, fmt[name])
        plan.places[name] = Placement(REGION_PRIVATE, private_top, size)
        private_top += align(size, ALIGN)
    plan.private_size = private_top

    last_use: dict[str, int] = {}
    for i, op in enumerate(ops):
        for name in [*op.inputs, *op.outputs]:
            if name and not graph.tensors[name].is_const:
                last_use[root(name)] = i
    defined: list[tuple[str, int]] = []  # (tensor, index of the op that makes it), in execution order
    for i, op in enumerate(ops):
        for out in op.outputs:
            r = root(out)
            if r in plan.places or out in plan.places:
                plan.places.setdefault(out, plan.places[r])
            elif r == out:
                defined.append((out, i))
    # an op's output never shares bytes with its inputs: both are live at its step
    blocks = [(tensor_bytes(graph, name, fmt[name]), i, max(i, last_use.get(name, i))) for name, i in defined]
    offsets, plan.shared_size = place_blocks(blocks, ALIGN)
    history: list[tuple[str, Placement, int]] = []  # (tensor, place, index of definition)
    for (name, i), (size, _, _), offset in zip(defined, blocks, offsets):
        plan.places[name] = Placement(REGION_SHARED, offset, size)
        history.append((name, plan.places[name], i))
    for op in ops:  # aliases of tensors placed above (reshape outputs)
        for out in op.outputs:
            if out not in plan.places and root(out) in plan.places:
                plan.places[out] = plan.places[root(out)]
    for j, (name, place, _) in enumerate(history):
        for _, oplace, _ in history[j + 1 :]:
            if oplace.offset < place.offset + place.size and place.offset < oplace.offset + oplace.size:
                plan.overwritten.add(name)
                break
    # every alias of a tensor shares its fate
    for name in list(plan.places):
        if root(name) in plan.overwritten:
            plan.overwritten.add(name)
    return plan
