"""2-D convolution and transposed convolution (NCHW), via im2col views and batched matmul."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..ir import Op
from .activation import apply_activation
from .registry import float_kernel


def pad_hw(x: np.ndarray, pads: tuple[int, int, int, int], value: float = 0.0) -> np.ndarray:
    """Pad (positive) or crop (negative) the last two axes by top, left, bottom, right."""
    top, left, bottom, right = (int(p) for p in pads)
    width = [(0, 0)] * (x.ndim - 2) + [(max(top, 0), max(bottom, 0)), (max(left, 0), max(right, 0))]
    if any(p > 0 for p in (top, left, bottom, right)):
        x = np.pad(x, width, constant_values=value)
    h, w = x.shape[-2:]
    return x[..., max(-top, 0) : h - max(-bottom, 0), max(-left, 0) : w - max(-right, 0)]


def windows(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int]):
    """View of every (dilated) kernel window of an already padded NCHW array: (N, C, OH, OW, KH, KW)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    span = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    view = sliding_window_view(x, span, axis=(2, 3))
    return view[:, :, ::sh, ::sw, ::dh, ::dw]


DEPTHWISE_BLOCK_BYTES = 1 << 19  # output channels summed together: their block stays in a core's cache


def depthwise_nchw(
    x: np.ndarray, w: np.ndarray, strides: tuple[int, int], pads: tuple[int, int, int, int], dilations: tuple[int, int]
) -> np.ndarray:
    """Depthwise cross-correlation (w: (C, 1, KH, KW)) as a sum over the kernel taps of weight x shifted slice, in
    x's dtype: no im2col copy, whose tiny per-channel products cost far more than the taps on large pictures.
    Channels go in blocks of about DEPTHWISE_BLOCK_BYTES of output, every tap over one block before the next
    (1.2-1.8x on PicoDet's maps); each element sums its taps in the same order either way."""
    (sh, sw), (dh, dw) = strides, dilations
    n, c = x.shape[:2]
    _, _, kh, kw = w.shape
    xp = pad_hw(x, pads)
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, c, oh, ow), x.dtype)
    taps = w[:, 0].astype(x.dtype, copy=False)
    step = max(1, DEPTHWISE_BLOCK_BYTES // max(n * oh * ow * out.itemsize, 1))
    product = np.empty((n, min(step, c), oh, ow), x.dtype)
    for c0 in range(0, c, step):  # loops over channel blocks and kernel taps; each step is vectorised
        block, tmp = out[:, c0 : c0 + step], product[:, : min(step, c - c0)]
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
                part = xp[:, c0 : c0 + step, rows, j * dw : j * dw + sw * (ow - 1) + 1 : sw]
                np.multiply(part, taps[c0 : c0 + step, i, j].reshape(1, -1, 1, 1), out=tmp)
                block += tmp
    return out


def conv2d_nchw(
    x: np.ndarray,
    w: np.ndarray,
    strides: tuple[int, int],
    pads: tuple[int, int, int, int],
    dilations: tuple[int, int],
    group: int,
) -> np.ndarray:
    """Grouped 2-D cross-correlation without bias; x is NCHW, w is (OC, C/group, KH, KW)."""
    n = x.shape[0]
    oc, cg, kh, kw = w.shape
    if cg == 1 and oc == group == x.shape[1] and group > 1:
        return depthwise_nchw(x, w, strides, pads, dilations)
    win = windows(pad_hw(x, pads), (kh, kw), strides, dilations)  # (N, C, OH, OW, KH, KW)
    oh, ow = win.shape[2:4]
    win = win.reshape(n, group, cg, oh, ow, kh, kw)
    cols = win.transpose(1, 0, 3, 4, 2, 5, 6).reshape(group, n * oh * ow, cg * kh * kw)
    wmat = w.reshape(group, oc // group, cg * kh * kw).transpose(0, 2, 1)
    out = np.matmul(cols, wmat.astype(x.dtype, copy=False))  # (G, N*OH*OW, OC/G)
    return out.reshape(group, n, oh, ow, oc // group).transpose(1, 0, 4, 2, 3).reshape(n, oc, oh, ow)


def _add_bias(y: np.ndarray, inputs: list[np.ndarray]) -> np.ndarray:
    if len(inputs) > 2:
        y = y + inputs[2].astype(y.dtype).reshape(1, -1, 1, 1)
    return y


@float_kernel("conv2d")
def conv2d(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a = op.attrs
    y = conv2d_nchw(inputs[0], inputs[1], a.strides, a.pads, a.dilations, a.group)
    return [apply_activation(_add_bias(y, inputs), a.act)]


@float_kernel("conv_transpose2d")
def conv_transpose2d(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    # A transposed conv is a stride-1 conv of the zero-stuffed input with the flipped, transposed kernel.
    a = op.attrs
    x, w = inputs[0], inputs[1]
    n, c, h, wd = x.shape
    _, ocg, kh, kw = w.shape
    (sh, sw), (dh, dw), g = a.strides, a.dilations, a.group
    stuffed = np.zeros((n, c, (h - 1) * sh + 1, (wd - 1) * sw + 1), x.dtype)
    stuffed[:, :, ::sh, ::sw] = x
    eh, ew = dh * (kh - 1), dw * (kw - 1)
    top, left, bottom, right = a.pads
    pads = (eh - top, ew - left, eh - bottom + a.output_padding[0], ew - right + a.output_padding[1])
    wt = w.reshape(g, c // g, ocg, kh, kw).transpose(0, 2, 1, 3, 4).reshape(g * ocg, c // g, kh, kw)
    y = conv2d_nchw(stuffed, wt[:, :, ::-1, ::-1], (1, 1), pads, (dh, dw), g)
    return [apply_activation(_add_bias(y, inputs), a.act)]
