"""Canonicalization: rewrite the float IR into the few shapes the quantizer and backends expect.

Each rewrite is a small function registered in REWRITES and run in order; the float semantics must not
change (tests compare against onnxruntime after this pass). Graph outputs keep their names.
"""

from __future__ import annotations

import numpy as np

from npuc.compiler import ops
from npuc.compiler.fold import fold_constant_ops
from npuc.compiler.ir import Graph, Op
from npuc.passes.rewrite import activation_patterns, norm_patterns  # noqa: F401  (register their rewrites)
from npuc.passes.rewrite.rewrites import REWRITES, rewrite, sole_user

# Order matters: patterns are recognised before activations fuse into their producers (a fused
# clip would hide the hard-swish spelled as Add/Clip/Mul/Div), and scale folds run before fusion.
PIPELINE = (
    "fold_constants",
    "absorb_nhwc_input_transpose",
    "merge_transpose_axes",
    "drop_noop_reshape",
    "recognize_layer_norm",
    "spatial_reduce_to_global_pool",
    "recognize_gelu",
    "recognize_hard_sigmoid",
    "recognize_hard_swish",
    "recognize_hard_swish_product",
    "divide_by_reciprocal",
    "matmul_to_gemm",
    "fold_bias_add",
    "scale_before_reshape",
    "fold_batchnorm",
    "fold_pad",
    "fuse_activation",
)


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
        if inner is not None and inner.kind == "reshape" and sole_user(graph, src) is op:
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
        if producer is not None and producer.kind == "reshape" and sole_user(graph, src) is op:
            producer.attrs = ops.Reshape(merged)
            graph.tensors[src].shape = merged
        else:
            flat_in = graph.unique_name(f"{out}_merged_in")
            graph.add_tensor(flat_in, merged, graph.tensors[src].dtype)
            graph.ops.insert(index, Op(f"{op.name}_merge", "reshape", [src], [flat_in], ops.Reshape(merged)))
            op.inputs = [flat_in]
        user = sole_user(graph, out)
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


@rewrite("spatial_reduce_to_global_pool")
def spatial_reduce_to_global_pool(graph: Graph) -> int:
    """ReduceMean/ReduceMax over H and W of an NCHW tensor, dims kept: a global pool (the squeeze-excite blocks
    of Paddle exports), which every backend has."""
    fired = 0
    for op in graph.iter_ops("reduce"):
        shape = graph.shape(op.inputs[0])
        if len(shape) != 4 or op.attrs.kind not in ("mean", "max") or not op.attrs.keepdims:
            continue
        if sorted(a % 4 for a in op.attrs.axes) != [2, 3] or len(op.inputs) > 1 and op.inputs[1]:
            continue
        op.kind, op.attrs = "global_pool", ops.GlobalPool("avg" if op.attrs.kind == "mean" else "max")
        fired += 1
    return fired


@rewrite("scale_before_reshape")
def scale_before_reshape(graph: Graph) -> int:
    """conv -> reshape keeping N and C (a Squeeze of H) -> channel_scale: the scale moves before the reshape,
    where fold_batchnorm folds it into the conv. The scaled tensor keeps its name (and so its calibration
    row) at the conv's shape; the reshape writes a new name its readers follow."""
    fired = 0
    producers = graph.producers()
    for op in graph.iter_ops("channel_scale"):
        reshape = producers.get(op.inputs[0])
        if reshape is None or reshape.kind != "reshape" or op.attrs.axis != 1 or op.attrs.act:
            continue
        src, out = reshape.inputs[0], op.outputs[0]
        conv = producers.get(src)
        before, after = graph.shape(src), graph.shape(out)
        if conv is None or conv.kind not in ("conv2d", "gemm") or sole_user(graph, src) is not reshape:
            continue
        if sole_user(graph, reshape.outputs[0]) is not op or out in graph.outputs:
            continue
        if len(before) < 2 or len(after) < 2 or before[:2] != after[:2]:
            continue
        moved = graph.unique_name(f"{out}_reshaped")
        graph.add_tensor(moved, after, graph.tensors[out].dtype)
        graph.replace_uses(out, moved)
        graph.tensors[out].shape = tuple(before)
        op.inputs = [src, *op.inputs[1:]]
        reshape.inputs, reshape.outputs = [out], [moved]
        graph.ops.remove(op)
        graph.ops.insert(graph.ops.index(reshape), op)
        producers = graph.producers()
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
        if sole_user(graph, prev.outputs[0]) is not op or op.attrs.axis != 1:
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
    producers, users = graph.producers(), graph.consumers()  # one index for the pass: fusing renames nothing read
    for op in graph.iter_ops("activation"):
        act = op.attrs.act
        prev = producers.get(op.inputs[0])
        if not _fusable_activation(act) or prev is None or prev.kind not in _FUSABLE_PRODUCERS:
            continue
        if prev.attrs.act is not None or prev.outputs[0] in graph.outputs or users.get(prev.outputs[0]) != [op]:
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
        user = sole_user(graph, op.outputs[0])
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


@rewrite("matmul_to_gemm")
def matmul_to_gemm(graph: Graph) -> int:
    """A MatMul of a matrix by a constant matrix is a fully connected layer: spelled as Gemm, the bias Add
    that follows folds into it, so the layer is quantized once (as tpu-mlir's fused FC is), not twice."""
    fired = 0
    for op in graph.iter_ops("matmul"):
        weight = graph.const(op.inputs[1])
        if weight is None or weight.ndim != 2 or len(graph.shape(op.inputs[0])) != 2:
            continue
        op.kind, op.attrs = "gemm", ops.Gemm(act=op.attrs.act)
        fired += 1
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
            if const.size != channels or graph.shape(op.outputs[0]) != out_shape or sole_user(graph, x) is not op:
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
