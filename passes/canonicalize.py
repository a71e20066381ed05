"""Canonicalization: rewrite the float IR into the few shapes the quantizer and backends expect.

Each rewrite is a small function registered in REWRITES and run in order; the float semantics must not
change (tests compare against onnxruntime after this pass). Graph outputs keep their names.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from npuc.compiler import ops
from npuc.compiler.fold import fold_constant_ops
from npuc.compiler.ir import Graph, Op

Rewrite = Callable[[Graph], int]
REWRITES: dict[str, Rewrite] = {}

# Order matters: patterns are recognised before activations fuse into their producers (a fused
# clip would hide the hard-swish spelled as Add/Clip/Mul/Div), and scale folds run before fusion.
PIPELINE = (
    "fold_constants",
    "absorb_nhwc_input_transpose",
    "merge_transpose_axes",
    "drop_noop_reshape",
    "recognize_gelu",
    "recognize_hard_sigmoid",
    "recognize_hard_swish",
    "recognize_hard_swish_product",
    "divide_by_reciprocal",
    "fold_bias_add",
    "fold_batchnorm",
    "fold_pad",
    "fuse_activation",
)


def rewrite(name: str) -> Callable[[Rewrite], Rewrite]:
    def register(fn: Rewrite) -> Rewrite:
        REWRITES[name] = fn
        return fn

    return register


def canonicalize(graph: Graph) -> dict[str, int]:
    """Run every rewrite until nothing changes; returns how often each one fired."""
    counts = dict.fromkeys(PIPELINE, 0)
    for _ in range(8):
        changed = 0
        for name in PIPELINE:
            n = REWRITES[name](graph)
            counts[name] += n
            changed += n
        graph.prune()
        if not changed:
            break
    graph.verify()
    return {name: n for name, n in counts.items() if n}


# ---------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------


def _sole_user(graph: Graph, name: str) -> Op | None:
    """The single op reading `name`, if exactly one does and it is not a graph output."""
    if name in graph.outputs:
        return None
    users = graph.consumers().get(name, [])
    return users[0] if len(users) == 1 else None


def _bypass(graph: Graph, op: Op) -> bool:
    """Remove a one-in/one-out op whose output equals its input, keeping graph output names."""
    src, dst = op.inputs[0], op.outputs[0]
    if dst not in graph.outputs:
        graph.remove_op(op)
        graph.replace_uses(dst, src)
        return True
    producer = graph.producers().get(src)
    if producer is None or src in graph.outputs or len(graph.consumers().get(src, [])) != 1:
        return False
    graph.remove_op(op)
    producer.outputs = [dst if o == src else o for o in producer.outputs]
    graph.tensors[dst].dtype = graph.tensors[src].dtype
    return True


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


# ---------------------------------------------------------------------------------------------------------
# rewrites
# ---------------------------------------------------------------------------------------------------------


@rewrite("fold_constants")
def fold_constants(graph: Graph) -> int:
    return fold_constant_ops(graph)


@rewrite("absorb_nhwc_input_transpose")
def absorb_nhwc_input_transpose(graph: Graph) -> int:
    """An NHWC graph input read only through Transpose(0,3,1,2) becomes an NCHW input with layout 'nhwc'."""
    fired = 0
    for name in graph.inputs:
        users = graph.consumers().get(name, [])
        if len(users) != 1 or name in graph.outputs or graph.input_layouts.get(name, "nchw") != "nchw":
            continue
        op = users[0]
        if op.kind != "transpose" or tuple(op.attrs.perm) != (0, 3, 1, 2):
            continue
        graph.remove_op(op)
        graph.replace_uses(op.outputs[0], name)
        graph.tensors[name].shape = graph.tensors[op.outputs[0]].shape
        graph.input_layouts[name] = "nhwc"
        fired += 1
    return fired


@rewrite("drop_noop_reshape")
def drop_noop_reshape(graph: Graph) -> int:
    fired = 0
    producers = graph.producers()
    for op in graph.iter_ops("reshape"):
        src = op.inputs[0]
        if graph.shape(src) == graph.shape(op.outputs[0]) and _bypass(graph, op):
            fired += 1
            continue
        inner = producers.get(src)
        if inner is not None and inner.kind == "reshape" and _sole_user(graph, src) is op:
            op.inputs = [inner.inputs[0]]  # reshape(reshape(x)) = reshape(x)
            graph.remove_op(inner)
            producers = graph.producers()
            fired += 1
    return fired


def merged_transpose(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The same permutation over fewer axes: size-1 axes dropped, axes that stay adjacent and in order merged.

    Returns (merged input shape, merged perm); e.g. [1,2,4,16,16] perm [0,2,1,3,4] -> [2,4,256] perm [1,0,2].
    """
    kept = [p for p in perm if shape[p] != 1]
    runs: list[list[int]] = []
    for p in kept:
        if runs and p > runs[-1][-1] and all(shape[q] == 1 for q in range(runs[-1][-1] + 1, p)):
            runs[-1].append(p)
        else:
            runs.append([p])
    order = sorted(range(len(runs)), key=lambda i: runs[i][0])  # runs in input order
    merged_shape = tuple(int(np.prod([shape[p] for p in runs[i]])) for i in order)
    rank_of = {run: rank for rank, run in enumerate(order)}
    return merged_shape, tuple(rank_of[i] for i in range(len(runs)))


