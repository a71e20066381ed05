"""Static cost of an IR graph: parameters and floating-point operations per op."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .ir import Graph, Op

FlopsFn = Callable[[Graph, Op], int]


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _conv(g: Graph, op: Op) -> int:
    w = g.shape(op.inputs[1])  # (oc, ic/g, kh, kw)
    return 2 * _numel(g.shape(op.outputs[0])) * _numel(w[1:])


def _conv_transpose(g: Graph, op: Op) -> int:
    w = g.shape(op.inputs[1])  # (ic, oc/g, kh, kw)
    return 2 * _numel(g.shape(op.inputs[0])) * _numel(w[1:])


def _gemm(g: Graph, op: Op) -> int:
    a = g.shape(op.inputs[0])
    k = a[0] if op.attrs.trans_a else a[1]
    return 2 * _numel(g.shape(op.outputs[0])) * k


def _matmul(g: Graph, op: Op) -> int:
    return 2 * _numel(g.shape(op.outputs[0])) * g.shape(op.inputs[0])[-1]


def _pool(g: Graph, op: Op) -> int:
    return _numel(g.shape(op.outputs[0])) * op.attrs.kernel[0] * op.attrs.kernel[1]


def _per_input_element(g: Graph, op: Op) -> int:
    return _numel(g.shape(op.inputs[0]))


def _per_output_element(g: Graph, op: Op) -> int:
    return _numel(g.shape(op.outputs[0])) * max(len(op.inputs) - 1, 1)


FLOPS: dict[str, FlopsFn] = {
    "conv2d": _conv,
    "conv_transpose2d": _conv_transpose,
    "gemm": _gemm,
    "matmul": _matmul,
    "pool2d": _pool,
    "global_pool": _per_input_element,
    "eltwise": _per_output_element,
    "activation": _per_output_element,
    "prelu": _per_output_element,
    "channel_scale": lambda g, op: 2 * _numel(g.shape(op.outputs[0])),
    "softmax": lambda g, op: 5 * _numel(g.shape(op.outputs[0])),
    "lrn": lambda g, op: (op.attrs.size + 4) * _numel(g.shape(op.outputs[0])),
    "reduce": _per_input_element,
    "resize": lambda g, op: 4 * _numel(g.shape(op.outputs[0])),
}


def op_flops(graph: Graph, op: Op) -> int:
    """Floating-point operations of one op (a multiply-add counts 2); data movement counts 0."""
    fn = FLOPS.get(op.kind)
    return fn(graph, op) if fn else 0


def op_params(graph: Graph, op: Op) -> int:
    """Number of constant elements (weights, biases, tables) an op reads."""
    return sum(graph.tensors[n].size for n in op.inputs if n and graph.tensors[n].is_const)


def int8_flops_share(graph: Graph, float_names: set[str]) -> float:
    """The share of the graph's operations that stay int8 when the ops named in `float_names` (by op name or
    output tensor) run in the float fallback."""
    flops = {op.name: op_flops(graph, op) for op in graph.ops}
    total = sum(flops.values())
    kept = sum(f for op in graph.ops if op.name not in float_names and not set(op.outputs) & float_names
               for f in [flops[op.name]])  # fmt: skip
    return kept / total if total else 1.0
