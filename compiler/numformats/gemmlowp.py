"""Fixed-point multipliers as TFLite and gemmlowp compute them: a real multiplier as an int32 mantissa and a
power-of-two shift, the saturating rounding doubling high multiply, and the rounding right shift."""

from __future__ import annotations

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.numformats.rounding import INT32_MAX, INT32_MIN, round_half_away


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


def saturating_rounding_doubling_high_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul on int32 values: rounded high 32 bits of 2ab (int64 out)."""
    a64 = np.asarray(a, dtype=np.int64)
    b64 = np.asarray(b, dtype=np.int64)
    high = np.asarray(a64 * b64)  # 0-d for scalars: written in place below
    # gemmlowp nudges the product by 2^30 (a negative one by 1 - 2^30) and divides by 2^31 truncating toward
    # zero; for either sign that equals a floor shift of ab + 2^30 (two passes instead of nine)
    high += 1 << 30
    high >>= 31
    small, large = sorted((a64, b64), key=np.size)  # the multipliers first: they are rarely INT32_MIN
    if np.any(small == INT32_MIN) and np.any(large == INT32_MIN):  # the one product that overflows int32
        high = np.where((a64 == INT32_MIN) & (b64 == INT32_MIN), INT32_MAX, high)
    return high[()]


def rounding_divide_by_pot(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT: arithmetic right shift rounding to nearest, ties away from zero."""
    x64 = np.asarray(x, dtype=np.int64)
    e = np.asarray(exponent, dtype=np.int64)
    if np.any((e < 0) | (e > 31)):
        raise UserError("rounding_divide_by_pot: shift must be in 0..31; check the rshift values")
    half = np.where(e > 0, np.left_shift(np.int64(1), np.maximum(e - 1, 0)), 0)
    # (x + half - 1) >> e where x < 0 and e > 0, else (x + half) >> e: ties round away from zero
    out = np.asarray(x64 >> 63)  # -1 where x < 0
    if out.shape != (shape := np.broadcast_shapes(x64.shape, e.shape)):  # a shift per element of a smaller x
        out = np.array(np.broadcast_to(out, shape))
    if not np.all(e > 0):
        out &= -(e > 0).astype(np.int64)
    out += x64
    out += half
    out >>= e
    return out[()]
