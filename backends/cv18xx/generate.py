"""The TPU routine of a list of ops: each op (or layer group) through the kernel registered for its kind.

Importing the kernel package here registers every kernel; codegen.py holds the registry and the helpers the
kernels share, so the dependency runs one way: generate -> kernels -> codegen.
"""

from __future__ import annotations

from npuc.backends.cv18xx import kernels  # noqa: F401  (registers the kernels)
from npuc.backends.cv18xx.codegen import KERNELS, Codegen, no_kernel
from npuc.backends.cv18xx.reorder import place_unit
from npuc.compiler.coverage import per_op
from npuc.compiler.ir import Op


def generate(cg: Codegen, ops: list[Op]) -> None:
    """Each unit's local memory is placed where its first constant loads meet the oldest data of the units
    before it (reorder.LastTouch; groups shift their plan, other kernels are moved after emission), so those
    loads can run under the compute before it; among equals units alternate between bottom and top."""
    for index, op in enumerate(ops):
        cg.stream.layer = index + 1
        cg.top_aligned = index % 2 == 1
        with per_op(op):
            fn = KERNELS.get(op.kind)
            if fn is None:
                raise no_kernel(op, f"a {op.kind} op")
            start = len(cg.stream.records)
            fn(cg, op)
            if op.kind != "layer_group":  # a group places its own plan (group.py)
                cg.stream.touched.update(cg.stream.records, start)
                unit = cg.stream.records[start:]
                cg.stream.records[start:] = place_unit(unit, cg.chip, cg.stream.touched, cg.top_aligned)
