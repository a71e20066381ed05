"""Constant folding on the IR: an op whose inputs are all constants becomes constants."""

from __future__ import annotations

from collections.abc import Iterable

from .ir import Graph, Op


def fold_constant_ops(graph: Graph, candidates: Iterable[Op] | None = None) -> int:
    """Evaluate every candidate op (default: all) whose inputs are constant; returns how many folded."""
    from .kernels import FLOAT_KERNELS

    folded = 0
    for op in list(graph.ops if candidates is None else candidates):
        present = [name for name in op.inputs if name]
        if op.kind not in FLOAT_KERNELS or not all(graph.tensors[name].is_const for name in present):
            continue
        values = FLOAT_KERNELS[op.kind](op, [graph.tensors[name].data for name in present])
        for name, value in zip(op.outputs, values, strict=True):
            tensor = graph.tensors[name]
            tensor.data = value.astype(tensor.dtype, copy=False)
        graph.remove_op(op)
        folded += 1
    return folded
