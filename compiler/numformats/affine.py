"""Asymmetric (zero point) int8 / uint8: the scale and zero point covering a range, and ONNX
QuantizeLinear / DequantizeLinear on them."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.numformats.rounding import round_half_even


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
