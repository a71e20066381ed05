"""Conversions between the number formats a quantized graph mixes: float32, cv18xx int8, bf16.

bf16 values are held as float32 arrays whose low 16 bits are zero. The rules follow what tpu-mlir's
cvimodels do (specs/cv18xx.md §4, golden/README.md): the model input is quantized by the CPU `quant`
routine (float32 product with 127/th, round half away from zero); an int8 output is dequantized on the TPU
as bf16(q) * bf16(th/127) rounded to bf16; a float32 input enters a bf16 model truncated (the TPU copies the
high half of each float32).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuc.compiler.numformats.bf16_fp16 import bf16_bits_to_float32, round_to_bf16
from npuc.compiler.numformats.cv18xx_int8 import cv18xx_quantize_activation
from npuc.compiler.numformats.rounding import round_half_even, saturate

from ...ir import QuantParams


def scheme_of(q: QuantParams | None) -> str:
    return "float32" if q is None else q.scheme


def truncate_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 by dropping the low 16 bits (round toward zero)."""
    bits = np.asarray(x, np.float32).view(np.uint32) >> 16
    return bf16_bits_to_float32(bits.astype(np.uint16))


def int8_to_bf16(q: np.ndarray, threshold: float) -> np.ndarray:
    """int8 -> bf16 value: `bf16(bf16(q) * bf16(th/127))` (exact int8, one rounded product)."""
    step = round_to_bf16(np.float32(threshold) / np.float32(127.0))
    return round_to_bf16(np.asarray(q, np.float32) * step)


def bf16_to_int8(x: np.ndarray, threshold: float) -> np.ndarray:
    """bf16 -> int8: `bf16(x * bf16(127/th))`, rounded half to even and saturated, as the TDMA store converts
    (verified on the vendor simulator: tests/vendor/test_cv18xx_bf16_vendor.py)."""
    scale = round_to_bf16(np.float32(127.0) / np.float32(threshold))
    return saturate(round_half_even(round_to_bf16(np.asarray(x, np.float32) * scale)), np.int8)


def _f32_to_int8(x: np.ndarray, dst: QuantParams) -> np.ndarray:
    return cv18xx_quantize_activation(x, float(dst.threshold))


_CONVERSIONS: dict[tuple[str, str], Callable[[np.ndarray, QuantParams | None, QuantParams | None], np.ndarray]] = {
    ("float32", "int8_sym"): lambda x, s, d: _f32_to_int8(x, d),
    ("float32", "bf16"): lambda x, s, d: truncate_to_bf16(x),
    ("int8_sym", "float32"): lambda x, s, d: int8_to_bf16(x, float(s.threshold)),
    ("int8_sym", "bf16"): lambda x, s, d: int8_to_bf16(x, float(s.threshold)),
    ("bf16", "float32"): lambda x, s, d: np.asarray(x, np.float32),
    ("bf16", "int8_sym"): lambda x, s, d: bf16_to_int8(x, float(d.threshold)),
}


def convert(x: np.ndarray, src: QuantParams | None, dst: QuantParams | None) -> np.ndarray:
    """Convert `x` from format `src` to format `dst` (None = float32)."""
    key = (scheme_of(src), scheme_of(dst))
    if key[0] == key[1]:
        return x
    fn = _CONVERSIONS.get(key)
    if fn is None:
        raise NotImplementedError(f"no conversion from {key[0]} to {key[1]}")
    return fn(x, src, dst)
