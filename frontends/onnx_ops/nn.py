"""Converters for the compute-heavy ONNX ops: convolutions, pooling, dense layers, normalisation, softmax."""

from __future__ import annotations

import numpy as np

from npuc.compiler import ops

from .registry import ConvertContext, converter


def _same_pads(sizes, kernel, strides, dilations, mode: str) -> list[int]:
    """Explicit (begins..., ends...) pads for auto_pad SAME_UPPER / SAME_LOWER."""
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else large)
        ends.append(large if mode == "SAME_UPPER" else small)
    return begins + ends


def _window_params(ctx: ConvertContext, kernel: list[int]) -> tuple[list[int], list[int], list[int]]:
    """strides, dilations and (begins..., ends...) pads of a conv/pool node, auto_pad resolved."""
    n = len(kernel)
    strides = list(ctx.attr("strides", [1] * n))
    dilations = list(ctx.attr("dilations", [1] * n))
    for name, values in (("kernel_shape", kernel), ("strides", strides), ("dilations", dilations)):
        if len(values) != n or min(values, default=1) < 1:
            raise ctx.unsupported(f"{name} {values} must be {n} positive numbers", "the model is damaged; re-export it")
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(ctx.shape(0)[2:], kernel, strides, dilations, auto_pad)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    else:
        pads = list(ctx.attr("pads", [0] * (2 * n)))
    if len(pads) != 2 * n or min(pads, default=0) < 0:
        raise ctx.unsupported(f"pads {pads} must be {2 * n} non-negative numbers", "the model is damaged; re-export it")
    return strides, dilations, pads


def _to_2d(values: list[int], fill: int) -> tuple[int, int]:
    return (fill, values[0]) if len(values) == 1 else (values[0], values[1])


def _pads_2d(pads: list[int]) -> tuple[int, int, int, int]:
    """(begins..., ends...) in 1-D or 2-D → (top, left, bottom, right)."""
    if len(pads) == 2:
        return (0, pads[0], 0, pads[1])
    return (pads[0], pads[1], pads[2], pads[3])


def _check_spatial(ctx: ConvertContext, spatial: int) -> None:
    if spatial not in (1, 2):
        raise ctx.unsupported(f"{spatial}-D windows are not supported", "NPU targets compute 1-D and 2-D windows only")


def _lift_1d(ctx: ConvertContext, name: str) -> str:
    """View an N,C,L tensor as N,C,1,L so 1-D windows run as 2-D ones."""
    shape = ctx.graph.shape(name)
    data = ctx.graph.const(name)
    lifted = ctx.temp("as2d")
    if data is not None:
        ctx.graph.add_const(lifted, data.reshape(shape[:2] + (1,) + shape[2:]))
    else:
        ctx.emit("reshape", [name], ops.Reshape(shape[:2] + (1,) + shape[2:]), [lifted])
    return lifted


def _emit_windowed(ctx: ConvertContext, kind: str, inputs: list[str], attrs, lift_weight: bool) -> None:
    """Emit a 2-D op; 1-D nodes are lifted to 2-D and reshaped back."""
    if len(ctx.shape(0)) != 3:
        ctx.emit(kind, inputs, attrs)
        return
    lifted = [_lift_1d(ctx, inputs[0])] + [
        _lift_1d(ctx, name) if i == 1 and lift_weight else name for i, name in enumerate(inputs[1:], 1)
    ]
    out2d = ctx.temp("2d")
    op = ctx.emit(kind, lifted, attrs, [out2d])
    shape = ctx.graph.shape(op.outputs[0])
    ctx.emit("reshape", [out2d], ops.Reshape(shape[:2] + shape[3:]), [ctx.output(0)])


@converter("Conv", 1)
def conv(ctx: ConvertContext) -> None:
    weight_shape = ctx.shape(1)
    kernel = list(ctx.attr("kernel_shape", weight_shape[2:]))
    _check_spatial(ctx, len(kernel))
    strides, dilations, pads = _window_params(ctx, kernel)
    attrs = ops.Conv2d(
        strides=_to_2d(strides, 1),
        pads=_pads_2d(pads),
        dilations=_to_2d(dilations, 1),
        group=int(ctx.attr("group", 1)),
    )
    _emit_windowed(ctx, "conv2d", ctx.inputs, attrs, lift_weight=True)


