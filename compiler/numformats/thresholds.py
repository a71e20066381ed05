"""Calibration thresholds as the formats read them: float32 values (the vendor tools hold them as C floats:
they come from float tensors or float protobuf fields), finite and > 0."""

from __future__ import annotations

import numpy as np

from npuc.compiler.errors import UserError


def as_f32(value: float | np.ndarray) -> np.ndarray:
    """`value` as a C float (float32), the type the vendor tools compute thresholds and their ratios in."""
    return np.asarray(value, dtype=np.float32)


def check_threshold(threshold: float | np.ndarray, what: str) -> np.ndarray:
    """`threshold` as float32; a UserError naming `what` when it is not finite and > 0."""
    t = as_f32(threshold)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise UserError(f"{what}: threshold {threshold!r} must be finite and > 0; recalibrate the tensor")
    return t