@rewrite("merge_transpose_axes")
def merge_transpose_axes(graph: Graph) -> int:
    """A transpose of more than 4 axes that is one over at most 4 merged axes (ShuffleNet's channel shuffle)
    becomes reshape -> 4-D transpose -> reshape, which every backend's 4-D kernels handle. A neighbouring
    reshape used only by the transpose takes the merged shape itself, so calibrated tensor names survive."""
    fired = 0
    for op in graph.iter_ops("transpose"):
        src, out = op.inputs[0], op.outputs[0]
        perm = tuple(op.attrs.perm)
        if len(perm) <= 4:
            continue
        merged, merged_perm = merged_transpose(graph.shape(src), perm)
        if len(merged) > 4:
            continue
        pad = 4 - len(merged)  # leading unit axes keep the NCHW-style rank the backends expect
        merged = (1,) * pad + merged
        merged_perm = tuple(range(pad)) + tuple(p + pad for p in merged_perm)
        merged_out = tuple(merged[p] for p in merged_perm)
        index = graph.ops.index(op)
        producer = graph.producers().get(src)
        if producer is not None and producer.kind == "reshape" and _sole_user(graph, src) is op:
            producer.attrs = ops.Reshape(merged)
            graph.tensors[src].shape = merged
        else:
            flat_in = graph.unique_name(f"{out}_merged_in")
            graph.add_tensor(flat_in, merged, graph.tensors[src].dtype)
            graph.ops.insert(index, Op(f"{op.name}_merge", "reshape", [src], [flat_in], ops.Reshape(merged)))
            op.inputs = [flat_in]
        user = _sole_user(graph, out)
        if user is not None and user.kind == "reshape":
            graph.tensors[out].shape = merged_out
        else:
            flat_out = graph.unique_name(f"{out}_merged")
            graph.add_tensor(flat_out, merged_out, graph.tensors[out].dtype)
            split = Op(f"{op.name}_split", "reshape", [flat_out], [out], ops.Reshape(graph.shape(out)))
            graph.ops.insert(graph.ops.index(op) + 1, split)
            op.outputs = [flat_out]
        op.attrs = ops.Transpose(merged_perm)
        fired += 1
    return fired


@rewrite("divide_by_reciprocal")
def divide_by_reciprocal(graph: Graph) -> int:
    """x / c for a constant c without zeros becomes x * (1/c): NPUs multiply, none of them divides."""
    fired = 0
    for op in graph.iter_ops("eltwise"):
        if op.attrs.kind != "div" or len(op.inputs) != 2 or graph.const(op.inputs[0]) is not None:
            continue
        divisor = graph.const(op.inputs[1])
        if divisor is None or not np.issubdtype(divisor.dtype, np.floating) or not np.all(divisor != 0):
            continue
        reciprocal = graph.unique_name(f"{op.inputs[1]}_reciprocal")
        graph.add_const(reciprocal, (np.float32(1) / divisor.astype(np.float32)).astype(np.float32))
        op.inputs = [op.inputs[0], reciprocal]
        op.attrs = ops.Eltwise("mul", op.attrs.act)
        fired += 1
    return fired


