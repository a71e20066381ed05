"""Vectorized number-format primitives: rounding, CV18xx int8/QDM, bf16, fp16, asymmetric, BM1880, Horizon.

Pure functions on numpy arrays and floats, no IR. Sources of the formulas: specs/quant.md §1.5,
specs/cv18xx.md §4, specs/bm1880.md §3.2, specs/dmp-lyngor-horizon.md §3.3.

Precision notes (chosen to match the vendor tools, which compute in C float/double):
- thresholds are float32 values (they come from float tensors or float protobuf fields);
- every rounding helper is exact for its input dtype (no `floor(x + 0.5)` double-rounding traps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from npuc.compiler.errors import UserError

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

# ---------------------------------------------------------------------------------------------------------
# Rounding and saturation


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero (C `round`); float in, float out, exact."""
    x = np.asarray(x)
    whole = np.trunc(x)
    frac = x - whole  # exact: both operands share the exponent range
    return whole + np.where(np.abs(frac) >= 0.5, np.sign(x), 0)


def round_half_up(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties towards +inf (`floor(x + 0.5)` without the double rounding)."""
    x = np.asarray(x)
    low = np.floor(x)
    return low + ((x - low) >= 0.5)


def round_half_even(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to even (IEEE default, C `nearbyint`)."""
    return np.rint(np.asarray(x))


ROUNDING: MappingProxyType[str, Callable[[np.ndarray], np.ndarray]] = MappingProxyType(
    {
        "half_away": round_half_away,
        "half_up": round_half_up,
        "half_even": round_half_even,
        "floor": np.floor,
        "trunc": np.trunc,
    }
)


def saturate(x: np.ndarray, dtype: np.dtype | type) -> np.ndarray:
    """Clip integral-valued `x` to the range of integer `dtype` and cast."""
    info = np.iinfo(dtype)
    return np.clip(np.asarray(x), info.min, info.max).astype(dtype)


def _f32(value: float | np.ndarray) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


def _check_threshold(threshold: float | np.ndarray, what: str) -> np.ndarray:
    t = _f32(threshold)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise UserError(f"{what}: threshold {threshold!r} must be finite and > 0; recalibrate the tensor")
    return t


# ---------------------------------------------------------------------------------------------------------
# CV18xx int8 (symmetric, signed; quant.md §1.5)


def cv18xx_quantize_activation(x: np.ndarray, threshold: float) -> np.ndarray:
    """float -> int8: `clamp(round_half_away(x·(127/th)), -128, 127)`, product in float32 (CPU quant)."""
    scale = _f32(127.0) / _check_threshold(threshold, "cv18xx activation")
    return saturate(round_half_away(np.asarray(x, dtype=np.float32) * scale), np.int8)


def cv18xx_dequantize_activation(q: np.ndarray, threshold: float) -> np.ndarray:
    """int8 -> float32: `q * th / 127`."""
    return np.asarray(q, dtype=np.float32) * (_check_threshold(threshold, "cv18xx activation") / _f32(127.0))


def quantize_multiplier(real_multiplier: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TFLite QuantizeMultiplier, vectorized: `real = multiplier * 2^(shift-31)`, multiplier in [2^30, 2^31).

    Returns (multiplier int64, shift int64) with `shift` the left-shift exponent (negative = right shift).
    Zero -> (0, 0); exponents below -31 flush to (0, 0); exponents above 30 saturate to (2^31-1, 30).
    """
    real = np.asarray(real_multiplier, dtype=np.float64)
    if np.any(real < 0) or not np.all(np.isfinite(real)):
        raise UserError("quantize_multiplier: multipliers must be finite and >= 0; check the thresholds")
    mant, exp = np.frexp(real)
    q = round_half_away(mant * float(1 << 31)).astype(np.int64)
    carry = q == (1 << 31)
    q = np.where(carry, q // 2, q)
    exp = exp.astype(np.int64) + carry
    flush = (real == 0) | (exp < -31)
    q, exp = np.where(flush, 0, q), np.where(flush, 0, exp)
    big = exp > 30
    return np.where(big, INT32_MAX, q), np.where(big, 30, exp)


def cv18xx_qdm_multiplier(qscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """qscale -> (int32 multiplier, rshift >= 0); qscale >= 1 clamps to 0.999999 (no left shift)."""
    qs = np.asarray(qscale, dtype=np.float64)
    qs = np.where(qs >= 1.0, 0.999999, qs)
    multiplier, shift = quantize_multiplier(qs)
    return multiplier, -shift


def saturating_rounding_doubling_high_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul on int32 values: rounded high 32 bits of 2ab (int64 out)."""
    a64 = np.asarray(a, dtype=np.int64)
    b64 = np.asarray(b, dtype=np.int64)
    ab = a64 * b64
    nudged = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    high = np.sign(nudged) * (np.abs(nudged) >> 31)  # C integer division truncates towards zero
    overflow = (a64 == INT32_MIN) & (b64 == INT32_MIN)
    return np.where(overflow, INT32_MAX, high)


def rounding_divide_by_pot(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT: arithmetic right shift rounding to nearest, ties away from zero."""
    x64 = np.asarray(x, dtype=np.int64)
    e = np.asarray(exponent, dtype=np.int64)
    if np.any((e < 0) | (e > 31)):
        raise UserError("rounding_divide_by_pot: shift must be in 0..31; check the rshift values")
    mask = (np.int64(1) << e) - 1
    remainder = x64 & mask
    threshold = (mask >> 1) + (x64 < 0)
    return (x64 >> e) + (remainder > threshold)


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
    tx = _check_threshold(threshold_x, "cv18xx conv input")
    ty = _check_threshold(threshold_y, "cv18xx conv output")
    max_w = np.abs(w.reshape(oc, -1)).max(axis=1)
    # tpu-mlir evaluates both qscales with C float operands: float32 quotients widened to double
    qscale = ((max_w * tx) / (_f32(127.0) * ty)).astype(np.float64)
    if bias is not None:
        b = np.asarray(bias, dtype=np.float32).reshape(oc)
        qscale_bias = ((np.abs(b) * _f32(127.0)) / (_f32(INT32_MAX * bias_headroom) * ty)).astype(np.float64)
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
        b_factor = np.where(multiplier == 0, 0.0, float(_f32(127.0) / ty) * pot / safe_mult)
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
    th_in = _check_threshold(thresholds_in, "cv18xx eltwise input")
    th_out = _check_threshold(threshold_out, "cv18xx eltwise output")
    c = _f32(1.0 if coeffs is None else coeffs)
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


# ---------------------------------------------------------------------------------------------------------
# bf16 and fp16


def float32_to_bf16_bits(x: np.ndarray, cv18xx_overflow: bool = True) -> np.ndarray:
    """float32 -> bf16 bit pattern (uint16), round to nearest even; NaN -> 0x7FC0.

    With `cv18xx_overflow` (the cvikernel rule) any result whose exponent is all ones becomes 0x7F7F,
    dropping the sign; without it, overflow gives ±inf as IEEE does.
    """
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = (rounded & 0xFFFF).astype(np.uint16)
    if cv18xx_overflow:
        out = np.where((out & 0x7F80) == 0x7F80, np.uint16(0x7F7F), out)
    return np.where(np.isnan(np.asarray(x, dtype=np.float32)), np.uint16(0x7FC0), out).astype(np.uint16)


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit pattern -> float32 (exact: the low 16 mantissa bits are zero)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(x: np.ndarray, cv18xx_overflow: bool = True) -> np.ndarray:
    """float32 values rounded to the nearest bf16 value (as float32)."""
    return bf16_bits_to_float32(float32_to_bf16_bits(x, cv18xx_overflow))


BF16_MAX = float(np.uint32(0x7F7F0000).view(np.float32))


def constant_to_bf16(x: np.ndarray) -> np.ndarray:
    """A float constant as bf16 (as float32): nearest, with values beyond the bf16 range (infinities too)
    saturated to ±max, sign kept. Exporters write -FLT_MAX or -inf as "minus infinity" (attention masks);
    plain rounding would make it infinite, which the cv18xx turns into +max."""
    return round_to_bf16(np.clip(np.asarray(x, dtype=np.float32), -BF16_MAX, BF16_MAX))


def float32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> IEEE half bit pattern (uint16), round to nearest even, overflow to ±inf."""
    with np.errstate(over="ignore"):  # overflow to inf is the defined result
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def fp16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """IEEE half bit pattern -> float32 (exact)."""
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


def round_to_fp16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest fp16 value (as float32)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# Asymmetric (zero point) int8 / uint8


@dataclass(frozen=True)
class AffineParams:
    """`x ≈ (q - zero_point) · scale`, q in [qmin, qmax]."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int


_QRANGE = MappingProxyType({"int8": (-128, 127), "uint8": (0, 255)})


def asymmetric_params(min_value: float, max_value: float, dtype: str = "uint8") -> AffineParams:
    """Scale/zero point covering [min(min,0), max(max,0)] (zero exactly representable), zp ties to even."""
    if dtype not in _QRANGE:
        raise UserError(f"asymmetric dtype {dtype!r} unknown; use one of {sorted(_QRANGE)}")
    qmin, qmax = _QRANGE[dtype]
    lo, hi = min(float(min_value), 0.0), max(float(max_value), 0.0)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise UserError(f"asymmetric range [{min_value}, {max_value}] is not finite; recalibrate the tensor")
    scale = (hi - lo) / (qmax - qmin) if hi > lo else 1.0
    zp = int(np.clip(round_half_even(qmin - lo / scale), qmin, qmax))
    return AffineParams(float(np.float32(scale)), zp, qmin, qmax)


def quantize_affine(x: np.ndarray, params: AffineParams) -> np.ndarray:
    """`clip(round_half_even(x/scale) + zp)` (ONNX QuantizeLinear semantics), int8 or uint8 out."""
    dtype = np.uint8 if params.qmin == 0 else np.int8
    q = round_half_even(np.asarray(x, dtype=np.float32) / np.float32(params.scale)) + params.zero_point
    return np.clip(q, params.qmin, params.qmax).astype(dtype)


def dequantize_affine(q: np.ndarray, params: AffineParams) -> np.ndarray:
    """`(q - zp) · scale` as float32."""
    return (np.asarray(q, dtype=np.int32) - params.zero_point).astype(np.float32) * np.float32(params.scale)


# ---------------------------------------------------------------------------------------------------------
# BM1880 per-layer shift rules (bm1880.md §3.2)

BM1880_TARGET = 64.0  # scaled |max| must reach [64, 128)


def bm1880_quantize_activation(x: np.ndarray, threshold: float) -> np.ndarray:
    """float -> int8: `sat8(floor(x·128/T + 0.5))`."""
    t = _check_threshold(threshold, "bm1880 activation")
    return saturate(round_half_up(np.asarray(x, dtype=np.float64) * (128.0 / float(t))), np.int8)


def bm1880_dequantize_activation(q: np.ndarray, threshold: float) -> np.ndarray:
    """int8 -> float32: `q·T/128`."""
    return np.asarray(q, dtype=np.float32) * (_check_threshold(threshold, "bm1880 activation") / _f32(128.0))


def bm1880_scale_shift(value: np.ndarray, what: str = "bm1880 scale") -> tuple[np.ndarray, np.ndarray]:
    """Smallest r >= 0 with `|value|·2^r >= 64` and `m = round_half_up(value·2^r)`; value 0 -> (0, 0).

    Used for conv/FC weights (value = max|W|·Tx/Ty) and ReLU slopes (gt/le scale). |value| >= 128 at r = 0
    cannot be represented and is a UserError.
    """
    v = np.asarray(value, dtype=np.float64)
    if np.any(np.abs(v) >= 128.0):
        raise UserError(
            f"{what}: scaled value {np.abs(v).max():.6g} >= 128 cannot use a right shift; raise the output threshold"
        )
    r = np.arange(32, dtype=np.int64)
    ok = np.abs(v)[..., None] * np.ldexp(1.0, r.astype(np.int32)) >= BM1880_TARGET
    rshift = np.where(ok.any(axis=-1), ok.argmax(axis=-1), 0)
    m = round_half_up(v * np.ldexp(1.0, rshift.astype(np.int32))).astype(np.int64)
    return m, rshift


@dataclass(frozen=True)
class Bm1880LayerQuant:
    """BM1880 conv/FC: int8 weight, int16 bias, one right shift for the layer."""

    weight: np.ndarray  # int8
    bias: np.ndarray | None  # int16
    rshift: int


def bm1880_quantize_layer(
    weight: np.ndarray, bias: np.ndarray | None, threshold_x: float, threshold_y: float
) -> Bm1880LayerQuant:
    """One rshift `r` from `max|W|·Tx/Ty`; `Wq = sat8(floor(W·(Tx/Ty)·2^r + 0.5))`,
    `Bq = sat16(floor(B·(128/Ty)·2^r + 0.5))`.

    Arithmetic is float32 like the vendor calibration tool (its weights and thresholds are C floats).
    """
    w = np.asarray(weight, dtype=np.float32)
    tx = _check_threshold(threshold_x, "bm1880 layer input")
    ty = _check_threshold(threshold_y, "bm1880 layer output")
    ratio = tx / ty
    _, r = bm1880_scale_shift(np.abs(w).max() * ratio, "bm1880 conv/fc weight")
    pot = _f32(np.ldexp(1.0, int(r)))
    w_q = saturate(round_half_up(w * ratio * pot), np.int8)
    b_q = None
    if bias is not None:
        b_q = saturate(round_half_up(np.asarray(bias, dtype=np.float32) * (_f32(128.0) / ty) * pot), np.int16)
    return Bm1880LayerQuant(w_q, b_q, int(r))


def bm1880_requant_multiplier(threshold_x: float, threshold_y: float) -> tuple[int, int]:
    """Pool/requant Tx -> Ty: smallest r with `2^(r+1) >= 256·Ty/Tx`, `m = round(Tx/Ty·2^r)` in [128, 255]."""
    tx = float(_check_threshold(threshold_x, "bm1880 requant input"))
    ty = float(_check_threshold(threshold_y, "bm1880 requant output"))
    r = np.arange(32)
    ok = np.ldexp(1.0, (r + 1).astype(np.int32)) >= 256.0 * ty / tx
    if not ok.any():
        raise UserError(f"bm1880 requant {tx} -> {ty}: ratio too small for an 8-bit multiplier; check the thresholds")
    rshift = int(ok.argmax())
    m = int(min(round_half_up(tx / ty * np.ldexp(1.0, rshift)), 255))
    return m, rshift


def bm1880_eltwise_multipliers(thresholds_in: np.ndarray, threshold_out: float) -> tuple[np.ndarray, int]:
    """Eltwise: r = min over inputs of their requant shifts, `m_i = round(Tx_i/Ty·2^r)`."""
    th_in = np.atleast_1d(np.asarray(thresholds_in, dtype=np.float64))
    shifts = [bm1880_requant_multiplier(t, threshold_out)[1] for t in th_in]  # few inputs per op
    r = min(shifts)
    m = round_half_up(th_in / float(_f32(threshold_out)) * np.ldexp(1.0, r)).astype(np.int64)
    return np.minimum(m, 255), r


def bm1880_shift_requantize(acc: np.ndarray, rshift: int, relu: bool = False) -> np.ndarray:
    """BM1880 conv output: `sat8(acc >> r)` with round-half-up shift (ReLU before the shift)."""
    a = np.asarray(acc, dtype=np.int64)
    if relu:
        a = np.maximum(a, 0)
    return saturate(cv18xx_apply_multiplier_rshift(a, 1, rshift), np.int8)


# ---------------------------------------------------------------------------------------------------------
# Horizon BPU (hbDNN quantiType SHIFT / SCALE; dmp-lyngor-horizon.md §3.3)

_HORIZON_RANGE = MappingProxyType({"s8": (-128, 127, np.int8), "u8": (0, 255, np.uint8)})


def _horizon_range(dtype: str) -> tuple[int, int, type]:
    if dtype not in _HORIZON_RANGE:
        raise UserError(f"Horizon tensor type {dtype!r} unknown; use one of {sorted(_HORIZON_RANGE)}")
    return _HORIZON_RANGE[dtype]


def _per_axis(values: np.ndarray, ndim: int, axis: int | None) -> np.ndarray:
    """Broadcast per-axis parameters along `axis` (None or size 1 = per tensor)."""
    v = np.asarray(values)
    if axis is None or v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis] = v.size
    return v.reshape(shape)


def horizon_shift_quantize(x: np.ndarray, shift: np.ndarray, dtype: str = "s8", axis: int | None = None):
    """SHIFT: `q = clip(nearbyint(x·2^shift))`."""
    lo, hi, np_type = _horizon_range(dtype)
    x = np.asarray(x, dtype=np.float32)
    s = _per_axis(np.asarray(shift, dtype=np.int32), x.ndim, axis)
    return np.clip(round_half_even(x * np.ldexp(np.float32(1.0), s)), lo, hi).astype(np_type)


def horizon_shift_dequantize(q: np.ndarray, shift: np.ndarray, axis: int | None = None) -> np.ndarray:
    """SHIFT: `y = q / 2^shift` (float32)."""
    q = np.asarray(q)
    s = _per_axis(np.asarray(shift, dtype=np.int32), q.ndim, axis)
    return q.astype(np.float32) / np.ldexp(np.float32(1.0), s)


def horizon_scale_quantize(
    x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray = 0, dtype: str = "s8", axis: int | None = None
) -> np.ndarray:
    """SCALE: `q = clip(nearbyint(x/scale + zp))`, computed in float32."""
    lo, hi, np_type = _horizon_range(dtype)
    x = np.asarray(x, dtype=np.float32)
    s = _per_axis(np.asarray(scale, dtype=np.float32), x.ndim, axis)
    z = _per_axis(np.asarray(zero_point, dtype=np.float32), x.ndim, axis)
    return np.clip(round_half_even(x / s + z), lo, hi).astype(np_type)


def horizon_scale_dequantize(
    q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray = 0, axis: int | None = None
) -> np.ndarray:
    """SCALE: `y = (q - zp)·scale` (float32)."""
    q = np.asarray(q)
    s = _per_axis(np.asarray(scale, dtype=np.float32), q.ndim, axis)
    z = _per_axis(np.asarray(zero_point, dtype=np.int32), q.ndim, axis)
    return (q.astype(np.int32) - z).astype(np.float32) * s
