"""The exact form of npuc's QDQ export: onnxruntime reproduces the cv18xx_int8 reference bit for bit.

`write_exact_nodes` (called by passes.export.qdq.write_qdq_exact) transcribes a graph made by
`passes.quantization.quantize(..., "cv18xx_int8")` op by op into ONNX integer arithmetic, so every int8 tensor of npuc's
reference (compiler/kernels/quantized) appears in the model under its IR name with the same codes.

What is exact integer and what is not:

- exact integer: conv / depthwise (ConvInteger -> int32, + int32 bias in int64, wrapped to int32 as the TIU's
  accumulator wraps), gemm/matmul (the same wrap)
  (MatMulInteger), the QDM requantization `RoundingDivideByPOT(SRDHM(acc, M), r)` written as one floor
  division on non-negative int64, `sign(acc)·⌊(|acc|·M + 2^30 − [acc<0] + 2^(r−1)·2^31) / 2^(31+r)⌋`
  (the two roundings of gemmlowp nest into one floor); eltwise add/sub/max/min, concat, average pools
  (window sums by ConvInteger with a ones kernel, or ReduceSum; a pool whose windows count different numbers
  of cells has an (oh, ow) multiplier and shift) with int8 multipliers and the shift that rounds half up,
  `⌊(Σ m_i·x_i + 2^(r−1)) / 2^r⌋` via Mod/Sub/Div; eltwise mul (QDM on the int64 product); PReLU halves;
  ReLU/relu6 clamps; activations and LUT ops as a Gather on the op's 256-entry table indexed by code + 128;
  max pools, reshapes, transposes, slices, pads ... on the int8 codes.
- exact float: the boundary quantization of a float input, `clamp(round_half_away(x·f32(127/th)))` (the
  CPU `quant` routine), written as Mul, Round with a tie fix, Clip, then snapped onto the grid
  (`code·s`) and passed through a visible QuantizeLinear(scale s = th/127, zero point 0) that returns the
  code unchanged; int8 -> bf16 as DequantizeLinear(code, bf16(th/127)) rounded to bf16 (Cast to
  BFLOAT16 and back, round to nearest even); bf16 -> int8 as `round_half_even(bf16(x·bf16(127/th)))`
  snapped and QuantizeLinear'd the same way. A graph output leaves through DequantizeLinear (scale and
  zero point visible), bf16-rounded as the TPU does, or in plain float32 (`output_dequant="float32"`, the
  hbDNN SCALE rule the bpu target promises).
- plain float: ops the scheme left in bf16 run as float32 ONNX ops (softmax in float64) followed by a round to
  bf16; a float32 input entering a bf16 op directly is rounded to nearest here where the TPU truncates.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np
import onnx
from onnx import TensorProto

from npuc.compiler.coverage import per_op, stop_if_gaps
from npuc.compiler.errors import UnsupportedError
from npuc.compiler.ir import Graph, Op, QuantParams
from npuc.compiler.kernels.quantized.bf16 import pad_exclusion_factors
from npuc.compiler.kernels.quantized.bf16_act import bf16_constant
from npuc.compiler.kernels.quantized.bf16_conv import conv_transpose_pads, transposed_conv_filter
from npuc.compiler.kernels.quantized.int8 import pool_requant
from npuc.compiler.kernels.quantized.params import OpQuant
from npuc.compiler.numformats.bf16_fp16 import round_to_bf16
from npuc.passes.export.qdq_ops import EMITTERS, OnnxBuilder, activation

I64 = TensorProto.INT64
OUTPUT_DEQUANT = ("bf16", "float32")


def _i64(values: np.ndarray | int, shape: tuple[int, ...] | None = None) -> np.ndarray:
    a = np.asarray(values, np.int64)
    return a.reshape(shape) if shape is not None else a


class ExactBuilder:
    """The integer building blocks, on top of OnnxBuilder; every helper returns the new tensor's name."""

    def __init__(self, graph: Graph) -> None:
        self.b = OnnxBuilder(graph)
        self.g = graph
        self._consts: dict[tuple[str, str, tuple[int, ...], bytes], str] = {}

    def c(self, base: str, value: np.ndarray) -> str:
        """An initializer; equal constants under the same base name are written once."""
        a = np.asarray(value, order="C")  # scalars stay 0-d (per-tensor Q/DQ scales are scalars)
        key = (base, a.dtype.str, a.shape, a.tobytes())
        if key not in self._consts:
            name = self.b.fresh(base)
            self.b.initializers[name] = onnx.numpy_helper.from_array(a, name)
            self._consts[key] = name
        return self._consts[key]

    def cast(self, x: str, to: int, out: str | None = None) -> str:
        return self.b.node("Cast", [x], out, to=to)

    def floor_div(self, n: str, d: str) -> str:
        """⌊n / d⌋ for d > 0 on int64, whatever the sign of n: the remainder (Mod, fmod=0) is taken off first."""
        return self.b.node("Div", [self.b.node("Sub", [n, self.b.node("Mod", [n, d])]), d])

    def shift_round_half_up(self, x: str, m: np.ndarray, r: np.ndarray, shape: tuple[int, ...] | None) -> str:
        """cv18xx_apply_multiplier_rshift: `⌊(x·m + 2^(r−1)) / 2^r⌋` (x int64)."""
        m, r = np.asarray(m, np.int64), np.asarray(r, np.int64)
        if np.all(m == 1) and np.all(r == 0):
            return x
        half = np.where(r > 0, np.left_shift(np.int64(1), np.maximum(r - 1, 0)), 0)
        scaled = self.b.node("Mul", [x, self.c("mult", _i64(m, shape))])
        n = self.b.node("Add", [scaled, self.c("half", _i64(half, shape))])
        return self.floor_div(n, self.c("pot", _i64(np.left_shift(np.int64(1), r), shape)))

    def qdm(self, acc: str, m: np.ndarray, r: np.ndarray, shape: tuple[int, ...] | None) -> str:
        """RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(acc, m), r) for m in [0, 2^31), r in 0..31."""
        m, r = np.asarray(m, np.int64), np.asarray(r, np.int64)
        half = np.where(r > 0, np.left_shift(np.int64(1), np.maximum(r - 1, 0)), 0)
        bias = (np.int64(1) << 30) + half * (np.int64(1) << 31)
        negative = self.cast(self.b.node("Less", [acc, self.c("zero", np.int64(0))]), I64)
        product = self.b.node("Mul", [self.b.node("Abs", [acc]), self.c("qdm_mult", _i64(m, shape))])
        numerator = self.b.node("Sub", [self.b.node("Add", [product, self.c("qdm_bias", _i64(bias, shape))]), negative])
        magnitude = self.b.node("Div", [numerator, self.c("qdm_pot", _i64(np.left_shift(np.int64(1), r + 31), shape))])
        return self.b.node("Mul", [self.b.node("Sign", [acc]), magnitude])

    def finish(self, y: str, out: str, relu: bool = False, relu_max: int | None = None) -> str:
        """The kernels' `_finish`: fused ReLU (and relu6 bound) then saturation to int8."""
        lo = 0 if relu else -128
        hi = 127 if relu_max is None else min(127, relu_max)
        clipped = self.b.node("Clip", [y, self.c("lo", np.int64(lo)), self.c("hi", np.int64(max(hi, lo)))])
        return self.cast(clipped, TensorProto.INT8, out)

    def wrap_int32(self, acc: str) -> str:
        """An int64 sum reduced to int32 two's complement: the TIU's 32-bit conv / matmul accumulator wraps (a saturated
        bias beside large products leaves int32; compiler/numformats/rounding.wrap_int32)."""
        half, span = self.c("int32_half", np.int64(1) << 31), self.c("int32_span", np.int64(1) << 32)
        return self.b.node("Sub", [self.b.node("Mod", [self.b.node("Add", [acc, half]), span]), half])

    def to_i64(self, x: str) -> str:
        return self.cast(x, I64)

    def bf16(self, x: str, out: str | None = None) -> str:
        """float32 -> nearest-even bf16 value (as float32)."""
        return self.cast(self.cast(x, TensorProto.BFLOAT16), TensorProto.FLOAT, out)

    def codes_to_int8(self, codes: str, scale: float, out: str) -> str:
        """Integral float codes (already clamped to int8) through a visible QuantizeLinear at `scale`: `code·s`
        divided by s rounds back to `code` (relative error ~2^-23 against a distance of 1/2)."""
        s = self.c(f"{out}_scale", np.float32(scale))
        snapped = self.b.node("Mul", [codes, s])
        return self.b.node("QuantizeLinear", [snapped, s, self.c("zero_point_int8", np.int8(0))], out)

    def round_half_away(self, v: str) -> str:
        """C `round` on float32: Round (ties to even) except at exact ties, which go away from zero."""
        nearest = self.b.node("Round", [v])
        half = self.c("half", np.float32(0.5))
        tie = self.b.node("Equal", [self.b.node("Abs", [self.b.node("Sub", [v, nearest])]), half])
        away = self.b.node("Add", [v, self.b.node("Mul", [self.b.node("Sign", [v]), half])])  # exact at a tie
        return self.b.node("Where", [tie, away, nearest])


