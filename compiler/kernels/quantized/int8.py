"""cv18xx int8 kernels: integer arithmetic exactly as the TPU computes it (specs/quant.md §1.5, cv18xx.md §4).

- conv / depthwise / transposed conv / gemm: int32 accumulation (+ int32 bias), then per-channel (conv) or
  per-tensor (gemm) QDM requantization `RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(acc, m), rshift)`,
  ReLU, clamp.
- eltwise add/sub (MUL then MAC), max/min, concat, avg pool: int8 multipliers and one right shift that
  rounds half up, `(Σ m_i·x_i + 2^(r-1)) >> r`, then clamp. An avg pool whose windows count different
  numbers of cells (padding excluded, ceil_mode overhang) has a pair per output position, from its count.
- eltwise mul: QDM on the int16 product. Unary activations: a 256-entry int8 lookup table.
- max pool, relu, reshape-like ops: pass-through on the codes (input and output share a threshold).
"""

from __future__ import annotations

import numpy as np

from npuc.compiler.numformats.cv18xx_int8 import cv18xx_apply_multiplier_rshift
from npuc.compiler.numformats.gemmlowp import rounding_divide_by_pot, saturating_rounding_doubling_high_mul
from npuc.compiler.numformats.rounding import saturate, wrap_int32

from ...ir import Op
from ...ops import pool_out_size
from ..conv import conv2d_nchw, pad_hw, windows
from ..registry import FLOAT_KERNELS
from .bf16_conv import conv_transpose_as_conv
from .params import OpQuant, op_quant
from .registry import quant_kernel


def _finish(y: np.ndarray, q: OpQuant, relu: bool) -> np.ndarray:
    """Clamp int64 results to int8, with the fused ReLU (and relu6 upper bound) applied: one clip, which is
    min(max(y, low), high) and so the ReLU, then the relu6 bound, then int8's range."""
    low = 0 if relu else -128
    high = 127 if q.relu_max is None else min(int(q.relu_max), 127)
    return np.clip(y, low, high).astype(np.int8)


def _relu(op: Op) -> bool:
    act = getattr(op.attrs, "act", None)
    return act is not None and act.kind in ("relu", "clip")


def _exact_int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # int8 x int8 sums stay far below 2^53, so a float64 (BLAS) product is exact
    return np.rint(np.matmul(a.astype(np.float64), b.astype(np.float64))).astype(np.int64)


def _requant_qdm(acc: np.ndarray, q: OpQuant, axis: int | None) -> np.ndarray:
    mult, shift = np.asarray(q.multiplier), np.asarray(q.rshift)
    if axis is not None and mult.size > 1:
        shape = [1] * acc.ndim
        shape[axis] = mult.size
        mult, shift = mult.reshape(shape), shift.reshape(shape)
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(acc, mult), shift)


def _conv_output(op: Op, inputs: list[np.ndarray], sums: np.ndarray) -> list[np.ndarray]:
    """int32 conv sums (exact in float32 or float64) plus the int32 bias, per-channel QDM, ReLU, clamp."""
    q = op_quant(op)
    acc = sums.astype(np.int64)  # integers already: the sums are exact
    if len(inputs) > 2:
        acc += inputs[2].astype(np.int64).reshape(1, -1, 1, 1)
    return [_finish(_requant_qdm(wrap_int32(acc, out=acc), q, 1), q, _relu(op))]  # the TIU's accumulator wraps