@rewrite("fold_batchnorm")
def fold_batchnorm(graph: Graph) -> int:
    """channel_scale (an inference BatchNormalization) after a conv/gemm folds into its weights and bias."""
    fired = 0
    producers = graph.producers()
    for op in graph.iter_ops("channel_scale"):
        prev = producers.get(op.inputs[0])
        scale, bias = graph.const(op.inputs[1]), graph.const(op.inputs[2])
        if prev is None or prev.kind not in ("conv2d", "gemm") or prev.attrs.act or op.attrs.act:
            continue
        if _sole_user(graph, prev.outputs[0]) is not op or op.attrs.axis != 1:
            continue
        if graph.const(prev.inputs[1]) is None or (len(prev.inputs) > 2 and graph.const(prev.inputs[2]) is None):
            continue
        if len(prev.inputs) > 2 and graph.const(prev.inputs[2]).size not in (
            1,
            graph.shape(prev.outputs[0])[1],
        ):
            continue
        _fold_scale_into(graph, prev, scale.astype(np.float32), bias.astype(np.float32))
        graph.remove_op(op)
        prev.outputs = [op.outputs[0]]
        fired += 1
    return fired


def _fold_scale_into(graph: Graph, op: Op, scale: np.ndarray, bias: np.ndarray) -> None:
    weight = graph.const(op.inputs[1]).astype(np.float32)
    n_out = graph.shape(op.outputs[0])[1]
    old_bias = graph.const(op.inputs[2]).astype(np.float32) if len(op.inputs) > 2 else np.zeros(n_out, np.float32)
    if op.kind == "conv2d":
        weight = weight * scale.reshape(-1, 1, 1, 1)
    else:  # gemm: output column j scales column j of op(B); fold alpha and beta in
        weight = weight * (scale.reshape(-1, 1) if op.attrs.trans_b else scale.reshape(1, -1)) * op.attrs.alpha
        old_bias = np.broadcast_to(old_bias.reshape(-1) * op.attrs.beta, (n_out,))
        op.attrs.alpha, op.attrs.beta = 1.0, 1.0
    dtype = graph.tensors[op.inputs[1]].dtype
    w_name = graph.unique_name(f"{op.name}_weight_bn")
    b_name = graph.unique_name(f"{op.name}_bias_bn")
    graph.add_const(w_name, weight.astype(dtype))
    graph.add_const(b_name, (old_bias * scale + bias).astype(dtype))
    op.inputs = [op.inputs[0], w_name, b_name]


_FUSABLE_PRODUCERS = ("conv2d", "conv_transpose2d", "gemm", "matmul", "eltwise", "channel_scale")


def _fusable_activation(act: ops.Activation) -> bool:
    if act.kind in ("relu", "leaky_relu"):
        return True
    return act.kind == "clip" and act.lo == 0.0 and act.hi in (6.0, np.inf)


@rewrite("fuse_activation")
def fuse_activation(graph: Graph) -> int:
    """Relu, Relu6 (clip 0..6) and LeakyRelu fold into the op that produces their input."""
    fired = 0
    producers = graph.producers()
    for op in graph.iter_ops("activation"):
        act = op.attrs.act
        prev = producers.get(op.inputs[0])
        if not _fusable_activation(act) or prev is None or prev.kind not in _FUSABLE_PRODUCERS:
            continue
        if prev.attrs.act is not None or _sole_user(graph, prev.outputs[0]) is not op:
            continue
        if prev.kind == "eltwise" and prev.attrs.kind not in ("add", "sub", "mul", "max", "min"):
            continue
        prev.attrs.act = ops.Activation("relu") if act.kind == "clip" and act.hi == np.inf else act
        graph.remove_op(op)
        prev.outputs = [op.outputs[0]]
        fired += 1
    return fired


