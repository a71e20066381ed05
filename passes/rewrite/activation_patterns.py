"""Activations exported as arithmetic, recognised back into one activation op: hard-sigmoid, hard-swish (both
spellings) and GELU (erf form). Registered in the canonicalization pipeline (passes/rewrite/canonicalize.py)."""

from __future__ import annotations

import math

import numpy as np

from npuc.compiler import ops
from npuc.compiler.ir import Graph, Op
from npuc.passes.rewrite.rewrites import rewrite, sole_user


def _scalar(graph: Graph, name: str) -> float | None:
    data = graph.const(name)
    if data is None or data.size != 1:
        return None
    return float(np.asarray(data).reshape(-1)[0])


def _eltwise_with_const(graph: Graph, op: Op | None, kind: str) -> tuple[str, float] | None:
    """For eltwise `kind` of a tensor and a scalar constant: (tensor, scalar)."""
    if op is None or op.kind != "eltwise" or op.attrs.kind != kind or op.attrs.act or len(op.inputs) != 2:
        return None
    a, b = op.inputs
    if _scalar(graph, b) is not None and graph.const(a) is None:
        return a, _scalar(graph, b)
    if kind in ("add", "mul") and _scalar(graph, a) is not None and graph.const(b) is None:
        return b, _scalar(graph, a)
    return None


def _replace_with_activation(graph: Graph, first: Op, last: Op, x: str, act: ops.Activation) -> None:
    """Replace the chain first..last (last's output kept) by one activation op reading x."""
    index = graph.ops.index(first)
    out = last.outputs[0]
    graph.remove_op(last)
    graph.ops.insert(index, Op(last.name, "activation", [x], [out], ops.ActivationOp(act)))


def _only(users: list[Op]) -> Op | None:
    return users[0] if len(users) == 1 else None


def _scalar_operand(graph: Graph, op: Op) -> float | None:
    for name in op.inputs:
        value = _scalar(graph, name)
        if value is not None:
            return value
    return None


@rewrite("recognize_hard_sigmoid")
def recognize_hard_sigmoid(graph: Graph) -> int:
    """clip(x + c, 0, h) / h (or * 1/h) is hard_sigmoid(x; alpha=1/h, beta=c/h)."""
    fired = 0
    producers = graph.producers()
    for op in list(graph.ops):
        scaled = _eltwise_with_const(graph, op, "div") or _eltwise_with_const(graph, op, "mul")
        if scaled is None:
            continue
        clipped, k = scaled
        divisor = k if op.attrs.kind == "div" else (1.0 / k if k else 0.0)
        clip = producers.get(clipped)
        if clip is None or clip.kind != "activation" or clip.attrs.act.kind != "clip":
            continue
        act = clip.attrs.act
        if act.lo != 0.0 or not math.isclose(act.hi, divisor, rel_tol=1e-6) or sole_user(graph, clipped) is not op:
            continue
        add = producers.get(clip.inputs[0])
        shifted = _eltwise_with_const(graph, add, "add")
        if shifted is None or sole_user(graph, clip.inputs[0]) is not clip:
            continue
        x, c = shifted
        graph.remove_op(clip)
        graph.remove_op(add)
        _replace_with_activation(
            graph, op, op, x, ops.Activation("hard_sigmoid", alpha=1.0 / divisor, beta=c / divisor)
        )
        producers = graph.producers()
        fired += 1
    return fired


def _is_hard_sigmoid_of(graph: Graph, producers: dict[str, Op], name: str, x: str) -> bool:
    op = producers.get(name)
    if op is None or op.kind != "activation" or op.inputs[0] != x:
        return False
    act = op.attrs.act
    return (
        act.kind == "hard_sigmoid"
        and math.isclose(act.alpha, 1 / 6, rel_tol=1e-5)
        and math.isclose(act.beta, 0.5, rel_tol=1e-5)
    )


@rewrite("recognize_hard_swish")
def recognize_hard_swish(graph: Graph) -> int:
    """x * hard_sigmoid(x; 1/6, 1/2) is hard_swish(x)."""
    fired = 0
    producers = graph.producers()
    for op in list(graph.ops):
        if op.kind != "eltwise" or op.attrs.kind != "mul" or op.attrs.act or len(op.inputs) != 2:
            continue
        a, b = op.inputs
        for x, hs in ((a, b), (b, a)):
            if _is_hard_sigmoid_of(graph, producers, hs, x) and sole_user(graph, hs) is op:
                graph.remove_op(producers[hs])
                _replace_with_activation(graph, op, op, x, ops.Activation("hard_swish"))
                producers = graph.producers()
                fired += 1
                break
    return fired