def _channel_shape(rank: int, axis: int, n: int) -> tuple[int, ...] | None:
    if n == 1:
        return None
    shape = [1] * rank
    shape[axis] = n
    return tuple(shape)


def _relu(op: Op) -> bool:
    act = getattr(op.attrs, "act", None)
    return act is not None and act.kind in ("relu", "clip")


# ---------------------------------------------------------------------------------------------------------
# int8 ops: each writes op.outputs[0] as int8 from the int8 (or int32 bias) ONNX tensors `ins`

Int8Emitter = Callable[[ExactBuilder, Op, OpQuant, list[str]], None]


def _conv(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    a = op.attrs
    attrs = {"strides": list(a.strides), "pads": list(a.pads), "dilations": list(a.dilations), "group": a.group}
    acc = e.to_i64(e.b.node("ConvInteger", ins[:2], **attrs))
    if len(ins) > 2:
        acc = e.b.node("Add", [acc, e.b.node("Reshape", [e.to_i64(ins[2]), e.c("bias_shape", _i64([1, -1, 1, 1]))])])
    shape = _channel_shape(4, 1, np.asarray(q.multiplier).size)
    qdm = e.qdm(e.wrap_int32(acc), np.ravel(q.multiplier), np.ravel(q.rshift), shape)
    e.finish(qdm, op.outputs[0], _relu(op), q.relu_max)


def _conv_transpose(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    """As the int8 kernel computes it: a stride-1 ConvInteger over the input with zeros inserted between its
    rows and columns (Reshape, Pad, Reshape, Slice on the codes), with the flipped, channel-swapped filters."""
    a = op.attrs
    w = e.g.const(op.inputs[1])
    pads = conv_transpose_pads(a, *w.shape[2:])
    if min(pads) < 0:
        raise UnsupportedError(f"op '{op.name}': transposed-conv pads beyond dilation·(k−1) have no exact ONNX form")
    n, c, h, wd = e.g.shape(op.inputs[0])
    sh, sw = a.strides
    x = ins[0]
    if (sh, sw) != (1, 1):
        x = e.b.node("Reshape", [x, e.c("spread_6d", _i64([n, c, h, 1, wd, 1]))])
        x = e.b.node("Pad", [x, e.c("spread_pads", _i64([0, 0, 0, 0, 0, 0, 0, 0, 0, sh - 1, 0, sw - 1]))])
        x = e.b.node("Reshape", [x, e.c("spread_4d", _i64([n, c, h * sh, wd * sw]))])
        ends = e.c("spread_ends", _i64([(h - 1) * sh + 1, (wd - 1) * sw + 1]))
        x = e.b.node("Slice", [x, e.c("spread_starts", _i64([0, 0])), ends, e.c("hw", _i64([2, 3]))])
    filters = e.c(f"{op.inputs[1]}_as_conv", transposed_conv_filter(np.asarray(w, np.int8), a.group))
    attrs = {"pads": list(pads), "dilations": list(a.dilations), "group": a.group}
    acc = e.to_i64(e.b.node("ConvInteger", [x, filters], **attrs))
    if len(ins) > 2:
        acc = e.b.node("Add", [acc, e.b.node("Reshape", [e.to_i64(ins[2]), e.c("bias_shape", _i64([1, -1, 1, 1]))])])
    shape = _channel_shape(4, 1, np.asarray(q.multiplier).size)
    qdm = e.qdm(e.wrap_int32(acc), np.ravel(q.multiplier), np.ravel(q.rshift), shape)
    e.finish(qdm, op.outputs[0], _relu(op), q.relu_max)


def _gemm(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    a_name, b_name = ins[0], ins[1]
    if op.kind == "gemm":
        if op.attrs.trans_a:
            a_name = e.b.node("Transpose", [a_name], perm=[1, 0])
        if op.attrs.trans_b:
            b_name = e.b.node("Transpose", [b_name], perm=[1, 0])
    acc = e.to_i64(e.b.node("MatMulInteger", [a_name, b_name]))
    if len(ins) > 2:
        acc = e.b.node("Add", [acc, e.to_i64(ins[2])])
    qdm = e.qdm(e.wrap_int32(acc), np.ravel(q.multiplier), np.ravel(q.rshift), None)
    e.finish(qdm, op.outputs[0], _relu(op), q.relu_max)


def _rescaled(e: ExactBuilder, q: OpQuant, ins: list[str]) -> list[str]:
    """Each input at the output threshold: `⌊(x_i·m_i + 2^(r_i−1)) / 2^r_i⌋` (int64, not clamped)."""
    shifts = np.broadcast_to(np.asarray(q.rshift).ravel(), (len(ins),))
    mults = np.asarray(q.multiplier).ravel()
    return [e.shift_round_half_up(e.to_i64(x), m, r, None) for x, m, r in zip(ins, mults, shifts)]


def _eltwise(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    kind = op.attrs.kind
    xs = [e.to_i64(x) for x in ins]
    if kind in ("add", "sub"):  # Σ m_i·x_i (sub: a negative multiplier), one shift
        terms = [e.b.node("Mul", [x, e.c("mult", np.int64(m))]) for x, m in zip(xs, np.ravel(q.multiplier))]
        total = terms[0]
        for t in terms[1:]:
            total = e.b.node("Add", [total, t])
        y = e.shift_round_half_up(total, 1, int(np.asarray(q.rshift)), None)
    elif kind in ("max", "min"):
        y = e.b.node("Max" if kind == "max" else "Min", _rescaled(e, q, ins))
    elif kind == "mul":
        y = xs[0]
        for x in xs[1:]:
            y = e.b.node("Mul", [y, x])
        y = e.qdm(y, np.ravel(q.multiplier), np.ravel(q.rshift), None)
    else:
        raise UnsupportedError(f"op '{op.name}': int8 eltwise '{kind}' has no exact ONNX form")
    shape = np.array(e.g.shape(op.outputs[0]), np.int64)
    if tuple(np.broadcast_shapes(*(e.g.shape(n) for n in op.inputs))) != tuple(shape):
        y = e.b.node("Expand", [y, e.c("shape", shape)])
    e.finish(y, op.outputs[0], _relu(op), q.relu_max)


def _concat(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    shifts = np.broadcast_to(np.asarray(q.rshift).ravel(), (len(ins),))
    parts = []
    for x, m, r in zip(ins, np.asarray(q.multiplier).ravel(), shifts):
        if m == 1 and r == 0:  # input already at the output threshold
            parts.append(x)
        else:
            parts.append(e.finish(e.shift_round_half_up(e.to_i64(x), m, r, None), e.b.fresh(f"{x}_rescaled")))
    e.b.node("Concat", parts, op.outputs[0], axis=op.attrs.axis)


def _window_sums(e: ExactBuilder, op: Op, x: str) -> str:
    """int64 sums of every average-pool window (zero padding, ceil_mode windows extended past the end)."""
    a = op.attrs
    n, c, h, w = e.g.shape(op.inputs[0])
    oh, ow = e.g.shape(op.outputs[0])[2:]
    top, left = a.pads[0], a.pads[1]
    need = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip((oh, ow), a.strides, a.dilations, a.kernel)]
    pads = [top, left, max(need[0] - h - top, 0), max(need[1] - w - left, 0)]
    ones = e.c("window", np.ones((c, 1, *a.kernel), np.int8))
    sums = e.b.node("ConvInteger", [x, ones], strides=list(a.strides), pads=pads, dilations=list(a.dilations), group=c)
    return e.to_i64(sums)


def _pool(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    a = op.attrs
    if a.mode == "max":
        attrs = {"kernel_shape": list(a.kernel), "strides": list(a.strides), "pads": list(a.pads)}
        attrs.update(ceil_mode=int(a.ceil_mode), dilations=list(a.dilations))
        y = e.to_i64(e.b.node("MaxPool", ins, **attrs))
    else:
        m, r = pool_requant(q)  # per output position when windows count different numbers of cells
        shape = (1, 1, *m.shape) if m.ndim == 2 else None
        y = e.shift_round_half_up(_window_sums(e, op, ins[0]), m, r, shape)
    e.finish(y, op.outputs[0], _relu(op), q.relu_max)


def _global_pool(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    axes = list(range(2, len(e.g.shape(op.inputs[0]))))
    if op.attrs.mode == "max":
        e.b.node("ReduceMax", [ins[0]], op.outputs[0], axes=axes, keepdims=1)
        return
    total = e.b.node("ReduceSum", [e.to_i64(ins[0]), e.c("axes", np.array(axes, np.int64))], keepdims=1)
    e.finish(e.shift_round_half_up(total, q.multiplier, q.rshift, None), op.outputs[0])


def _prelu(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    """Positive and negative halves: each times its int8 per-channel weight, QDM, saturated; then added."""
    x = e.to_i64(ins[0])
    rank = len(e.g.shape(op.inputs[0]))
    weights = e.g.const(op.inputs[1]).astype(np.int64)
    channels = weights.shape[1]
    shape = _channel_shape(rank, 1, channels) if rank > 1 else None
    zero = e.c("zero", np.int64(0))
    halves = []
    for i, part in enumerate((e.b.node("Max", [x, zero]), e.b.node("Min", [x, zero]))):
        scaled = e.b.node("Mul", [part, e.c("prelu_weight", _i64(weights[i], shape))])
        y = e.qdm(scaled, q.multiplier[i], q.rshift[i], shape)
        halves.append(e.b.node("Clip", [y, e.c("lo", np.int64(-128)), e.c("hi", np.int64(127))]))
    e.finish(e.b.node("Add", halves), op.outputs[0])


def _lookup(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    codes_by_byte = np.arange(256, dtype=np.uint8).view(np.int8)
    table = np.asarray(q.lut, np.int8) if q.lut is not None else np.maximum(codes_by_byte, 0)  # relu: a max
    by_code = table[np.r_[128:256, 0:128]]  # entry k is the result for code k - 128
    index = e.b.node("Add", [e.cast(ins[0], TensorProto.INT32), e.c("lut_offset", np.int32(128))])
    e.b.node("Gather", [e.c(f"{op.name}_table", by_code), index], op.outputs[0], axis=0)


def _pad(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    pads = e.c("pads", np.array(op.attrs.pads, np.int64))
    e.b.node("Pad", [ins[0], pads, e.c("pad_value", np.int8(0))], op.outputs[0], mode="constant")


def _moved(e: ExactBuilder, op: Op, q: OpQuant, ins: list[str]) -> None:
    """Ops that only move codes: the float emitter works on int8 data unchanged."""
    EMITTERS[op.kind](e.b, op, ins, op.outputs[0])


INT8_EMITTERS: Mapping[str, Int8Emitter] = MappingProxyType(
    {
        "conv2d": _conv,
        "conv_transpose2d": _conv_transpose,
        "gemm": _gemm,
        "matmul": _gemm,
        "eltwise": _eltwise,
        "concat": _concat,
        "pool2d": _pool,
        "global_pool": _global_pool,
        "prelu": _prelu,
        "activation": _lookup,
        "lut": _lookup,
        "pad": _pad,
        **{kind: _moved for kind in ("reshape", "transpose", "slice", "expand", "gather", "resize")},  # nearest only
    }
)


# ---------------------------------------------------------------------------------------------------------
# Format conversions (cast ops) and bf16 ops


def _scalar(value: float | np.ndarray) -> float:
    """A per-tensor number that QuantParams may hold as a 1-element array."""
    return float(np.asarray(value).reshape(-1)[0])


def _threshold(p: QuantParams) -> np.float32:
    return np.float32(_scalar(p.threshold))


def _float_to_int8(e: ExactBuilder, x: str, dst: QuantParams, out: str) -> None:
    """The CPU `quant` routine: `clamp(round_half_away(x·f32(127/th)))`, then a visible QuantizeLinear."""
    v = e.b.node("Mul", [x, e.c(f"{out}_inv_scale", np.float32(127.0) / _threshold(dst))])
    codes = e.b.node("Clip", [e.round_half_away(v), e.c("lo", np.float32(-128)), e.c("hi", np.float32(127))])
    e.codes_to_int8(codes, _scalar(dst.scale), out)


def _bf16_to_int8(e: ExactBuilder, x: str, dst: QuantParams, out: str) -> None:
    """`round_half_even(bf16(x·bf16(127/th)))` saturated, then a visible QuantizeLinear."""
    factor = round_to_bf16(np.float32(127.0) / _threshold(dst))
    v = e.bf16(e.b.node("Mul", [x, e.c(f"{out}_inv_scale", np.float32(factor))]))
    codes = e.b.node("Clip", [e.b.node("Round", [v]), e.c("lo", np.float32(-128)), e.c("hi", np.float32(127))])
    e.codes_to_int8(codes, _scalar(dst.scale), out)


def _int8_to_float(e: ExactBuilder, x: str, src: QuantParams, out: str, rounding: str) -> None:
    """DequantizeLinear; `bf16`: at scale bf16(th/127), the product rounded to bf16 (the TPU's dequantize)."""
    zero = e.c("zero_point_int8", np.int8(0))
    if rounding == "float32":
        e.b.node("DequantizeLinear", [x, e.c(f"{x}_scale", np.float32(_scalar(src.scale))), zero], out)
        return
    step = round_to_bf16(_threshold(src) / np.float32(127.0))
    e.bf16(e.b.node("DequantizeLinear", [x, e.c(f"{x}_scale", np.float32(step)), zero]), out)


def _bf16_pool(e: ExactBuilder, op: Op, ins: list[str]) -> None:
    """bf16 average pools: window sum times bf16(1/count) (the TPU has no divider), rounded to bf16."""
    shape = e.g.shape(op.inputs[0])
    if op.kind == "global_pool":
        count = int(np.prod(shape[2:]))
        total = e.b.node("ReduceSum", [ins[0], e.c("axes", np.arange(2, len(shape), dtype=np.int64))], keepdims=1)
    else:
        a = op.attrs
        count = a.kernel[0] * a.kernel[1]
        h, w = shape[2:]
        oh, ow = e.g.shape(op.outputs[0])[2:]
        need = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip((oh, ow), a.strides, a.dilations, a.kernel)]
        pads = [a.pads[0], a.pads[1], max(need[0] - h - a.pads[0], 0), max(need[1] - w - a.pads[1], 0)]
        ones = e.c("window", np.ones((shape[1], 1, *a.kernel), np.float32))
        total = e.b.node("Conv", [ins[0], ones], strides=list(a.strides), pads=pads, dilations=list(a.dilations),
                         group=shape[1])  # fmt: skip
    factor = round_to_bf16(np.float32(1.0) / np.float32(count))
    y = e.bf16(e.b.node("Mul", [total, e.c("avg_factor", np.float32(factor))]))
    act = getattr(op.attrs, "act", None) if op.kind == "pool2d" else None
    # an average that excludes the padding: each output times bf16(kh*kw/count), rounded again
    excluded = pad_exclusion_factors(op, shape[2:], e.g.shape(op.outputs[0])[2:]) if op.kind == "pool2d" else None
    out = op.outputs[0] if excluded is None else e.b.fresh(f"{op.outputs[0]}_kk_avg")
    if act is None:
        e.b.node("Identity", [y], out)
    else:
        e.bf16(activation(e.b, y, e.b.fresh(f"{op.outputs[0]}_act"), act), out)
    if excluded is not None:
        e.bf16(e.b.node("Mul", [out, e.c("pad_exclusion", excluded[None, None])]), op.outputs[0])


def _with_bf16_constants(op: Op) -> Op:
    """A bf16 activation op with the bf16 constants the TIU multiplies and compares by (quantized/bf16_act.py)."""
    act = getattr(op.attrs, "act", None)
    if op.kind != "activation" or act is None or act.kind not in ("leaky_relu", "hard_sigmoid", "clip"):
        return op
    fields = {k: float(bf16_constant(getattr(act, k))) for k in ("alpha", "beta", "lo", "hi")}
    rounded = copy.copy(op)
    rounded.attrs = dataclasses.replace(op.attrs, act=dataclasses.replace(act, **fields))
    return rounded


# bf16 ops computed in float64 and rounded once, here as in their reference kernel (compiler/kernels/quantized/
# bf16.py): onnxruntime's float32 exp is not numpy's, and a last-bit difference moves a bf16 rounding (YOLOv8n's
# DFL softmax, onnxruntime 1.32: 2 of 46200 box values)
IN_DOUBLE = frozenset({"softmax"})


class _ExactWriter:
    def __init__(self, e: ExactBuilder, graph: Graph, output_dequant: str) -> None:
        self.g, self.e = graph, e
        self.output_dequant = output_dequant
        self.value: dict[str, str] = {}  # IR tensor -> ONNX tensor holding it

    def view(self, name: str) -> str:
        if not name:
            return ""
        if name in self.value:
            return self.value[name]
        tensor = self.g.tensors[name]
        if tensor.data is None:
            raise RuntimeError(f"tensor '{name}' is read before anything produces it")
        data = tensor.data.astype(np.float32) if np.issubdtype(tensor.data.dtype, np.floating) else tensor.data
        self.e.b.initializers[name] = onnx.numpy_helper.from_array(np.ascontiguousarray(data), name)
        self.value[name] = name
        return name

    def emit(self, op: Op) -> None:
        q: OpQuant | None = getattr(op.attrs, "quant", None)
        if q is None:
            raise RuntimeError(f"op '{op.name}' ({op.kind}) is not quantized; run passes.quantization.quantize first")
        if len(op.outputs) != 1:
            raise UnsupportedError(f"op '{op.name}' ({op.kind}) has {len(op.outputs)} outputs; QDQ export needs one")
        data_only = op.kind == "prelu" and q.mode == "int8"  # its weights are read as numbers, not as a tensor
        ins = [self.view(n) if not (data_only and i == 1) else "" for i, n in enumerate(op.inputs)]
        out = op.outputs[0]
        if q.mode == "int8":
            emitter = INT8_EMITTERS.get(op.kind)
            if emitter is None:
                raise UnsupportedError(f"op '{op.name}': int8 {op.kind} has no exact ONNX form; use the plain form")
            emitter(self.e, op, q, ins)
        elif q.mode == "cast":
            self.cast(op, q, ins[0])
        elif op.kind in ("pool2d", "global_pool") and op.attrs.mode == "avg":
            _bf16_pool(self.e, op, ins)
        elif self.g.tensors[out].dtype != "float32":  # integer data (shapes, indices) is not rounded
            EMITTERS[op.kind](self.e.b, op, ins, out)
        elif op.kind in IN_DOUBLE:
            wide = [self.e.cast(x, TensorProto.DOUBLE) if x else x for x in ins]
            pre = self.e.b.fresh(f"{out}_double")
            EMITTERS[op.kind](self.e.b, op, wide, pre)
            self.e.bf16(self.e.cast(pre, TensorProto.FLOAT), out)
        else:
            pre = self.e.b.fresh(f"{out}_float")
            EMITTERS[op.kind](self.e.b, _with_bf16_constants(op), ins, pre)
            self.e.bf16(pre, out)
        self.value[out] = out

    def cast(self, op: Op, q: OpQuant, x: str) -> None:
        src, dst, out = q.inputs[0], q.output, op.outputs[0]
        key = (src.scheme if src else "float32", dst.scheme if dst else "float32")
        if key == ("float32", "int8_sym"):
            _float_to_int8(self.e, x, dst, out)
        elif key == ("bf16", "int8_sym"):
            _bf16_to_int8(self.e, x, dst, out)
        elif key[0] == "int8_sym":
            rounding = self.output_dequant if out in self.g.outputs else "bf16"
            _int8_to_float(self.e, x, src, out, rounding)
        elif key == ("float32", "bf16"):
            self.e.bf16(x, out)  # the TPU truncates; nearest-even here (see the module note)
        else:
            self.e.b.node("Identity", [x], out)


def int8_value_infos(graph: Graph) -> list[onnx.ValueInfoProto]:
    """Shapes of the int8 activations, each documented with its scale (th/127) and zero point 0."""
    infos = []
    for name, t in graph.tensors.items():
        if t.dtype == "int8" and not t.is_const and t.quant is not None and name not in graph.outputs:
            scale, th = _scalar(t.quant.scale), _scalar(t.quant.threshold)
            doc = f"int8 code; value = code * {scale:.9g} (threshold {th:.9g}/127)"
            infos.append(onnx.helper.make_tensor_value_info(name, TensorProto.INT8, list(t.shape), doc))
    return infos


def write_exact_nodes(
    e: ExactBuilder, graph: Graph, inputs: Mapping[str, str], output_dequant: str = "bf16"
) -> dict[str, str]:
    """Append `graph` (from passes.quantization.quantize) in exact integer form to `e`; `inputs` maps each graph input
    to the ONNX tensor holding its float32 value. Returns IR tensor -> ONNX tensor for everything written."""
    if output_dequant not in OUTPUT_DEQUANT:
        raise ValueError(f"output_dequant must be one of {OUTPUT_DEQUANT}")
    w = _ExactWriter(e, graph, output_dequant)
    w.value.update(inputs)
    for op in graph.ops:
        with per_op(op):
            w.emit(op)
    stop_if_gaps()
    return w.value