def _exact_float(x: np.ndarray, w: np.ndarray) -> type:
    """The float type whose conv sums of integer `x` and `w` (w: OC, C/group, KH, KW) are exact: float32 when
    every partial sum stays below 2^24 (the usual int8 case, twice as fast), else float64 (below 2^53)."""
    bound = _magnitude(x) * _magnitude(w) * (w.size // max(w.shape[0], 1))
    return np.float32 if bound < 1 << 24 else np.float64


def _magnitude(a: np.ndarray) -> int:
    if np.issubdtype(a.dtype, np.integer):
        info = np.iinfo(a.dtype)
        return max(-int(info.min), int(info.max))
    return int(np.abs(a).max(initial=0))


@quant_kernel("int8", "conv2d")
def conv2d(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a = op.attrs
    exact = _exact_float(inputs[0], inputs[1])
    x, w = inputs[0].astype(exact), inputs[1].astype(exact)
    return _conv_output(op, inputs, conv2d_nchw(x, w, a.strides, a.pads, a.dilations, a.group))


@quant_kernel("int8", "conv_transpose2d")
def conv_transpose2d(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The TIU's form: a stride-1 conv over the zero-spread input with the flipped, channel-swapped filters."""
    a = op.attrs
    xs, wc, pads = conv_transpose_as_conv(inputs[0], inputs[1], a)
    exact = _exact_float(xs, wc)
    xs, wc = xs.astype(exact), wc.astype(exact)
    return _conv_output(op, inputs, conv2d_nchw(xs, wc, (1, 1), pads, a.dilations, a.group))


def _gemm_operands(op: Op, inputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    a, b = inputs[0], inputs[1]
    if op.kind == "gemm":
        a = a.T if op.attrs.trans_a else a
        b = b.T if op.attrs.trans_b else b
    return a, b


@quant_kernel("int8", "gemm", "matmul")
def gemm(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    q = op_quant(op)
    a, b = _gemm_operands(op, inputs)
    acc = _exact_int_matmul(a, b)
    if len(inputs) > 2:
        acc = acc + inputs[2].astype(np.int64)
    return [_finish(_requant_qdm(wrap_int32(acc), q, None), q, _relu(op))]  # the TIU's matmul sum wraps too


def _scaled_sum(values: list[np.ndarray], q: OpQuant) -> np.ndarray:
    """`(Σ m_i·x_i + 2^(r-1)) >> r` over broadcast int8 inputs (the MUL/MAC chain of an int8 eltwise)."""
    acc = sum(np.asarray(x, np.int64) * int(m) for x, m in zip(values, np.asarray(q.multiplier).ravel()))
    return cv18xx_apply_multiplier_rshift(acc, 1, int(np.asarray(q.rshift)))


def _rescale_each(values: list[np.ndarray], q: OpQuant) -> list[np.ndarray]:
    shifts = np.broadcast_to(np.asarray(q.rshift), (len(values),))
    mults = np.asarray(q.multiplier).ravel()
    return [
        cv18xx_apply_multiplier_rshift(np.asarray(x, np.int64), int(m), int(r))
        for x, m, r in zip(values, mults, shifts)
    ]


def _eltwise_extreme(values: list[np.ndarray], q: OpQuant, fn: np.ufunc) -> np.ndarray:
    return fn.reduce(np.broadcast_arrays(*_rescale_each(values, q)))


def _eltwise_mul(values: list[np.ndarray], q: OpQuant) -> np.ndarray:
    prod = values[0].astype(np.int64)
    for x in values[1:]:
        prod = prod * x.astype(np.int64)
    return _requant_qdm(prod, q, None)


_ELTWISE = {
    "add": _scaled_sum,
    "sub": _scaled_sum,  # the second multiplier is negative
    "max": lambda v, q: _eltwise_extreme(v, q, np.maximum),
    "min": lambda v, q: _eltwise_extreme(v, q, np.minimum),
    "mul": _eltwise_mul,
}


@quant_kernel("int8", "eltwise")
def eltwise(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    q = op_quant(op)
    y = _ELTWISE[op.attrs.kind](inputs, q)
    shape = np.broadcast_shapes(*(x.shape for x in inputs))
    return [np.ascontiguousarray(np.broadcast_to(_finish(y, q, _relu(op)), shape))]


@quant_kernel("int8", "concat")
def concat(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    q = op_quant(op)
    parts = [saturate(v, np.int8) for v in _rescale_each(inputs, q)]
    return [np.concatenate(parts, axis=op.attrs.axis)]


def window_sums(op: Op, x: np.ndarray) -> np.ndarray:
    """Sum (in x's dtype) of every pool window: zero padding, ceil_mode windows extended past the end."""
    a = op.attrs
    h, w = x.shape[2:]
    top, left, bottom, right = a.pads
    sizes = [
        pool_out_size(n, k, s, d, pb, pe, a.ceil_mode)
        for n, k, s, d, pb, pe in zip((h, w), a.kernel, a.strides, a.dilations, (top, left), (bottom, right))
    ]
    need = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(sizes, a.strides, a.dilations, a.kernel)]
    full = (top, left, need[0] - h - top, need[1] - w - left)
    return windows(pad_hw(x, full), a.kernel, a.strides, a.dilations).sum(axis=(4, 5))


def window_cell_counts(op: Op, in_hw: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray | None:
    """(oh, ow) cells each average-pool window divides by, as ONNX counts them: those inside the input, plus
    the explicit pads when count_include_pad (a ceil_mode overhang past the pads never counts). None when
    every window counts kh·kw, so one divisor serves the whole op."""
    a = op.attrs
    if op.kind != "pool2d" or a.mode != "avg":
        return None
    per_axis = []
    for i in range(2):
        begin, end = a.pads[i], a.pads[i + 2]
        lo, hi = (-begin, in_hw[i] + end) if a.count_include_pad else (0, in_hw[i])
        taps = np.arange(out_hw[i])[:, None] * a.strides[i] - begin + np.arange(a.kernel[i])[None, :] * a.dilations[i]
        per_axis.append(np.count_nonzero((taps >= lo) & (taps < hi), axis=1))
    rows, cols = per_axis
    if np.all(rows == a.kernel[0]) and np.all(cols == a.kernel[1]):
        return None
    return rows[:, None] * cols[None, :]


def pool_requant(q: OpQuant) -> tuple[np.ndarray, np.ndarray]:
    """(multiplier, rshift) of an average pool: per output position (oh, ow) when its windows count
    different numbers of cells, else the op's single pair."""
    if q.position_multiplier is not None:
        return np.asarray(q.position_multiplier), np.asarray(q.position_rshift)
    return np.asarray(q.multiplier), np.asarray(q.rshift)


@quant_kernel("int8", "pool2d")
def pool2d(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    q = op_quant(op)
    if op.attrs.mode == "max":
        y = FLOAT_KERNELS["pool2d"](op, inputs)[0].astype(np.int64)  # pads with -128
        return [_finish(y, q, _relu(op))]
    y = cv18xx_apply_multiplier_rshift(window_sums(op, inputs[0].astype(np.int64)), *pool_requant(q))
    return [_finish(y, q, _relu(op))]


@quant_kernel("int8", "global_pool")
def global_pool(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    q, x = op_quant(op), inputs[0]
    axes = tuple(range(2, x.ndim))
    if op.attrs.mode == "max":
        return [x.max(axis=axes, keepdims=True)]
    total = x.astype(np.int64).sum(axis=axes, keepdims=True)
    return [_finish(cv18xx_apply_multiplier_rshift(total, q.multiplier, q.rshift), q, False)]


@quant_kernel("int8", "prelu")
def prelu(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Positive and negative halves each scaled per channel (int8 weight, then QDM), saturated, then added."""
    q, x = op_quant(op), inputs[0].astype(np.int64)
    weights = inputs[1].astype(np.int64)
    shape = [1] * x.ndim
    shape[1] = -1
    halves = []
    for i, part in enumerate((np.maximum(x, 0), np.minimum(x, 0))):
        w, m, r = (np.asarray(a[i]).reshape(shape) for a in (weights, q.multiplier, q.rshift))
        halves.append(saturate(rounding_divide_by_pot(saturating_rounding_doubling_high_mul(part * w, m), r), np.int8))
    return [saturate(halves[0].astype(np.int64) + halves[1], np.int8)]


@quant_kernel("int8", "activation", "lut")
def lookup(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    q, x = op_quant(op), inputs[0]
    if q.lut is None:  # relu with equal thresholds: a max against zero
        return [_finish(x.astype(np.int64), q, True)]
    table = np.asarray(q.lut, np.int8)
    return [np.take(table, x.view(np.uint8))]  # take: a faster path than fancy indexing, the same bytes


def _passthrough(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return FLOAT_KERNELS[op.kind](op, inputs)


for _kind in ("reshape", "transpose", "slice", "split", "pad", "expand", "gather", "resize"):
    quant_kernel("int8", _kind)(_passthrough)