@converter("ConvTranspose", 1)
def conv_transpose(ctx: ConvertContext) -> None:
    weight_shape = ctx.shape(1)
    kernel = list(ctx.attr("kernel_shape", weight_shape[2:]))
    _check_spatial(ctx, len(kernel))
    n = len(kernel)
    strides = list(ctx.attr("strides", [1] * n))
    dilations = list(ctx.attr("dilations", [1] * n))
    out_pad = list(ctx.attr("output_padding", [0] * n))
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    output_shape = ctx.attr("output_shape")
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [size * s for size, s in zip(ctx.shape(0)[2:], strides)]
    if output_shape is not None:
        output_shape = list(output_shape)[-n:]
        begins, ends = [], []
        for size, k, s, d, op_, want in zip(ctx.shape(0)[2:], kernel, strides, dilations, out_pad, output_shape):
            total = s * (size - 1) + op_ + (k - 1) * d + 1 - want
            small, large = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
        if any(b < 0 for b in begins):
            raise ctx.unsupported(f"output_shape {output_shape} needs negative leading padding")
        # a negative trailing pad grows the output: that is extra output padding
        out_pad = [p + max(-e, 0) for p, e in zip(out_pad, ends)]
        pads = begins + [max(e, 0) for e in ends]
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    else:
        pads = list(ctx.attr("pads", [0] * (2 * n)))
    attrs = ops.ConvTranspose2d(
        strides=_to_2d(strides, 1),
        pads=_pads_2d(pads),
        dilations=_to_2d(dilations, 1),
        group=int(ctx.attr("group", 1)),
        output_padding=_to_2d(out_pad, 0),
    )
    _emit_windowed(ctx, "conv_transpose2d", ctx.inputs, attrs, lift_weight=True)


def _pool(ctx: ConvertContext, mode: str) -> None:
    if len([o for o in ctx.node.output if o]) > 1:
        raise ctx.unsupported("the Indices output of MaxPool is not supported", "drop the second output")
    if ctx.attr("storage_order", 0):
        raise ctx.unsupported("storage_order=1 is not supported", "export with storage_order=0")
    kernel = ctx.attr("kernel_shape")
    if kernel is None:
        raise ctx.unsupported("the required attribute kernel_shape is missing", "the model is damaged; re-export it")
    kernel = list(kernel)
    _check_spatial(ctx, len(kernel))
    strides, dilations, pads = _window_params(ctx, kernel)
    attrs = ops.Pool2d(
        mode=mode,
        kernel=_to_2d(kernel, 1),
        strides=_to_2d(strides, 1),
        pads=_pads_2d(pads),
        dilations=_to_2d(dilations, 1),
        ceil_mode=bool(ctx.attr("ceil_mode", 0)),
        count_include_pad=bool(ctx.attr("count_include_pad", 0)),
    )
    _emit_windowed(ctx, "pool2d", [ctx.input(0)], attrs, lift_weight=False)


@converter("MaxPool", 1)
def max_pool(ctx: ConvertContext) -> None:
    _pool(ctx, "max")


@converter("AveragePool", 1)
def average_pool(ctx: ConvertContext) -> None:
    _pool(ctx, "avg")


@converter("GlobalAveragePool", 1)
def global_average_pool(ctx: ConvertContext) -> None:
    ctx.emit("global_pool", [ctx.input(0)], ops.GlobalPool("avg"))


@converter("GlobalMaxPool", 1)
def global_max_pool(ctx: ConvertContext) -> None:
    ctx.emit("global_pool", [ctx.input(0)], ops.GlobalPool("max"))


@converter("Gemm", 7)
def gemm(ctx: ConvertContext) -> None:
    attrs = ops.Gemm(
        trans_a=bool(ctx.attr("transA", 0)),
        trans_b=bool(ctx.attr("transB", 0)),
        alpha=float(ctx.attr("alpha", 1.0)),
        beta=float(ctx.attr("beta", 1.0)),
    )
    ctx.emit("gemm", ctx.inputs, attrs)


