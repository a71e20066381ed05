"""Rounding and saturation: the rounding modes the number formats use, clipping to an integer type, the int32
bounds.

Every rounding helper is exact for its input dtype (no `floor(x + 0.5)` double-rounding traps).
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

import numpy as np

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


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


def wrap_int32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Integers reduced to int32 two's complement (int64 out): a 32-bit accumulator's overflow, which wraps.
    `out`: an int64 array to write into (x itself, to wrap in place)."""
    x = np.asarray(x, np.int64)
    out = np.subtract(x, INT32_MIN, out=out)
    out &= 0xFFFFFFFF
    out += INT32_MIN
    return out
