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
    ab = a64 * b64
    nudged = ab + (1 << 30)
    nudged -= (ab < 0) * ((1 << 31) - 1)  # a negative product is nudged by 1 - 2^30
    high = nudged >> 31  # floor; C integer division truncates towards zero:
    high += (nudged < 0) & ((nudged & ((1 << 31) - 1)) != 0)
    if np.any(a64 == INT32_MIN) and np.any(b64 == INT32_MIN):  # the one product that overflows int32
        high = np.where((a64 == INT32_MIN) & (b64 == INT32_MIN), INT32_MAX, high)
    return high


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