@converter("MatMul", 1)
def matmul(ctx: ConvertContext) -> None:
    ctx.emit("matmul", ctx.inputs, ops.MatMul())


@converter("BatchNormalization", 7, const_inputs=(1, 2, 3, 4))
def batch_normalization(ctx: ConvertContext) -> None:
    if ctx.attr("training_mode", 0) or len([o for o in ctx.node.output if o]) > 1:
        raise ctx.unsupported("training-mode BatchNormalization is not supported", "export the model in eval mode")
    # float32 arithmetic, as tpu-mlir folds BN: the folded weights then match its quantized ones exactly
    params = [ctx.const(i) for i in (1, 2, 3, 4)]
    if any(p is None for p in params):
        raise ctx.unsupported("scale, B, mean and var are required inputs", "the model is damaged; re-export it")
    scale, bias, mean, var = (p.astype(np.float32) for p in params)
    factor = scale / np.sqrt(var + np.float32(ctx.attr("epsilon", 1e-5)))
    dtype = ctx.graph.tensors[ctx.input(0)].dtype
    s_name, b_name = ctx.temp("bn_scale"), ctx.temp("bn_bias")
    ctx.graph.add_const(s_name, factor.astype(dtype))
    ctx.graph.add_const(b_name, (bias - mean * factor).astype(dtype))
    ctx.emit("channel_scale", [ctx.input(0), s_name, b_name], ops.ChannelScale(axis=1))


@converter("LRN", 1)
def lrn(ctx: ConvertContext) -> None:
    attrs = ops.LRN(
        size=int(ctx.attr("size")),
        alpha=float(ctx.attr("alpha", 1e-4)),
        beta=float(ctx.attr("beta", 0.75)),
        bias=float(ctx.attr("bias", 1.0)),
    )
    ctx.emit("lrn", [ctx.input(0)], attrs)


@converter("Softmax", 1)
def softmax_legacy(ctx: ConvertContext) -> None:
    ctx.emit("softmax", [ctx.input(0)], ops.Softmax(axis=ctx.axis(int(ctx.attr("axis", 1))), coerce_2d=True))


@converter("LayerNormalization", 17)
def layer_norm(ctx: ConvertContext) -> None:
    axis, eps = ctx.axis(int(ctx.attr("axis", -1))), float(ctx.attr("epsilon", 1e-5))
    ctx.emit("layer_norm", ctx.inputs, ops.LayerNorm(axis, eps), [ctx.output(0)])
    outputs = list(ctx.node.output) + ["", ""]
    if outputs[1] or outputs[2]:  # the training outputs Mean and InvStdDev, spelled out in primitives
        _layer_norm_statistics(ctx, tuple(range(axis, ctx.rank(0))), eps, outputs[1], outputs[2])


def _layer_norm_statistics(ctx: ConvertContext, axes: tuple[int, ...], eps: float, mean: str, inv_std: str) -> None:
    x = ctx.input(0)
    mean = mean or ctx.temp("mean")
    ctx.emit("reduce", [x], ops.Reduce("mean", axes, True), [mean])
    if not inv_std:
        return
    centred, square, var, shifted, std = (ctx.temp(n) for n in ("centred", "square", "var", "shifted", "std"))
    ctx.emit("eltwise", [x, mean], ops.Eltwise("sub"), [centred])
    ctx.emit("eltwise", [centred, centred], ops.Eltwise("mul"), [square])
    ctx.emit("reduce", [square], ops.Reduce("mean", axes, True), [var])
    epsilon = ctx.temp("epsilon")
    ctx.graph.add_const(epsilon, np.array(eps, np.float32))
    ctx.emit("eltwise", [var, epsilon], ops.Eltwise("add"), [shifted])
    ctx.emit("activation", [shifted], ops.ActivationOp(ops.Activation("sqrt")), [std])
    ctx.emit("activation", [std], ops.ActivationOp(ops.Activation("reciprocal")), [inv_std])


