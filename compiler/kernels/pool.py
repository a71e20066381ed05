"""Windowed reductions: 2-D max/avg pooling, global pooling, and local response normalization."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..ir import Op
from ..ops import pool_out_size
from .activation import apply_activation
from .conv import pad_hw, windows
from .registry import float_kernel


def _lowest(dtype: np.dtype) -> float | int:
    return np.iinfo(dtype).min if np.issubdtype(dtype, np.integer) else -np.inf


@float_kernel("pool2d")
def pool2d(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a = op.attrs
    x = inputs[0]
    h, w = x.shape[2:]
    top, left, bottom, right = a.pads
    out_hw = [
        pool_out_size(size, k, s, d, pb, pe, a.ceil_mode)
        for size, k, s, d, pb, pe in zip(
            (h, w), a.kernel, a.strides, a.dilations, (top, left), (bottom, right), strict=True
        )
    ]
    # ceil_mode windows may run past the end padding: extend (or trim) the end so exactly out_hw fit
    need = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(out_hw, a.strides, a.dilations, a.kernel, strict=True)]
    extra = (need[0] - (h + top + bottom), need[1] - (w + left + right))
    full = (top, left, bottom + extra[0], right + extra[1])

    if a.mode == "max":
        y = windows(pad_hw(x, full, _lowest(x.dtype)), a.kernel, a.strides, a.dilations).max(axis=(4, 5))
    else:
        total = windows(pad_hw(x, full), a.kernel, a.strides, a.dilations).sum(axis=(4, 5), dtype=x.dtype)
        # Divisor: window cells inside the input, plus the explicit pads when count_include_pad.
        mask = np.ones((1, 1, h, w), x.dtype)
        if a.count_include_pad:
            mask = pad_hw(mask, a.pads, 1.0)
            mask = pad_hw(mask, (0, 0, extra[0], extra[1]))
        else:
            mask = pad_hw(mask, full)
        count = windows(mask, a.kernel, a.strides, a.dilations).sum(axis=(4, 5), dtype=x.dtype)
        y = total / count
    return [apply_activation(np.ascontiguousarray(y), a.act)]


@float_kernel("global_pool")
def global_pool(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x = inputs[0]
    axes = tuple(range(2, x.ndim))
    if op.attrs.mode == "max":
        return [x.max(axis=axes, keepdims=True)]
    return [x.mean(axis=axes, keepdims=True, dtype=x.dtype)]


@float_kernel("lrn")
def lrn(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    # ONNX LRN: the sum of squares over channels [c - floor((size-1)/2), c + ceil((size-1)/2)].
    a = op.attrs
    x = inputs[0]
    before, after = (a.size - 1) // 2, a.size - 1 - (a.size - 1) // 2
    sq = np.pad(x * x, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    square_sum = sliding_window_view(sq, a.size, axis=1).sum(axis=-1, dtype=x.dtype)
    t = x.dtype.type
    return [x / (t(a.bias) + t(a.alpha / a.size) * square_sum) ** t(a.beta)]