@rewrite("fold_pad")
def fold_pad(graph: Graph) -> int:
    """A zero Pad over H and W folds into the next conv; a -inf Pad into a max pool."""
    fired = 0
    for op in graph.iter_ops("pad"):
        pads, rank = op.attrs.pads, len(graph.shape(op.inputs[0]))
        user = _sole_user(graph, op.outputs[0])
        if rank != 4 or op.attrs.mode != "constant" or user is None or any(pads[i] for i in (0, 1, 4, 5)):
            continue
        extra = (pads[2], pads[3], pads[6], pads[7])  # top, left, bottom, right
        value = op.attrs.value
        if (user.kind == "conv2d" and value == 0.0) or (
            user.kind == "pool2d" and user.attrs.mode == "max" and value == -np.inf
        ):
            pass
        elif user.kind == "pool2d" and user.attrs.mode == "avg" and value == 0.0 and not any(user.attrs.pads):
            user.attrs.count_include_pad = True
        else:
            continue
        user.attrs.pads = tuple(a + b for a, b in zip(user.attrs.pads, extra))
        user.inputs = [op.inputs[0]] + user.inputs[1:]
        graph.remove_op(op)
        fired += 1
    return fired


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
        if act.lo != 0.0 or not math.isclose(act.hi, divisor, rel_tol=1e-6) or _sole_user(graph, clipped) is not op:
            continue
        add = producers.get(clip.inputs[0])
        shifted = _eltwise_with_const(graph, add, "add")
        if shifted is None or _sole_user(graph, clip.inputs[0]) is not clip:
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
            if _is_hard_sigmoid_of(graph, producers, hs, x) and _sole_user(graph, hs) is op:
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
            if half is None or half != (x, 0.5) or _sole_user(graph, other) is not mul1:
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
            if any(_sole_user(graph, c.outputs[0]) is None for c in chain):
                continue
            for c in chain:
                graph.remove_op(c)
            _replace_with_activation(graph, op, op, x, ops.Activation("hard_swish"))
            producers = graph.producers()
            fired += 1
            break
    return fired


@rewrite("fold_bias_add")
def fold_bias_add(graph: Graph) -> int:
    """conv/gemm followed by Add of a per-channel constant (a bias exported separately) folds into the bias."""
    fired = 0
    producers = graph.producers()
    for op in graph.iter_ops("eltwise"):
        if op.attrs.kind != "add" or op.attrs.act or len(op.inputs) != 2:
            continue
        for x, c in (op.inputs, op.inputs[::-1]):
            prev, const = producers.get(x), graph.const(c)
            if prev is None or const is None or prev.kind not in ("conv2d", "gemm") or prev.attrs.act:
                continue
            out_shape = graph.shape(prev.outputs[0])
            channels = out_shape[1]
            if const.size != channels or graph.shape(op.outputs[0]) != out_shape or _sole_user(graph, x) is not op:
                continue
            if const.ndim > 1 and const.shape[-len(out_shape) + 1 :] != (channels,) + (1,) * (len(out_shape) - 2):
                continue
            if prev.kind == "gemm" and (len(prev.inputs) > 2 and graph.const(prev.inputs[2]) is None):
                continue
            if len(prev.inputs) > 2 and graph.const(prev.inputs[2]) is None:
                continue
            old = graph.const(prev.inputs[2]) if len(prev.inputs) > 2 else np.zeros(channels, const.dtype)
            if prev.kind == "gemm":
                old = np.broadcast_to(old.reshape(-1) * prev.attrs.beta, (channels,))
                prev.attrs.beta = 1.0
            name = graph.unique_name(f"{prev.name}_bias_folded")
            graph.add_const(name, (old.reshape(-1) + const.reshape(-1)).astype(graph.tensors[x].dtype))
            prev.inputs = [prev.inputs[0], prev.inputs[1], name]
            graph.remove_op(op)
            prev.outputs = [op.outputs[0]]
            producers = graph.producers()
            fired += 1
            break
    return fired


def _only(users: list[Op]) -> Op | None:
    return users[0] if len(users) == 1 else None


def _scalar_operand(graph: Graph, op: Op) -> float | None:
    for name in op.inputs:
        value = _scalar(graph, name)
        if value is not None:
            return value
    return None
