"""bf16 convolution sums as the cv18xx TIU forms them: float32 additions rounded toward zero, in a fixed order.

Each product of two bf16 values is exact in float32. The TIU adds them one at a time into a float32
accumulator whose every addition rounds toward zero: kernel positions in row-major order (kh, then kw), the
input channels innermost, the fp32 bias last; the total is then rounded to the nearest even bf16. Found by
fitting the vendor simulator's outputs: over conv_basic, conv_group, conv_5x5, conv_dilated and
conv_depthwise inputs where a float64 sum disagreed with it in the last bit (17 outputs of 55,296), this
order and rounding agree everywhere, while round-to-nearest additions in any of the orders tried do not.

The sum depends on the order, so it loops over the kernel terms (kh·kw·ic steps), each step vectorized over
all outputs (`accumulate_windows` and the matrix multiply's `accumulate_products` live in
compiler/toward_zero.py, where the cv18xx simulator takes them without this package's kernels).

Searches that only rank choices (the per-layer int8 sensitivity scan, whose every trial runs most of the network
in bf16) may run inside `float32_sums()`: there the sums are numpy's float32 convolution (BLAS order, rounding to
nearest; PicoDet's scan 1.6x faster), the bf16 roundings before and after unchanged, so the scan's cosines are
within float noise of the exact ones. The simulator never reads this switch (it takes compiler/toward_zero.py
directly), and no build, no calibration table and no report outside the scan is computed inside it.

A transposed conv runs on the TIU as a stride-1 conv over the input with stride-1 zeros inserted between its
pixels, the filters flipped in h and w with in/out channels swapped (`conv_transpose_as_conv`); the inserted
zeros add exact zeros, so its sums are those of that conv in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from ...ops import ConvTranspose2d
from ...toward_zero import accumulate_windows
from ..conv import conv2d_nchw, pad_hw, windows

_FLOAT32_SUMS: ContextVar[bool] = ContextVar("npuc_bf16_float32_sums", default=False)


@contextmanager
def float32_sums() -> Iterator[None]:
    """Inside: bf16 conv sums in numpy's float32 order and rounding instead of the TIU's (module docstring)."""
    token = _FLOAT32_SUMS.set(True)
    try:
        yield
    finally:
        _FLOAT32_SUMS.reset(token)


def conv2d_sums(x: np.ndarray, w: np.ndarray, strides: tuple[int, int], pads: tuple[int, int, int, int],
                dilations: tuple[int, int], group: int, bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """The float32 sums of a bf16 conv2d (x NCHW, w (OC, C/group, KH, KW)) before the bf16 rounding."""
    x = np.asarray(x, np.float32)
    if _FLOAT32_SUMS.get():
        y = conv2d_nchw(x, np.asarray(w, np.float32), strides, pads, dilations, group)
        return y if bias is None else y + np.asarray(bias, np.float32).reshape(1, -1, 1, 1)
    win = windows(pad_hw(x, pads), w.shape[2:], strides, dilations)
    return accumulate_windows(win, w, group, bias)


def transposed_conv_filter(w: np.ndarray, group: int) -> np.ndarray:
    """ConvTranspose filters (IC, OC/group, KH, KW) as the equivalent conv's (OC, IC/group, KH, KW): channels
    swapped within each group, kernel flipped in h and w."""
    ic, ocg, kh, kw = w.shape
    wt = w.reshape(group, ic // group, ocg, kh, kw).transpose(0, 2, 1, 3, 4).reshape(group * ocg, ic // group, kh, kw)
    return np.ascontiguousarray(wt[:, :, ::-1, ::-1])


def conv_filter_as_transposed(w: np.ndarray, group: int) -> np.ndarray:
    """The inverse of `transposed_conv_filter`: conv filters (OC, IC/group, KH, KW) back to (IC, OC/group, KH, KW)."""
    oc, icg, kh, kw = w.shape
    wt = w[:, :, ::-1, ::-1].reshape(group, oc // group, icg, kh, kw).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(wt.reshape(group * icg, oc // group, kh, kw))


def conv_transpose_pads(a: ConvTranspose2d, kh: int, kw: int) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) pads of the equivalent conv over the spread input (negative: crop)."""
    eh, ew = a.dilations[0] * (kh - 1), a.dilations[1] * (kw - 1)
    top, left, bottom, right = a.pads
    return eh - top, ew - left, eh - bottom + a.output_padding[0], ew - right + a.output_padding[1]


def spread(x: np.ndarray, strides: tuple[int, int]) -> np.ndarray:
    """NCHW `x` with stride-1 zeros inserted between its rows and columns."""
    n, c, h, w = x.shape
    sh, sw = strides
    out = np.zeros((n, c, (h - 1) * sh + 1, (w - 1) * sw + 1), x.dtype)
    out[:, :, ::sh, ::sw] = x
    return out


def conv_transpose_as_conv(x: np.ndarray, w: np.ndarray, a: ConvTranspose2d
                           ) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int, int]]:  # fmt: skip
    """(spread input, conv filters, pads) of the stride-1 conv (dilations a.dilations) equal to the transposed conv."""
    return spread(x, a.strides), transposed_conv_filter(w, a.group), conv_transpose_pads(a, *w.shape[2:])


def conv_transpose2d_sums(
    x: np.ndarray, w: np.ndarray, a: ConvTranspose2d, bias: np.ndarray | None = None
) -> np.ndarray:
    """The float32 sums of a bf16 conv_transpose2d (w (IC, OC/group, KH, KW)) before the bf16 rounding."""
    xs, wc, pads = conv_transpose_as_conv(np.asarray(x, np.float32), np.asarray(w, np.float32), a)
    return conv2d_sums(xs, wc, (1, 1), pads, a.dilations, a.group, bias)
