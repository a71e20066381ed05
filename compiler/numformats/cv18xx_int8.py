"""CV18xx symmetric int8 (quant.md §1.5): activations at 127/threshold, per-channel QDM conv/FC parameters
and requantization, per-tensor multipliers and right shifts (eltwise, pool, concat, FC), int32 biases."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuc.compiler.numformats.gemmlowp import (
    quantize_multiplier,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
)
from npuc.compiler.numformats.rounding import INT32_MAX, round_half_away, round_half_even, saturate
from npuc.compiler.numformats.thresholds import as_f32, check_threshold


def cv18xx_quantize_activation(x: np.ndarray, threshold: float) -> np.ndarray:
    """float -> int8: `clamp(round_half_away(x·(127/th)), -128, 127)`, product in float32 (CPU quant)."""
    scale = as_f32(127.0) / check_threshold(threshold, "cv18xx activation")
    return saturate(round_half_away(np.asarray(x, dtype=np.float32) * scale), np.int8)


def cv18xx_dequantize_activation(q: np.ndarray, threshold: float) -> np.ndarray:
    """int8 -> float32: `q * th / 127`."""
    return np.asarray(q, dtype=np.float32) * (check_threshold(threshold, "cv18xx activation") / as_f32(127.0))


def cv18xx_qdm_multiplier(qscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """qscale -> (int32 multiplier, rshift >= 0); qscale >= 1 clamps to 0.999999 (no left shift)."""
    qs = np.asarray(qscale, dtype=np.float64)
    qs = np.where(qs >= 1.0, 0.999999, qs)
    multiplier, shift = quantize_multiplier(qs)
    return multiplier, -shift


def cv18xx_qdm_requantize(
    acc: np.ndarray, multiplier: np.ndarray, rshift: np.ndarray, relu: bool = False
) -> np.ndarray:
    """int32 accumulator -> int8: `RoundingDivideByPOT(SRDHM(acc, m), rshift)`, optional ReLU, clamp."""
    y = rounding_divide_by_pot(saturating_rounding_doubling_high_mul(acc, multiplier), rshift)
    if relu:
        y = np.maximum(y, 0)
    return saturate(y, np.int8)


@dataclass(frozen=True)
class ConvQuantParams:
    """CV18xx per-channel conv/FC parameters (QDM): int8 weight, int32 bias, per-channel multiplier/rshift."""

    weight: np.ndarray  # int8, same shape as the float weight
    bias: np.ndarray | None  # int32 [oc]
    multiplier: np.ndarray  # int64 [oc], in [2^30, 2^31) or 0
    rshift: np.ndarray  # int64 [oc], >= 0
    qscale: np.ndarray  # float64 [oc], the real multiplier actually decomposed


def _scaled_round_half_even(values: np.ndarray, factor: np.ndarray, scale_dtype: type) -> np.ndarray:
    """`round_half_even(v·factor)`: product in `scale_dtype`, rounded as a float32 like tpu-mlir's to_int."""
    v = np.asarray(values, dtype=np.float32).astype(scale_dtype)
    product = v * np.asarray(factor).astype(scale_dtype)
    return round_half_even(product.astype(np.float32).astype(np.float64))


_ROW_CHUNK = 1 << 16  # elements per slice of the weight rounding: bounds its float64 temporaries