@converter("Softmax", 13)
def softmax(ctx: ConvertContext) -> None:
    ctx.emit("softmax", [ctx.input(0)], ops.Softmax(axis=ctx.axis(int(ctx.attr("axis", -1)))))


# ---- recurrent layers --------------------------------------------------------------------------------------

DEFAULT_ACTIVATIONS = {"lstm": ["Sigmoid", "Tanh", "Tanh"], "gru": ["Sigmoid", "Tanh"]}


def _recurrent(ctx: ConvertContext, cell: str) -> None:
    """LSTM / GRU: optional inputs become constants (zero bias and states), every output gets a tensor."""
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.unsupported(f"direction {direction!r} is not forward, reverse or bidirectional")
    acts = [a.decode() if isinstance(a, bytes) else a for a in (ctx.attr("activations") or [])]
    dirs = 2 if direction == "bidirectional" else 1
    if acts and acts != DEFAULT_ACTIVATIONS[cell] * dirs:
        raise ctx.unsupported(f"activations {acts} are not the default {DEFAULT_ACTIVATIONS[cell]}")
    batch_first = int(ctx.attr("layout", 0)) == 1
    if cell == "lstm" and int(ctx.attr("input_forget", 0)):
        raise ctx.unsupported("coupled input-forget gates are not supported")
    x = _transposed(ctx, ctx.input(0), (1, 0, 2), "x") if batch_first else ctx.input(0)
    seq, batch, _ = ctx.graph.shape(x)
    lens = ctx.const(4)
    if lens is not None and np.any(np.asarray(lens) != seq):
        raise ctx.unsupported(f"sequence_lens {np.asarray(lens).tolist()} differ from the sequence length {seq}")
    hidden = int(ctx.attr("hidden_size", ctx.shape(2)[-1]))
    gates = 4 if cell == "lstm" else 3
    clip = ctx.attr("clip")

    def given_or_zeros(i: int, shape: tuple[int, ...], suffix: str, state: bool = False) -> str:
        if ctx.input(i):  # a batch-first state is [batch, directions, hidden]
            return _transposed(ctx, ctx.input(i), (1, 0, 2), suffix) if state and batch_first else ctx.input(i)
        name = ctx.temp(suffix)
        ctx.graph.add_const(name, np.zeros(shape, np.float32))
        return name

    inputs = [x, ctx.input(1), ctx.input(2), given_or_zeros(3, (dirs, 2 * gates * hidden), "bias"),
              given_or_zeros(5, (dirs, batch, hidden), "h0", True)]  # fmt: skip
    if cell == "lstm":
        inputs += [given_or_zeros(6, (dirs, batch, hidden), "c0", True), given_or_zeros(7, (dirs, 3 * hidden), "p")]
    wanted = 3 if cell == "lstm" else 2
    names = [ctx.node.output[i] if i < len(ctx.node.output) and ctx.node.output[i] else ctx.temp(f"out{i}")
             for i in range(wanted)]  # fmt: skip
    outputs = [ctx.temp(f"seq_first{i}") for i in range(wanted)] if batch_first else names
    attrs = ops.Recurrent(cell, hidden, direction, None if clip is None else float(clip),
                          bool(ctx.attr("linear_before_reset", 0)))  # fmt: skip
    ctx.emit("recurrent", inputs, attrs, outputs)
    if batch_first:  # Y [seq, dirs, batch, hidden] -> [batch, seq, dirs, hidden]; states -> [batch, dirs, hidden]
        for i, (made, name) in enumerate(zip(outputs, names)):
            ctx.emit("transpose", [made], ops.Transpose((2, 0, 1, 3) if i == 0 else (1, 0, 2)), [name])


def _transposed(ctx: ConvertContext, name: str, perm: tuple[int, ...], suffix: str) -> str:
    out = ctx.temp(suffix)
    ctx.emit("transpose", [name], ops.Transpose(perm), [out])
    return out


converter("LSTM", 7, const_inputs=(4,))(lambda ctx: _recurrent(ctx, "lstm"))
converter("GRU", 7, const_inputs=(4,))(lambda ctx: _recurrent(ctx, "gru"))
