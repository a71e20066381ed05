"""16-bit floats: float32 to and from bf16 (with the cv18xx overflow rule) and IEEE fp16 bit patterns,
rounding to either, and float constants saturated into the bf16 range."""

from __future__ import annotations

import numpy as np


def float32_to_bf16_bits(x: np.ndarray, cv18xx_overflow: bool = True) -> np.ndarray:
    """float32 -> bf16 bit pattern (uint16), round to nearest even; NaN -> 0x7FC0.

    With `cv18xx_overflow` (the cvikernel rule) any result whose exponent is all ones becomes 0x7F7F,
    dropping the sign; without it, overflow gives ±inf as IEEE does.
    """
    values = np.asarray(x, dtype=np.float32)
    bits = values.view(np.uint32)
    # in uint32: only NaN patterns (replaced below) can carry past bit 31
    rounded = np.asarray(bits >> 16)
    rounded &= 1
    rounded += bits
    rounded += 0x7FFF
    rounded >>= 16
    out = rounded.astype(np.uint16)
    if cv18xx_overflow:
        np.putmask(out, (out & 0x7F80) == 0x7F80, np.uint16(0x7F7F))
    np.putmask(out, np.isnan(values), np.uint16(0x7FC0))
    return out


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