@rewrite("recognize_gelu")
def recognize_gelu(graph: Graph) -> int:
    """x * 0.5 * (1 + erf(x / sqrt(2))), in its common operand orders, is gelu(x)."""
    fired = 0
    for erf in list(graph.iter_ops("activation")):
        if erf.attrs.act.kind != "erf" or erf not in graph.ops:
            continue
        producers, consumers = graph.producers(), graph.consumers()
        scaled = _eltwise_with_const(graph, producers.get(erf.inputs[0]), "div")
        scaled = scaled or _eltwise_with_const(graph, producers.get(erf.inputs[0]), "mul")
        if scaled is None:
            continue
        x, k = scaled
        inner = producers[erf.inputs[0]]
        if not math.isclose(k if inner.attrs.kind == "div" else 1 / k, math.sqrt(2), rel_tol=1e-4):
            continue
        add = _only(consumers.get(erf.outputs[0], []))
        if _eltwise_with_const(graph, add, "add") is None or _scalar_operand(graph, add) != 1.0:
            continue
        mul1 = _only(consumers.get(add.outputs[0], []))
        if mul1 is None or mul1.kind != "eltwise" or mul1.attrs.kind != "mul" or mul1.attrs.act:
            continue
        other = mul1.inputs[1] if mul1.inputs[0] == add.outputs[0] else mul1.inputs[0]
        chain = [inner, erf, add, mul1]
        if other == x:  # (x * (1 + erf)) * 0.5
            last = _only(consumers.get(mul1.outputs[0], []))
            half = _eltwise_with_const(graph, last, "mul")
            if half is None or half[1] != 0.5 or mul1.outputs[0] in graph.outputs:
                continue
            chain.append(last)
        else:  # (x * 0.5) * (1 + erf)
            half_op = producers.get(other)
            half = _eltwise_with_const(graph, half_op, "mul")
            if half is None or half != (x, 0.5) or sole_user(graph, other) is not mul1:
                continue
            chain.insert(0, half_op)
        if any(o in graph.outputs for op in chain[:-1] for o in op.outputs):
            continue
        if any(len(consumers.get(op.outputs[0], [])) != 1 for op in chain[:-1] if op is not inner):
            continue
        if len(consumers.get(inner.outputs[0], [])) != 1:
            continue
        first = min(chain, key=graph.ops.index)
        for op in chain[:-1]:
            if op is not first:
                graph.remove_op(op)
        _replace_with_activation(graph, first, chain[-1], x, ops.Activation("gelu"))
        if first in graph.ops:
            graph.remove_op(first)
        fired += 1
    return fired


@rewrite("recognize_hard_swish_product")
def recognize_hard_swish_product(graph: Graph) -> int:
    """x * clip(x + 3, 0, 6) / 6 (Paddle's export of hard-swish) is hard_swish(x)."""
    fired = 0
    producers = graph.producers()
    for op in list(graph.ops):
        scaled = _eltwise_with_const(graph, op, "div") or _eltwise_with_const(graph, op, "mul")
        if scaled is None or op not in graph.ops:
            continue
        product, k = scaled
        divisor = k if op.attrs.kind == "div" else (1.0 / k if k else 0.0)
        mul = producers.get(product)
        if mul is None or mul.kind != "eltwise" or mul.attrs.kind != "mul" or mul.attrs.act or len(mul.inputs) != 2:
            continue
        for x, clipped in (mul.inputs, mul.inputs[::-1]):
            clip = producers.get(clipped)
            if clip is None or clip.kind != "activation" or clip.attrs.act.kind != "clip":
                continue
            shifted = _eltwise_with_const(graph, producers.get(clip.inputs[0]), "add")
            act = clip.attrs.act
            if shifted is None or shifted[0] != x or act.lo != 0.0 or not math.isclose(act.hi, divisor, rel_tol=1e-6):
                continue
            if not (math.isclose(divisor, 6.0, rel_tol=1e-6) and math.isclose(shifted[1], 3.0, rel_tol=1e-6)):
                continue
            chain = [producers[clip.inputs[0]], clip, mul]
            if any(sole_user(graph, c.outputs[0]) is None for c in chain):
                continue
            for c in chain:
                graph.remove_op(c)
            _replace_with_activation(graph, op, op, x, ops.Activation("hard_swish"))
            producers = graph.producers()
            fired += 1
            break
    return fired