def _weight_to_int8(w: np.ndarray, factor: np.ndarray, scale_dtype: type) -> np.ndarray:
    """`saturate(_scaled_round_half_even(w, factor), int8)` over slices of output channels (factor: [oc, 1, ...]),
    so the float64 temporaries stay small; every element goes through the same operations."""
    if w.ndim < 2:
        return saturate(_scaled_round_half_even(w, factor, scale_dtype), np.int8)
    out = np.empty(w.shape, np.int8)
    step = max(1, _ROW_CHUNK // max(1, w[0].size))
    for i in range(0, len(w), step):
        out[i : i + step] = saturate(_scaled_round_half_even(w[i : i + step], factor[i : i + step], scale_dtype),
                                     np.int8)  # fmt: skip
    return out


def cv18xx_quantize_conv(
    weight: np.ndarray,
    bias: np.ndarray | None,
    threshold_x: float,
    threshold_y: float,
    scale_dtype: type = np.float64,
    bias_headroom: float = 1.0,
) -> ConvQuantParams:
    """Per-output-channel QDM quantization (axis 0 = output channel).

    `qscale_c = max|W_c|·th_x / (127·th_y)`, raised to the bias qscale `|b_c|·127 / ((2^31-1)·headroom·th_y)`
    when that is larger and < 1; `W_q = round_half_even(W·(th_x/th_y)·2^(rshift+31)/multiplier)` saturated
    to int8, `B_q = round_half_even(B·(127/th_y)·2^(rshift+31)/multiplier)` saturated to int32.
    `scale_dtype` is the type the weight product is computed in (tpu-mlir versions differ: float or double);
    `bias_headroom` is 1.0 per the spec (some tpu-mlir versions use 0.998).
    """
    w = np.asarray(weight, dtype=np.float32)
    oc = w.shape[0]
    tx = check_threshold(threshold_x, "cv18xx conv input")
    ty = check_threshold(threshold_y, "cv18xx conv output")
    max_w = np.abs(w.reshape(oc, -1)).max(axis=1)
    # tpu-mlir evaluates both qscales with C float operands: float32 quotients widened to double
    qscale = ((max_w * tx) / (as_f32(127.0) * ty)).astype(np.float64)
    if bias is not None:
        b = np.asarray(bias, dtype=np.float32).reshape(oc)
        qscale_bias = ((np.abs(b) * as_f32(127.0)) / (as_f32(INT32_MAX * bias_headroom) * ty)).astype(np.float64)
        qscale = np.where((qscale_bias > qscale) & (qscale_bias < 1.0), qscale_bias, qscale)
    multiplier, rshift = cv18xx_qdm_multiplier(qscale)
    safe_mult = np.where(multiplier == 0, 1, multiplier).astype(np.float64)
    pot = np.ldexp(1.0, (rshift + 31).astype(np.int32))
    ratio = float(tx / ty)  # float / float in C: a float32 quotient
    w_factor = np.where(multiplier == 0, 0.0, ratio * pot / safe_mult)
    shape = (oc,) + (1,) * (w.ndim - 1)
    w_q = _weight_to_int8(w, w_factor.reshape(shape), scale_dtype)
    b_q = None
    if bias is not None:
        b_factor = np.where(multiplier == 0, 0.0, float(as_f32(127.0) / ty) * pot / safe_mult)
        b_q = saturate(_scaled_round_half_even(b, b_factor, scale_dtype), np.int32)
    return ConvQuantParams(w_q, b_q, multiplier, rshift, np.where(qscale >= 1.0, 0.999999, qscale))


def cv18xx_per_tensor_multiplier(qscale: np.ndarray, max_multiplier: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """Non-QDM (eltwise/pool/concat/FC) multiplier and rshift: smallest r with `qscale·2^(r+1) >= max`.

    `multiplier = trunc(qscale·2^r)`; qscale > max -> (max, 0); no r in 0..62 -> (0, 0).
    """
    qs = np.asarray(qscale, dtype=np.float64)
    r = np.arange(63, dtype=np.int64)
    ok = qs[..., None] * np.ldexp(1.0, (r + 1).astype(np.int32)) >= float(max_multiplier)
    found = ok.any(axis=-1)
    rshift = np.where(found, ok.argmax(axis=-1), 0)
    multiplier = np.where(found, np.trunc(qs * np.ldexp(1.0, rshift.astype(np.int32))), 0).astype(np.int64)
    too_big = qs > max_multiplier
    return np.where(too_big, max_multiplier, multiplier), np.where(too_big, 0, rshift)


def cv18xx_eltwise_multipliers(
    thresholds_in: np.ndarray, threshold_out: float, coeffs: np.ndarray | None = None
) -> tuple[np.ndarray, int]:
    """Per-input int8 multipliers and the shared rshift of an int8 eltwise add/sub/max (per-layer mode).

    `qscale_i = coeff_i·th_i/th_out` (float32); the rshift comes from max|qscale| with max_multiplier 127;
    `m_i = int8(trunc(qscale_i·2^rshift))`.
    """
    th_in = check_threshold(thresholds_in, "cv18xx eltwise input")
    th_out = check_threshold(threshold_out, "cv18xx eltwise output")
    c = as_f32(1.0 if coeffs is None else coeffs)
    qscale = (c * (th_in.astype(np.float64) / float(th_out))).astype(np.float32)
    _, rshift = cv18xx_per_tensor_multiplier(np.abs(qscale).max(), 127)
    m = np.trunc(qscale.astype(np.float64) * np.ldexp(1.0, int(rshift)))
    return m.astype(np.int64).astype(np.int8), int(rshift)


def cv18xx_apply_multiplier_rshift(v: np.ndarray, multiplier: np.ndarray, rshift: np.ndarray) -> np.ndarray:
    """Non-QDM requant: `round_half_up(v·m / 2^r)` in exact integer arithmetic (int64 out, not clamped)."""
    prod = np.asarray(v, dtype=np.int64) * np.asarray(multiplier, dtype=np.int64)
    r = np.asarray(rshift, dtype=np.int64)
    half = np.where(r > 0, np.int64(1) << np.maximum(r - 1, 0), 0)
    return (prod + half) >> r


def cv18xx_quantize_bias_int32(bias: np.ndarray, scale: float) -> np.ndarray:
    """Bias to int32 at an accumulator scale (`round_half_even(b·scale)`, saturated)."""
    return saturate(round_half_even(np.asarray(bias, dtype=np.float64) * float(scale)), np.int32)
