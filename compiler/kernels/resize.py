"""ONNX Resize: separable per-axis resampling (nearest, linear, cubic, antialias) with tap tables.

Each resized axis gets a table of input indices and weights per output position; applying it is one
gather plus a weighted sum, so there are no per-pixel loops. Sampling positions follow the ONNX spec:
the left neighbour of a source coordinate x is p = ceil(x) - 1 and the fraction r = x - p lies in (0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..errors import UserError
from ..ir import Op
from ..ops import Resize
from .registry import float_kernel


def _half_pixel(y: np.ndarray, scale: np.float32, n_in: int, n_out: int, roi: tuple[float, float]) -> np.ndarray:
    return (y + 0.5) / scale - 0.5


def _half_pixel_symmetric(y, scale, n_in, n_out, roi):
    # the offset in float32, the rest in float64 rounded once: onnxruntime's order of evaluation
    f = np.float32
    offset = f(n_in) / f(2) * (f(1) - f(n_out) / (scale * f(n_in)))
    return (np.float64(offset) + (y.astype(np.float64) + 0.5) / np.float64(scale) - 0.5).astype(np.float32)


def _pytorch_half_pixel(y, scale, n_in, n_out, roi):
    return (y + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(y)


def _align_corners(y, scale, n_in, n_out, roi):
    return y * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(y)


def _asymmetric(y, scale, n_in, n_out, roi):
    return y / scale


def _tf_half_pixel_for_nn(y, scale, n_in, n_out, roi):
    return (y + 0.5) / scale


def _tf_crop_and_resize(y, scale, n_in, n_out, roi):
    start, end = np.float32(roi[0]), np.float32(roi[1])
    if n_out > 1:
        return start * (n_in - 1) + y * (end - start) * (n_in - 1) / (n_out - 1)
    return np.full_like(y, np.float32(0.5) * (start + end) * (n_in - 1))


# Source coordinates are computed in float32, as onnxruntime does, so nearest-mode ties round alike.
CoordFn = Callable[[np.ndarray, np.float32, int, int, tuple[float, float]], np.ndarray]
COORD_MODES: dict[str, CoordFn] = {
    "half_pixel": _half_pixel,
    "half_pixel_symmetric": _half_pixel_symmetric,
    "pytorch_half_pixel": _pytorch_half_pixel,
    "align_corners": _align_corners,
    "asymmetric": _asymmetric,
    "tf_half_pixel_for_nn": _tf_half_pixel_for_nn,
    "tf_crop_and_resize": _tf_crop_and_resize,
}

# Nearest index from the left neighbour p and fraction r in (0, 1].
NEAREST_MODES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda p, r: p + (r > 0.5),
    "round_prefer_ceil": lambda p, r: p + (r >= 0.5),
    "floor": lambda p, r: np.where(r == 1.0, p + 1, p),
    "ceil": lambda p, r: p + 1,
}


def _linear_weight(d: np.ndarray, a: Resize) -> np.ndarray:
    return np.clip(1 - np.abs(d), 0, 1)


def _cubic_weight(d: np.ndarray, a: Resize) -> np.ndarray:
    # Keys' cubic convolution kernel with coefficient A.
    A = a.cubic_coeff_a
    d = np.abs(d)
    near = ((A + 2) * d - (A + 3)) * d * d + 1
    far = ((A * d - 5 * A) * d + 8 * A) * d - 4 * A
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


# mode → (kernel function of the signed distance, half-width of its support in input pixels)
_FILTERS: dict[str, tuple[Callable[[np.ndarray, Resize], np.ndarray], int]] = {
    "linear": (_linear_weight, 1),
    "cubic": (_cubic_weight, 2),
}


def axis_taps(
    a: Resize, n_in: int, n_out: int, scale: float, roi: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Per output position along one axis: input indices (n_out, T), weights (n_out, T), outside mask."""
    y = np.arange(n_out, dtype=np.float32)
    x = COORD_MODES[a.coord_mode](y, np.float32(scale), n_in, n_out, roi).astype(np.float64)
    outside = (x < 0) | (x > n_in - 1) if a.coord_mode == "tf_crop_and_resize" else None
    p = np.ceil(x).astype(np.int64) - 1
    r = x - p
    if a.mode == "nearest":
        idx = NEAREST_MODES[a.nearest_mode](p, r)[:, None]
        return np.clip(idx, 0, n_in - 1), None, outside
    fn, support = _FILTERS[a.mode]
    # Antialias stretches the filter by 1/scale when downscaling, so more inputs contribute.
    stretch = min(scale, 1.0) if a.antialias else 1.0
    first = math.floor(-support / stretch) + 1
    offsets = np.arange(first, 2 - first)
    idx = p[:, None] + offsets[None, :]
    w = fn((offsets[None, :] - r[:, None]) * stretch, a)
    if a.exclude_outside:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
    total = w.sum(axis=1, keepdims=True)
    if a.antialias or a.exclude_outside:
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n_in - 1), w, outside


def _resample_axis(x: np.ndarray, axis: int, idx: np.ndarray, w: np.ndarray | None, dtype) -> np.ndarray:
    n_out, taps = idx.shape
    gathered = np.take(x, idx.ravel(), axis=axis)
    if w is None:
        return gathered
    shape = x.shape[:axis] + (n_out, taps) + x.shape[axis + 1 :]
    wshape = (1,) * axis + (n_out, taps) + (1,) * (x.ndim - axis - 1)
    return np.sum(gathered.reshape(shape) * w.astype(dtype).reshape(wshape), axis=axis + 1)


@float_kernel("resize")
def resize(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a: Resize = op.attrs
    x = inputs[0]
    rank = x.ndim
    if a.coord_mode not in COORD_MODES or a.mode not in ("nearest", *_FILTERS):
        raise UserError(f"op '{op.name}' (resize): unsupported mode {a.mode!r} / {a.coord_mode!r}")
    compute = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float32)
    y = x.astype(compute, copy=False)
    scales = a.scales if len(a.scales) == rank else tuple(o / i for o, i in zip(a.out_shape, x.shape, strict=True))
    roi = a.roi if len(a.roi) == 2 * rank else (0.0,) * rank + (1.0,) * rank
    for axis in range(rank):
        n_in, n_out, scale = x.shape[axis], int(a.out_shape[axis]), float(scales[axis])
        axis_roi = (float(roi[axis]), float(roi[axis + rank]))
        if n_in == n_out and math.isclose(scale, 1.0) and axis_roi == (0.0, 1.0):
            continue  # identity along this axis
        idx, w, outside = axis_taps(a, n_in, n_out, scale, axis_roi)
        y = _resample_axis(y, axis, idx, w, compute)
        if outside is not None and outside.any():
            mask = outside.reshape((1,) * axis + (n_out,) + (1,) * (rank - axis - 1))
            y = np.where(mask, compute.type(a.extrapolation_value), y)
    if compute != x.dtype:
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return [np.ascontiguousarray(y, dtype=x.dtype)]
