"""Per-op lowering handlers for the DV700 (registered into `lower.LOWER`), and the run absorbers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op
from npuc.compiler.ops import Activation

from .layers import (
    ACT_ELU,
    ACT_LEAKY,
    ACT_NONE,
    ACT_PRELU,
    ACT_RELU6,
    ACT_SIGMOID,
    ACT_TANH,
    CONV_DECONV,
    CONV_DEPTHWISE,
    CONV_DEPTHWISE_DECONV,
    CONV_OFF,
    CONV_ON,
    POOL_AVG,
    POOL_MAX,
    POOL_OFF,
    Layer,
    Run,
    pack2,
    pack4,
)
from .lower_context import Lowering, RunWeights, Value, lowers, set_act
from .validate import MAX_KERNEL, MAX_POOL_SIZES, run_output_dims

MONOTONIC = {ACT_NONE, ACT_TANH, ACT_LEAKY, ACT_SIGMOID, ACT_ELU, ACT_RELU6}  # commute with max pooling
CUSTOM_ACTS = ("hard_swish", "hard_sigmoid", "gelu", "erf")


def hw_activation(act: Activation | None) -> tuple[int, float] | None:
    """(actfunc, slope) for an IR activation the conv unit has, else None. ReLU is leaky with slope 0."""
    if act is None:
        return ACT_NONE, 0.0
    if act.kind == "relu" or (act.kind == "clip" and act.lo == 0.0 and act.hi == np.inf):
        return ACT_LEAKY, 0.0
    if act.kind == "leaky_relu":
        return ACT_LEAKY, act.alpha
    if act.kind == "clip" and act.lo == 0.0 and act.hi == 6.0:
        return ACT_RELU6, 0.0
    if act.kind == "elu" and act.alpha == 1.0:
        return ACT_ELU, 0.0
    return {"sigmoid": (ACT_SIGMOID, 0.0), "tanh": (ACT_TANH, 0.0)}.get(act.kind)


def _whc8_input(ctx: Lowering, op: Op, index: int = 0) -> Value:
    src = ctx.value(op, index)
    if src.layout == "hwc" and src.dims[0] * src.dims[1] > 1:
        raise UserError(
            f"op '{op.name}' ({op.kind}) reads the row-major output of a CPU layer; DV700 conv runs need the "
            "FPGA layout, so restructure the model or move that CPU op later"
        )
    if src.view == "nhwc":
        raise UserError(f"op '{op.name}' ({op.kind}) reads an NHWC view; only NCHW tensors feed DV700 runs")
    return src


def _single_run_layer(ctx: Lowering, op: Op, src: Value, run: Run, rw: RunWeights | None) -> None:
    """Emit a one-run conv layer for `op`, let the run absorb what follows, and bind the final tensor."""
    if rw is not None:
        ctx.run_weights[id(run)] = rw
    run.ops.append(op.name)
    out_name = _absorb(ctx, run, rw, op.outputs[0])
    dims = run_output_dims(run, src.dims)
    out = ctx.conv_layer(", ".join(run.ops), src, [run], dims, list(run.ops))
    ctx.values[out_name] = out


# ---------------------------------------------------------------------------------------------------------
# absorbers: the sole consumer of a run's current output folds into the run
# ---------------------------------------------------------------------------------------------------------

Absorber = Callable[[Lowering, Run, RunWeights | None, Op], bool]
ABSORBERS: list[Absorber] = []


def absorber(fn: Absorber) -> Absorber:
    ABSORBERS.append(fn)
    return fn


def _absorb(ctx: Lowering, run: Run, rw: RunWeights | None, name: str) -> str:
    while True:
        user = ctx.sole_user(name)
        if user is None or not any(fn(ctx, run, rw, user) for fn in ABSORBERS):
            return name
        ctx.consumed.add(user.name)
        run.ops.append(user.name)
        name = user.outputs[0]


def _channel_const(ctx: Lowering, op: Op, m: int) -> np.ndarray | None:
    """The per-channel (or scalar) constant operand of a 2-input eltwise, as (m,) float32."""
    consts = [ctx.const(n) for n in op.inputs]
    if len(op.inputs) != 2 or sum(c is not None for c in consts) != 1:
        return None
    data = next(c for c in consts if c is not None)
    flat = np.asarray(data, np.float32).reshape(-1)
    if flat.size not in (1, m) or (flat.size == m and data.ndim and data.shape[-1] not in (1, m) and data.ndim > 1):
        return None
    if flat.size == m and data.ndim >= 3 and data.shape[-1] != 1:
        return None
    return np.broadcast_to(flat, (m,)).astype(np.float32)


@absorber
def _bias_add(ctx: Lowering, run: Run, rw: RunWeights | None, user: Op) -> bool:
    if rw is None or user.kind != "eltwise" or user.attrs.kind not in ("add", "sub") or run.actfunc != ACT_NONE:
        return False
    if run.pool_enable != POOL_OFF or rw.prelu is not None:
        return False
    const = _channel_const(ctx, user, run.m)
    if const is None or (user.attrs.kind == "sub" and ctx.const(user.inputs[1]) is None):
        return False
    rw.bias = rw.bias + (const if user.attrs.kind == "add" else -const)
    return _try_act(run, user.attrs.act) or user.attrs.act is None


def _try_act(run: Run, act: Activation | None) -> bool:
    code = hw_activation(act)
    if act is None or code is None or run.actfunc != ACT_NONE:
        return False
    set_act(run, *code)
    return True


@absorber
def _activation(ctx: Lowering, run: Run, rw: RunWeights | None, user: Op) -> bool:
    return user.kind == "activation" and _try_act(run, user.attrs.act)


@absorber
def _prelu(ctx: Lowering, run: Run, rw: RunWeights | None, user: Op) -> bool:
    if user.kind != "prelu" or rw is None or run.actfunc != ACT_NONE or rw.dilated:
        return False
    slope = ctx.const(user.inputs[1])
    if slope is None or slope.size not in (1, run.m):
        return False
    rw.prelu = np.broadcast_to(np.asarray(slope, np.float32).reshape(-1), (run.m,)).copy()
    run.actfunc = ACT_PRELU
    return True


@absorber
def _max_pool(ctx: Lowering, run: Run, rw: RunWeights | None, user: Op) -> bool:
    if user.kind != "pool2d" or user.attrs.mode != "max" or run.conv_enable == CONV_OFF:
        return False
    if run.pool_enable != POOL_OFF or run.conv_dilation or user.attrs.act is not None:
        return False
    monotonic = run.actfunc in MONOTONIC or (run.actfunc == ACT_PRELU and bool(np.all(rw.prelu >= 0)))
    fields = _pool_fields(ctx, user)
    if not monotonic or fields is None or fields[1] not in MAX_POOL_SIZES:
        return False
    run.pool_enable, run.pool_size, run.pool_stride, run.pool_pad = POOL_MAX, pack2(*fields[1]), fields[2], fields[3]
    return True


def _pool_fields(ctx: Lowering, op: Op) -> tuple[int, tuple[int, int], int, int] | None:
    """(mode, (kw, kh), packed stride, packed pad) of a pool2d, with ceil mode turned into end padding."""
    a = op.attrs
    if a.dilations != (1, 1):
        return None
    n, c, h, w = ctx.graph.shape(op.inputs[0])
    _, _, oh, ow = ctx.graph.shape(op.outputs[0])
    top, left, bottom, right = a.pads
    bottom += max(0, (oh - 1) * a.strides[0] + a.kernel[0] - (h + top + bottom))
    right += max(0, (ow - 1) * a.strides[1] + a.kernel[1] - (w + left + right))
    mode = POOL_MAX if a.mode == "max" else POOL_AVG
    return mode, (a.kernel[1], a.kernel[0]), pack2(a.strides[1], a.strides[0]), pack4(left, right, top, bottom)


# ---------------------------------------------------------------------------------------------------------
# conv, gemm, channel affine
# ---------------------------------------------------------------------------------------------------------


@lowers("conv2d")
def lower_conv(ctx: Lowering, op: Op) -> None:
    a = op.attrs
    src = _whc8_input(ctx, op)
    weight = ctx.const(op.inputs[1])
    if weight is None:
        raise UserError(f"conv '{op.name}' has non-constant weights; DV700 needs them in the weights file")
    m, cg, kh, kw = weight.shape
    c = src.dims[2]
    bias = ctx.const(op.inputs[2]) if len(op.inputs) > 2 else np.zeros(m, np.float32)
    if bias is None:
        raise UserError(f"conv '{op.name}' has a non-constant bias; fold it or make it an initializer")
    if a.group == 1:
        mode = CONV_ON
    elif a.group == c == m and cg == 1:
        mode = CONV_DEPTHWISE
    else:
        raise UserError(
            f"conv '{op.name}' has group={a.group} (C={c}, M={m}); DV700 runs plain and depthwise convs only, "
            "so split the grouped conv into per-group convs and a concat"
        )
    if max(kh, kw) > MAX_KERNEL:
        raise UserError(f"conv '{op.name}' has a {kh}x{kw} kernel; DV700 kernels are at most {MAX_KERNEL}x{MAX_KERNEL}")
    top, left, bottom, right = a.pads
    if max(a.pads) > 127:
        raise UserError(f"conv '{op.name}' pads {list(a.pads)} exceed the 7-bit DV700 pad fields")
    dilated = a.dilations != (1, 1)
    run = Run(
        m=m,
        conv_enable=mode,
        p=kw if kw == kh else pack2(kw, kh),
        conv_pad=pack4(left, right, top, bottom),
        conv_stride=pack2(a.strides[1], a.strides[0]),
        conv_dilation=pack2(a.dilations[1], a.dilations[0]) if dilated else 0,
    )
    rw = RunWeights(np.asarray(weight, np.float32), np.asarray(bias, np.float32).reshape(m).copy(), dilated=dilated)
    if a.act is not None and not _try_act(run, a.act):
        raise UserError(f"conv '{op.name}' carries activation {a.act.kind}, which DV700 conv runs cannot apply")
    _single_run_layer(ctx, op, src, run, rw)


@lowers("conv_transpose2d")
def lower_deconv(ctx: Lowering, op: Op) -> None:
    """ConvTranspose as a DV700 deconv run: the HW spreads the input by the stride and runs a stride-1 conv
    with pads k-1-pad (output_padding added at the right and bottom) over the 180°-rotated kernel (spec §1.8,
    §1.11); the rotated (M, C, kh, kw) kernel is what gets packed."""
    a = op.attrs
    src = _whc8_input(ctx, op)
    weight = ctx.const(op.inputs[1])
    if weight is None:
        raise UserError(f"deconv '{op.name}' has non-constant weights; DV700 needs them in the weights file")
    c, mg, kh, kw = weight.shape
    m = mg * a.group
    bias = ctx.const(op.inputs[2]) if len(op.inputs) > 2 else np.zeros(m, np.float32)
    if bias is None:
        raise UserError(f"deconv '{op.name}' has a non-constant bias; fold it or make it an initializer")
    rotated = np.asarray(weight, np.float32)[:, :, ::-1, ::-1]
    if a.group == 1:
        mode, kernel = CONV_DECONV, rotated.transpose(1, 0, 2, 3)
    elif a.group == c == m:
        mode, kernel = CONV_DEPTHWISE_DECONV, rotated
    else:
        raise UserError(f"deconv '{op.name}' has group={a.group} (C={c}, M={m}); DV700 runs plain and depthwise only")
    if a.dilations != (1, 1) or max(kh, kw) > MAX_KERNEL:
        raise UserError(
            f"deconv '{op.name}': kernel {kh}x{kw} dilation {list(a.dilations)}; npuc lowers undilated DV700 "
            f"deconvolutions with kernels up to {MAX_KERNEL}x{MAX_KERNEL}"
        )
    top, left, bottom, right = a.pads
    oph, opw = a.output_padding
    hw_pads = (kw - 1 - left, kw - 1 - right + opw, kh - 1 - top, kh - 1 - bottom + oph)
    if min(hw_pads) < 0 or max(hw_pads) > 127:
        raise UserError(
            f"deconv '{op.name}': pads {list(a.pads)} with a {kh}x{kw} kernel need HW pads {list(hw_pads)}, "
            "outside 0..127; crop the output with a separate slice instead"
        )
    run = Run(
        m=m,
        conv_enable=mode,
        p=kw if kw == kh else pack2(kw, kh),
        conv_pad=pack4(*hw_pads),
        conv_stride=pack2(a.strides[1], a.strides[0]),
    )
    rw = RunWeights(np.ascontiguousarray(kernel), np.asarray(bias, np.float32).reshape(m).copy())
    if a.act is not None and not _try_act(run, a.act):
        raise UserError(f"deconv '{op.name}' carries activation {a.act.kind}, which DV700 runs cannot apply")
    _single_run_layer(ctx, op, src, run, rw)


@lowers("gemm", "matmul")
def lower_gemm(ctx: Lowering, op: Op) -> None:
    """InnerProduct as a 1x1 conv over a 1x1xK input (the tool's representation since 2019)."""
    src = ctx.value(op)
    if src.dims[0] * src.dims[1] != 1 or len(ctx.graph.shape(op.inputs[0])) != 2:
        raise UserError(f"{op.kind} '{op.name}' needs a flat (1, K) input; flatten the tensor before it")
    b = ctx.const(op.inputs[1])
    if b is None or ctx.graph.shape(op.inputs[0])[0] != 1:
        raise UserError(f"{op.kind} '{op.name}' needs constant weights and batch 1 to run as a 1x1 conv on DV700")
    b = np.asarray(b, np.float32)
    alpha, beta, bias = 1.0, 1.0, None
    if op.kind == "gemm":
        a = op.attrs
        if a.trans_a:
            raise UserError(f"gemm '{op.name}' transposes its input; DV700 cannot, export the model without transA")
        b = b.T if a.trans_b else b
        alpha, beta = a.alpha, a.beta
        if len(op.inputs) > 2:
            bias = ctx.const(op.inputs[2])
            if bias is None:
                raise UserError(f"gemm '{op.name}' has a non-constant bias; make it an initializer")
    k, n = b.shape
    weight = (alpha * b.T).reshape(n, k, 1, 1)
    if src.perm is not None:  # the buffer holds the graph's flat vector permuted: reorder weight columns
        reordered = np.empty_like(weight)
        reordered[:, src.perm] = weight
        weight = reordered
    full_bias = np.zeros(n, np.float32)
    if bias is not None:
        full_bias = full_bias + beta * np.broadcast_to(np.asarray(bias, np.float32).reshape(-1), (n,))
    run = Run(m=n, conv_enable=CONV_ON, p=1)
    if op.attrs.act is not None and not _try_act(run, op.attrs.act):
        raise UserError(f"{op.kind} '{op.name}' carries activation {op.attrs.act.kind}, which DV700 cannot apply")
    flat_src = Value(src.buf, (1, 1, k), src.layout, src.dtype, "nchw", None, src.layer)
    _single_run_layer(ctx, op, flat_src, run, RunWeights(weight, full_bias))
    ctx.values[_last_name(ctx, op)].view = "flat"


def _last_name(ctx: Lowering, op: Op) -> str:
    name = op.outputs[0]
    while name not in ctx.values:
        name = ctx.sole_user(name).outputs[0]
    return name


def _affine_run(ctx: Lowering, op: Op, scale: np.ndarray, bias: np.ndarray, act: Activation | None) -> None:
    """y = x*scale[c] + bias[c] (+act) as a 1x1 depthwise conv: the tool's dummy conv for standalone ops."""
    src = _whc8_input(ctx, op)
    c = src.dims[2]
    run = Run(m=c, conv_enable=CONV_DEPTHWISE, p=1)
    code = hw_activation(act)
    if code is None:
        raise UserError(f"op '{op.name}' applies activation {act.kind}, which DV700 conv runs cannot apply")
    set_act(run, *code)
    rw = RunWeights(np.broadcast_to(scale, (c,)).reshape(c, 1, 1, 1).astype(np.float32), bias.astype(np.float32))
    _single_run_layer(ctx, op, src, run, rw)


@lowers("channel_scale")
def lower_channel_scale(ctx: Lowering, op: Op) -> None:
    scale, bias = ctx.const(op.inputs[1]), ctx.const(op.inputs[2])
    if scale is None or bias is None or op.attrs.axis != 1:
        raise UserError(f"batch norm '{op.name}' needs constant parameters on axis 1")
    c = ctx.value(op).dims[2]
    _affine_run(
        ctx, op, np.broadcast_to(scale.reshape(-1), (c,)), np.broadcast_to(bias.reshape(-1), (c,)), op.attrs.act
    )


@lowers("prelu")
def lower_prelu(ctx: Lowering, op: Op) -> None:
    c = ctx.value(op).dims[2]
    _affine_run(ctx, op, np.ones(c, np.float32), np.zeros(c, np.float32), None)
    run = ctx.layers[-1].conv.runs[0]
    if run.actfunc != ACT_NONE:
        raise UserError(f"prelu '{op.name}' follows an activation in the same run; DV700 applies one per run")
    slope = ctx.const(op.inputs[1])
    if slope is None or slope.size not in (1, c):
        raise UserError(f"prelu '{op.name}' needs a constant per-channel or scalar slope")
    ctx.run_weights[id(run)].prelu = np.broadcast_to(np.asarray(slope, np.float32).reshape(-1), (c,)).copy()
    run.actfunc = ACT_PRELU


def _silu_mul(ctx: Lowering, op: Op) -> Op | None:
    """The Mul that makes x * sigmoid(x) of sigmoid `op` (its sole reader, multiplying by the sigmoid's own
    input), else None. DV700 has no SiLU and multiplies tensors only by per-channel vectors (spec §1.3)."""
    if op.attrs.act.kind != "sigmoid":
        return None
    user = ctx.sole_user(op.outputs[0])
    if user is None or user.kind != "eltwise" or user.attrs.kind != "mul" or user.attrs.act is not None:
        return None
    return user if sorted(user.inputs) == sorted([op.inputs[0], op.outputs[0]]) else None


@lowers("activation")
def lower_activation(ctx: Lowering, op: Op) -> None:
    act = op.attrs.act
    mul = _silu_mul(ctx, op)
    if mul is not None:  # x * sigmoid(x): one CPU custom layer
        _custom(ctx, op, "silu", {})
        ctx.values[mul.outputs[0]] = ctx.values.pop(op.outputs[0])
        ctx.consumed.add(mul.name)
        ctx.layers[-1].ops.append(mul.name)
        return
    if hw_activation(act) is not None:
        c = ctx.value(op).dims[2]
        _affine_run(ctx, op, np.ones(c, np.float32), np.zeros(c, np.float32), act)
        return
    if act.kind not in CUSTOM_ACTS:
        raise UserError(f"activation '{op.name}' ({act.kind}) has no DV700 or npuc custom-layer implementation")
    params = {"alpha": float(act.alpha), "beta": float(act.beta)} if act.kind == "hard_sigmoid" else {}
    _custom(ctx, op, act.kind, params)


def _custom(ctx: Lowering, op: Op, kind: str, params: dict[str, float], **extra: Value) -> None:
    """A CPU custom layer: reads and writes fp16 in the FPGA layout (elementwise or per channel)."""
    src = ctx.value(op)
    out = Value(ctx.new_buffer(src.nbytes), src.dims, src.layout, src.dtype, src.view, src.perm)
    layer = Layer(op.name, "LT_CUSTOM", 0, 0, 0, [], [], custom_type=kind, ops=[op.name])
    layer.custom_params = dict(params)
    ctx.add_layer(layer, src, out, **extra)
    ctx.values[op.outputs[0]] = out
