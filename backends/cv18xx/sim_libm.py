"""The C library's `expf` as the vendor runtime's CPU functions call it, bit for bit.

glibc's single-precision exp (since 2.28) is not correctly rounded: it reduces x to k/32 + r with
k = round(x * 32 / ln 2), looks up 2^(k mod 32 / 32) in a 32-entry table, scales it by 2^(k div 32) through
the exponent bits, and multiplies by a degree-3 polynomial in r, all in double, rounding to float once at the
end. About one input in a thousand lands on the other side of a float32 rounding boundary than the exact
exp would (PP-OCRv6's 276,240-element softmax: 244 such values), so a simulator that rounds the exact exp
differs from the runtime there. The constants below are the published ones of that algorithm.
"""

from __future__ import annotations

import numpy as np

TABLE_BITS = 5
N = 1 << TABLE_BITS
_SHIFT = float.fromhex("0x1.8p52")  # adding it rounds a double to an integer held in the low mantissa bits
_INV_LN2_N = float.fromhex("0x1.71547652b82fep+0") * N
_POLY = (  # 2^(r/N) ~ 1 + C2 r + C1 r^2 + C0 r^3, coefficients pre-divided by powers of N
    float.fromhex("0x1.c6af84b912394p-5") / N / N / N,
    float.fromhex("0x1.ebfce50fac4f3p-3") / N / N,
    float.fromhex("0x1.62e42ff0c52d6p-1") / N,
)
_I = np.arange(N, dtype=np.uint64)
# 2^(i/N) as double bits, less i/N in the exponent field, so that adding k << (52 - TABLE_BITS) scales it
_TABLE = np.exp2(_I.astype(np.float64) / N).view(np.uint64) - ((_I << np.uint64(52)) // np.uint64(N))


UNDERFLOW = float.fromhex("-0x1.9fe368p6")  # below: exp is 0 (glibc's underflow path)
OVERFLOW = float.fromhex("0x1.62e42ep6")  # above: exp is +inf


def expf(x: np.ndarray) -> np.ndarray:
    """float32 exp of float32 `x` as glibc computes it: the table path in range, 0 below UNDERFLOW (the
    -FLT_MAX of an attention mask included), +inf above OVERFLOW, NaN for NaN."""
    x32 = np.asarray(x, np.float32)
    x = np.clip(x32.astype(np.float64), UNDERFLOW, OVERFLOW)  # the table path on in-range values only
    z = _INV_LN2_N * x
    kd = z + _SHIFT
    ki = kd.view(np.uint64)
    r = z - (kd - _SHIFT)
    scale = (_TABLE[ki % np.uint64(N)] + (ki << np.uint64(52 - TABLE_BITS))).view(np.float64)
    c0, c1, c2 = _POLY
    y = (c0 * r + c1) * (r * r) + (c2 * r + 1.0)
    with np.errstate(over="ignore", under="ignore"):
        result = (y * scale).astype(np.float32)
    result = np.where(x32 < UNDERFLOW, np.float32(0), result)
    result = np.where(x32 > OVERFLOW, np.float32(np.inf), result)
    return np.where(np.isnan(x32), x32, result).astype(np.float32)
