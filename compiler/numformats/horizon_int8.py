"""Horizon BPU int8 / uint8 tensor boundaries (hbDNN quantiType SHIFT / SCALE; dmp-lyngor-horizon.md §3.3),
per tensor or per axis."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.numformats.rounding import round_half_even

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
