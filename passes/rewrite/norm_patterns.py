"""Layer normalization exported as arithmetic (Paddle and older PyTorch exports), recognised back into one
`layer_norm` op so backends run one kernel instead of nine ops with a quantized variance in the middle:

    m = mean(x); d = x - m; v = mean(d^2); n = d / sqrt(v + eps)   [* gamma] [+ beta]

over a tail of axes, with d^2 as Pow(d, 2) or d * d and the division as Div or a multiply by Reciprocal.
Registered in the canonicalization pipeline (passes/rewrite/canonicalize.py).
"""

from __future__ import annotations

import numpy as np

from npuc.compiler import ops
from npuc.compiler.ir import Graph, Op
from npuc.passes.rewrite.rewrites import rewrite


class _Chain:
    """Walks single-user links from a tensor, collecting the ops passed."""

    def __init__(self, graph: Graph, consumers: dict[str, list[Op]]) -> None:
        self.graph = graph
        self.consumers = consumers
        self.ops: list[Op] = []

    def users(self, name: str) -> list[Op]:
        """The distinct ops reading `name` (none for a graph output: it must keep its value)."""
        if name in self.graph.outputs:
            return []
        return list({id(op): op for op in self.consumers.get(name, [])}.values())

    def next(self, name: str, kind: str, sub: str | None = None) -> Op | None:
        """The one op reading `name`, if it has that kind (and eltwise/activation sub-kind)."""
        users = self.users(name)
        if len(users) != 1 or not _is(users[0], kind, sub):
            return None
        self.ops.append(users[0])
        return users[0]

    def scalar(self, name: str) -> float | None:
        data = self.graph.const(name)
        return float(np.asarray(data).reshape(-1)[0]) if data is not None and data.size == 1 else None


def _is(op: Op, kind: str, sub: str | None) -> bool:
    if op.kind != kind or getattr(op.attrs, "act", None) and kind != "activation":
        return False
    if sub is None:
        return True
    return (op.attrs.kind if kind == "eltwise" else op.attrs.act.kind) == sub


def _other(op: Op, name: str) -> str:
    return op.inputs[1] if op.inputs[0] == name else op.inputs[0]


def _affine(graph: Graph, chain: _Chain, name: str, kind: str, normalized: tuple[int, ...]) -> np.ndarray | None:
    """The constant of an optional `name * gamma` / `+ beta` step, broadcast to the normalized shape."""
    users = chain.users(name)
    if len(users) != 1 or not _is(users[0], "eltwise", kind) or len(users[0].inputs) != 2:
        return None
    data = graph.const(_other(users[0], name))
    if data is None or graph.const(name) is not None:
        return None
    data = np.asarray(data, np.float32)
    while data.ndim > len(normalized) and data.shape[0] == 1:
        data = data[0]
    try:
        value = np.broadcast_to(data, normalized)
    except ValueError:
        return None
    if data.ndim > len(normalized) or value.shape != normalized:
        return None
    chain.ops.append(users[0])
    return np.ascontiguousarray(value)


Match = tuple[list[Op], str, float, np.ndarray | None, np.ndarray | None]


def _match(graph: Graph, consumers: dict[str, list[Op]], mean: Op) -> Match | None:
    """(the chain's ops, x, epsilon, gamma, beta) of the layer norm starting at reduce-mean `mean`."""
    x, shape = mean.inputs[0], graph.shape(mean.inputs[0])
    rank = len(shape)
    axes = tuple(sorted(a % rank for a in mean.attrs.axes))
    if mean.attrs.kind != "mean" or not mean.attrs.keepdims or axes != tuple(range(rank - len(axes), rank)):
        return None
    chain = _Chain(graph, consumers)
    chain.ops.append(mean)
    sub = chain.next(mean.outputs[0], "eltwise", "sub")
    if sub is None or sub.inputs != [x, mean.outputs[0]]:
        return None
    centred = sub.outputs[0]
    users = chain.users(centred)
    if len(users) != 2:
        return None
    square = next((u for u in users if _is(u, "eltwise", "mul") and u.inputs == [centred, centred]), None)
    square = square or next((u for u in users if _is(u, "eltwise", "pow") and chain.scalar(u.inputs[1]) == 2.0), None)
    divide = next((u for u in users if u is not square), None)
    if square is None or divide is None:
        return None
    chain.ops.append(square)
    var = chain.next(square.outputs[0], "reduce")
    if var is None or (var.attrs.kind, var.attrs.keepdims) != ("mean", True):
        return None
    if tuple(sorted(a % rank for a in var.attrs.axes)) != axes:
        return None
    shifted = chain.next(var.outputs[0], "eltwise", "add")
    eps = chain.scalar(_other(shifted, var.outputs[0])) if shifted is not None else None
    std = chain.next(shifted.outputs[0], "activation", "sqrt") if eps is not None else None
    if std is None:
        return None
    if _is(divide, "eltwise", "div") and divide.inputs == [centred, std.outputs[0]]:
        chain.ops.append(divide)
    else:
        inverse = chain.next(std.outputs[0], "activation", "reciprocal")
        if inverse is None or not _is(divide, "eltwise", "mul") or _other(divide, centred) != inverse.outputs[0]:
            return None
        chain.ops.append(divide)
    normalized = tuple(shape[rank - len(axes) :])
    gamma = _affine(graph, chain, divide.outputs[0], "mul", normalized)
    beta = _affine(graph, chain, chain.ops[-1].outputs[0], "add", normalized)
    inner = {o for op in chain.ops[:-1] for o in op.outputs}
    if inner & set(graph.outputs) or graph.const(x) is not None:
        return None
    return chain.ops, x, eps, gamma, beta


@rewrite("recognize_layer_norm")
def recognize_layer_norm(graph: Graph) -> int:
    fired = 0
    consumers = graph.consumers()  # rebuilt only after a rewrite: the scan stays linear in the graph
    for mean in list(graph.iter_ops("reduce")):
        if mean not in graph.ops:
            continue
        found = _match(graph, consumers, mean)
        if found is None:
            continue
        chain, x, eps, gamma, beta = found
        shape = graph.shape(x)
        normalized = tuple(shape[len(shape) - len(mean.attrs.axes) :])
        scale, shift = (graph.unique_name(f"{chain[-1].outputs[0]}_{n}") for n in ("gamma", "beta"))
        graph.add_const(scale, np.ones(normalized, np.float32) if gamma is None else gamma)
        graph.add_const(shift, np.zeros(normalized, np.float32) if beta is None else beta)
        index = graph.ops.index(mean)
        for op in chain:
            graph.remove_op(op)
        attrs = ops.LayerNorm(len(shape) - len(normalized), eps)
        graph.ops.insert(index, Op(mean.name, "layer_norm", [x, scale, shift], [chain[-1].outputs[0]], attrs))
        consumers = graph.consumers()
        fired += 1
    return fired
