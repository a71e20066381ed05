"""The cv18xx quantization rules (specs/quant.md §1.5): int8 per op kind — per-channel conv weights with int32
bias and QDM multipliers, per-tensor multipliers for eltwise, pool, concat, lookup tables for activations —
and bf16 for every op. Registered as the schemes `cv18xx_int8` (bf16 fallback) and `cv18xx_bf16`, which
`passes.quantization.quantize` applies: npuc's int8/bf16 reference (compiler/kernels/quantized) runs them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import numpy as np

from npuc.compiler import ops
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op
from npuc.compiler.kernels.activation import apply_activation
from npuc.compiler.kernels.quantized.bf16_conv import conv_filter_as_transposed, transposed_conv_filter
from npuc.compiler.kernels.quantized.int8 import window_cell_counts
from npuc.compiler.kernels.quantized.params import OpQuant
from npuc.compiler.numformats.cv18xx_int8 import (
    cv18xx_eltwise_multipliers,
    cv18xx_per_tensor_multiplier,
    cv18xx_qdm_multiplier,
    cv18xx_quantize_activation,
    cv18xx_quantize_bias_int32,
    cv18xx_quantize_conv,
)
from npuc.compiler.numformats.rounding import round_half_away
from npuc.passes.quantization.quant_context import BF16, Lowered, QuantContext, Rule, Scheme, int8_params
from npuc.passes.quantization.quantize import register_scheme

# ---------------------------------------------------------------------------------------------------------
# cv18xx int8 rules


def _relu_max(act: ops.Activation | None, th_y: float) -> int | None:
    """int8 upper bound of a fused relu6-style clip (None: plain relu or no clip)."""
    if act is None or act.kind != "clip" or not np.isfinite(act.hi):
        return None
    return int(min(127, round_half_away(np.float32(act.hi) * (np.float32(127) / np.float32(th_y)))))


def int8_act_ok(op: Op) -> bool:
    act = ops.fused_act(op)
    return act is None or act.kind == "relu" or (act.kind == "clip" and act.lo == 0.0)


def _thresholds(ctx: QuantContext, op: Op, names: Iterable[str]) -> list[float] | None:
    values = [ctx.threshold(n) for n in names]
    return None if any(v is None for v in values) else [float(v) for v in values]


def _int8_conv(ctx: QuantContext, op: Op) -> Lowered | None:
    """Per output channel of the conv the TIU runs. A transposed conv runs as a conv with flipped,
    channel-swapped filters; its int8 filters are stored back in the ConvTranspose layout (IC, OC/group, KH, KW)."""
    g = ctx.graph
    th = _thresholds(ctx, op, [op.inputs[0], op.outputs[0]])
    weight = g.const(op.inputs[1])
    bias = g.const(op.inputs[2]) if len(op.inputs) > 2 else None
    if th is None or weight is None or (len(op.inputs) > 2 and bias is None) or not int8_act_ok(op):
        return None
    transposed = op.kind == "conv_transpose2d"
    if transposed:
        weight = transposed_conv_filter(weight, op.attrs.group)
    p = cv18xx_quantize_conv(weight, bias, th[0], th[1])
    w_q = conv_filter_as_transposed(p.weight, op.attrs.group) if transposed else p.weight
    inputs = [ctx.as_int8(op.inputs[0]), ctx.const(f"{op.inputs[1]}_int8", w_q, None)]
    if p.bias is not None:
        inputs.append(ctx.const(f"{op.inputs[2]}_int32", p.bias, None))
    q = OpQuant("int8", (int8_params(th[0]),), int8_params(th[1]), p.multiplier, p.rshift)
    q.relu_max = _relu_max(ops.fused_act(op), th[1])
    return Lowered(inputs, q)


def _int8_gemm(ctx: QuantContext, op: Op) -> Lowered | None:
    """FC: one QDM multiplier for the whole weight (tpu-mlir's per-tensor FC), int32 bias."""
    g = ctx.graph
    th = _thresholds(ctx, op, [op.inputs[0], op.outputs[0]])
    weight = g.const(op.inputs[1])
    bias = g.const(op.inputs[2]) if len(op.inputs) > 2 else None
    if op.kind == "gemm" and (op.attrs.alpha != 1.0 or (bias is not None and op.attrs.beta != 1.0)):
        return None
    if th is None or weight is None or (len(op.inputs) > 2 and bias is None) or not int8_act_ok(op):
        return None
    peak_bias = None if bias is None else np.abs(bias).max(keepdims=True).reshape(1)
    p = cv18xx_quantize_conv(weight.reshape(1, -1), peak_bias, th[0], th[1])
    inputs = [ctx.as_int8(op.inputs[0]), ctx.const(f"{op.inputs[1]}_int8", p.weight.reshape(weight.shape), None)]
    if bias is not None:
        scale = 127.0 / float(np.float32(th[1])) * np.ldexp(1.0, int(p.rshift[0]) + 31) / float(p.multiplier[0])
        inputs.append(ctx.const(f"{op.inputs[2]}_int32", cv18xx_quantize_bias_int32(bias, scale), None))
    q = OpQuant("int8", (int8_params(th[0]),), int8_params(th[1]), p.multiplier, p.rshift)
    q.relu_max = _relu_max(ops.fused_act(op), th[1])
    return Lowered(inputs, q)


_ELTWISE_COEFFS = MappingProxyType({"add": 1.0, "sub": -1.0, "max": 1.0, "min": 1.0})


def _int8_eltwise(ctx: QuantContext, op: Op) -> Lowered | None:
    kind = op.attrs.kind
    th = _thresholds(ctx, op, [*op.inputs, op.outputs[0]])
    if th is None or not int8_act_ok(op) or kind not in (*_ELTWISE_COEFFS, "mul"):
        return None
    th_in, th_out = th[:-1], th[-1]
    if kind == "mul":
        real = np.prod(np.float64(th_in)) / (127.0 ** (len(th_in) - 1) * th_out)
        multiplier, rshift = cv18xx_qdm_multiplier(np.array([real]))
    else:
        coeffs = np.array([1.0] + [_ELTWISE_COEFFS[kind]] * (len(th_in) - 1), np.float32)
        multiplier, rshift = cv18xx_eltwise_multipliers(np.array(th_in, np.float32), th_out, coeffs)
    q = OpQuant("int8", tuple(int8_params(t) for t in th_in), int8_params(th_out), multiplier, np.asarray(rshift))
    q.relu_max = _relu_max(ops.fused_act(op), th_out)
    return Lowered([ctx.as_int8(n) for n in op.inputs], q)


def _requant_factors(th_in: list[float], th_out: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-input (multiplier, rshift) taking each input to the output threshold; (1, 0) when equal."""
    mults, shifts = [], []
    for t in th_in:
        if np.float32(t) == np.float32(th_out):
            mults.append(1), shifts.append(0)
            continue
        m, r = cv18xx_per_tensor_multiplier(np.float32(t) / np.float32(th_out), 127)
        mults.append(int(m)), shifts.append(int(r))
    return np.array(mults, np.int64), np.array(shifts, np.int64)


def _int8_concat(ctx: QuantContext, op: Op) -> Lowered | None:
    th_in = _thresholds(ctx, op, op.inputs)
    if th_in is None:
        return None
    th_out = ctx.th.thresholds.get(op.outputs[0], max(th_in))
    multiplier, rshift = _requant_factors(th_in, th_out)
    q = OpQuant("int8", tuple(int8_params(t) for t in th_in), int8_params(th_out), multiplier, rshift)
    return Lowered([ctx.as_int8(n) for n in op.inputs], q)


def _int8_passthrough(ctx: QuantContext, op: Op) -> Lowered | None:
    """Ops that only move or select codes: the output keeps the input threshold (forward calibration)."""
    th = ctx.threshold(op.inputs[0])
    if th is None or getattr(op.attrs, "act", None) is not None and not int8_act_ok(op):
        return None
    if op.kind == "pad" and (op.attrs.mode != "constant" or op.attrs.value != 0.0):
        return None
    return Lowered([ctx.as_int8(op.inputs[0]), *op.inputs[1:]], OpQuant("int8", (int8_params(th),), int8_params(th)))


def _int8_resize(ctx: QuantContext, op: Op) -> Lowered | None:
    """Nearest resizing copies codes (the output keeps the input threshold); other modes interpolate: bf16."""
    return _int8_passthrough(ctx, op) if op.attrs.mode == "nearest" else None


def _int8_pool(ctx: QuantContext, op: Op) -> Lowered | None:
    if op.attrs.mode == "max":
        return _int8_passthrough(ctx, op)
    th = _thresholds(ctx, op, [op.inputs[0], op.outputs[0]])
    if th is None or not int8_act_ok(op):
        return None
    shape = ctx.graph.shape(op.inputs[0])
    count = op.attrs.kernel[0] * op.attrs.kernel[1] if op.kind == "pool2d" else int(np.prod(shape[2:]))
    ratio = np.float32(th[0]) / np.float32(th[1])
    multiplier, rshift = cv18xx_per_tensor_multiplier(ratio / count, 127)
    q = OpQuant("int8", (int8_params(th[0]),), int8_params(th[1]), multiplier, rshift)
    # windows that count fewer cells (padding excluded, ceil_mode overhang): one pair per output position
    counts = window_cell_counts(op, shape[2:], ctx.graph.shape(op.outputs[0])[2:])
    if counts is not None:
        q.position_multiplier, q.position_rshift = cv18xx_per_tensor_multiplier(
            ratio / np.maximum(counts, 1).astype(np.float32), 127
        )
    q.relu_max = _relu_max(getattr(op.attrs, "act", None), th[1])
    return Lowered([ctx.as_int8(op.inputs[0])], q)


def int8_lut(fn: Callable[[np.ndarray], np.ndarray], th_x: float, th_y: float) -> np.ndarray:
    """256 int8 entries indexed by the input byte: `q(f(i·th_x/127))` for every code i."""
    codes = np.arange(256, dtype=np.int64)
    codes = np.where(codes < 128, codes, codes - 256)
    x = codes.astype(np.float32) * (np.float32(th_x) / np.float32(127))
    with np.errstate(invalid="ignore", divide="ignore"):
        y = fn(x).astype(np.float32)
    # codes outside the function's domain (sqrt/log of a negative) never occur in a calibrated tensor, but the
    # table must still hold defined bytes: NaN becomes 0, the rest saturates (deterministic on any machine)
    limit = np.float32(2 * th_y)  # beyond it every value saturates alike
    return cv18xx_quantize_activation(np.clip(np.nan_to_num(y, nan=0.0, posinf=limit, neginf=-limit), -limit, limit),
                                      th_y)  # fmt: skip


def _int8_activation(ctx: QuantContext, op: Op) -> Lowered | None:
    act = op.attrs.act if op.kind == "activation" else None
    th_x = ctx.threshold(op.inputs[0])
    th_y = 1.0 if act is not None and act.kind == "sigmoid" else ctx.th.thresholds.get(op.outputs[0])
    if act is not None and act.kind == "relu" and th_y is None:
        th_y = th_x
    if th_x is None or th_y is None:
        return None
    if op.kind == "lut":
        table = np.asarray(op.attrs.table, np.int8)
    elif act.kind == "relu" and np.float32(th_x) == np.float32(th_y):
        table = None
    else:
        table = int8_lut(lambda x: apply_activation(x, act), th_x, th_y)
    return Lowered([ctx.as_int8(op.inputs[0])], OpQuant("int8", (int8_params(th_x),), int8_params(th_y), lut=table))


def _scale_factors(scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A real per-channel scale as (int8 weight, QDM multiplier, rshift): weight = ±ceil(|s|) so the QDM
    part |s| / ceil(|s|) stays at most 1 (a zero scale keeps weight 1 and multiplies by 0)."""
    scale = np.asarray(scale, np.float64)
    magnitude = np.maximum(np.ceil(np.abs(scale)), 1.0)
    if magnitude.max() > 127:
        raise UserError(f"a PReLU rescale factor of {magnitude.max():g} does not fit an int8 weight")
    weight = np.where(scale < 0, -magnitude, magnitude).astype(np.int8)
    multiplier, rshift = cv18xx_qdm_multiplier(np.abs(scale) / magnitude)
    multiplier = np.where(scale == 0, 0, multiplier)
    return weight, np.asarray(multiplier, np.int64), np.asarray(rshift, np.int64)


def _int8_prelu(ctx: QuantContext, op: Op) -> Lowered | None:
    """y = q(x+ · th_x/th_y) + q(x- · slope_c · th_x/th_y): each half a per-channel 1x1 depthwise requant."""
    th = _thresholds(ctx, op, [op.inputs[0], op.outputs[0]])
    slope = ctx.graph.const(op.inputs[1])
    channels = ctx.graph.shape(op.inputs[0])[1] if len(ctx.graph.shape(op.inputs[0])) > 1 else 1
    if th is None or slope is None or slope.size not in (1, channels):
        return None
    ratio = np.float64(np.float32(th[0])) / np.float64(np.float32(th[1]))
    slopes = np.broadcast_to(np.asarray(slope, np.float64).reshape(-1), (channels,))
    w_pos, m_pos, r_pos = _scale_factors(np.full(channels, ratio))
    w_neg, m_neg, r_neg = _scale_factors(slopes * ratio)
    weights = ctx.const(f"{op.inputs[1]}_int8", np.stack([w_pos, w_neg]), None)
    q = OpQuant("int8", (int8_params(th[0]),), int8_params(th[1]), np.stack([m_pos, m_neg]), np.stack([r_pos, r_neg]))
    return Lowered([ctx.as_int8(op.inputs[0]), weights], q)


CV18XX_INT8_RULES: Mapping[str, Rule] = MappingProxyType(
    {
        "prelu": _int8_prelu,
        "conv2d": _int8_conv,
        "conv_transpose2d": _int8_conv,
        "gemm": _int8_gemm,
        "matmul": _int8_gemm,
        "eltwise": _int8_eltwise,
        "concat": _int8_concat,
        "resize": _int8_resize,
        "pool2d": _int8_pool,
        "global_pool": _int8_pool,
        "activation": _int8_activation,
        "lut": _int8_activation,
        **{kind: _int8_passthrough for kind in ("reshape", "transpose", "slice", "split", "pad", "expand", "gather")},
    }
)


# ---------------------------------------------------------------------------------------------------------
# bf16 rule: every op, float constants rounded to bf16 (a conv/gemm bias stays fp32, as the TIU adds it)

_FP32_BIAS_KINDS = ("conv2d", "conv_transpose2d", "gemm")


def _bf16_any(ctx: QuantContext, op: Op) -> Lowered | None:
    inputs = []
    for i, name in enumerate(op.inputs):
        if not name:
            inputs.append(name)
        elif i == 2 and op.kind in _FP32_BIAS_KINDS and ctx.graph.tensors[name].is_const:
            inputs.append(name)
        else:
            inputs.append(ctx.as_bf16(name))
    formats = tuple(ctx.format_of(n) if n else None for n in inputs)
    return Lowered(inputs, OpQuant("bf16", formats, BF16))


BF16_RULES: Mapping[str, Rule] = MappingProxyType({kind: _bf16_any for kind in ops.OPS})


def bf16_act_ok(op: Op) -> bool:
    """A fused activation every bf16 TIU op applies itself: ReLU (its relu flag), nothing else."""
    act = ops.fused_act(op)
    return act is None or act.kind == "relu" or (act.kind == "clip" and act.lo == 0.0 and act.hi == np.inf)


register_scheme(Scheme("cv18xx_int8", CV18XX_INT8_RULES, fallback="cv18xx_bf16", keeps_act=int8_act_ok))
register_scheme(Scheme("cv18xx_bf16", BF16_RULES, keeps_act=bf16_act_ok))
