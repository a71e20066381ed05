"""bf16 convolution sums as the cv18xx TIU forms them: float32 additions rounded toward zero, in a fixed order.

Each product of two bf16 values is exact in float32. The TIU adds them one at a time into a float32
accumulator whose every addition rounds toward zero: kernel positions in row-major order (kh, then kw), the
input channels innermost, the fp32 bias last; the total is then rounded to the nearest even bf16. Found by
fitting the vendor simulator's outputs: over conv_basic, conv_group, conv_5x5, conv_dilated and
conv_depthwise inputs where a float64 sum disagreed with it in the last bit (17 outputs of 55,296), this
order and rounding agree everywhere, while round-to-nearest additions in any of the orders tried do not.

The sum depends on the order, so it loops over the kernel terms (kh·kw·ic steps), each step vectorized over
all outputs; the products of a run of steps are formed at once, then added one after another
(compiler/toward_zero.py).

A transposed conv runs on the TIU as a stride-1 conv over the input with stride-1 zeros inserted between its
pixels, the filters flipped in h and w with in/out channels swapped (`conv_transpose_as_conv`); the inserted
zeros add exact zeros, so its sums are those of that conv in the same order.
"""

from __future__ import annotations

import numpy as np

from ...ops import ConvTranspose2d
from ...toward_zero import TowardZeroSum
from ..conv import pad_hw, windows

CHUNK_ELEMENTS = 1 << 18  # products formed at once before they are added (1 MiB of float32)


def accumulate_windows(win: np.ndarray, w: np.ndarray, group: int, bias: np.ndarray | None = None) -> np.ndarray:
    """float32 sums (N, OC, OH, OW) of bf16 windows `win` (N, C, OH, OW, KH, KW) with filters `w`
    (OC, C/group, KH, KW), plus the fp32 `bias` (OC,), in the TIU's order and rounding."""
    n, c, oh, ow, kh, kw = win.shape
    oc = w.shape[0]
    cg, ocg = c // group, oc // group
    x = np.asarray(win, np.float32)
    f = np.asarray(w, np.float32).reshape(group, ocg, cg, kh, kw)
    total = TowardZeroSum((n, group, ocg, oh * ow))
    step = max(1, CHUNK_ELEMENTS // max(total.acc.size, 1))
    for i in range(kh):
        for j in range(kw):
            # one kernel position's inputs, contiguous per input channel: (cg, n, group, 1, oh * ow)
            xs = np.ascontiguousarray(x[..., i, j].reshape(n, group, cg, oh, ow).transpose(2, 0, 1, 3, 4))
            xs = xs.reshape(cg, n, group, 1, oh * ow)
            fs = np.ascontiguousarray(f[..., i, j].transpose(2, 0, 1))[:, None, :, :, None]
            for k in range(0, cg, step):
                total.add_terms(xs[k : k + step] * fs[k : k + step])
    if bias is not None:
        total.add(np.asarray(bias, np.float32).reshape(1, group, ocg, 1))
    return total.acc.reshape(n, oc, oh, ow)


def accumulate_products(left: np.ndarray, right: np.ndarray, group_width: int, bias: np.ndarray | None = None,
                        ) -> np.ndarray:  # fmt: skip
    """float32 sums (rows, cols) of bf16 matrices `left` (rows, K) @ `right` (K, cols), plus the fp32 `bias`
    (cols,), as the TIU's matrix multiply forms them. K lies in local memory as column groups of
    `group_width` (one per lane); the TIU adds position 0 of every group, then position 1 of every group, and
    so on, each addition rounded toward zero, the bias last. Fitted on the vendor simulator: PP-OCRv6's
    (40 x 160) @ (160 x 80) in groups of 8 agrees on all 3200 sums; K in plain order misses one."""
    left, right = np.asarray(left, np.float32), np.asarray(right, np.float32)
    k_total = left.shape[1]
    order = np.arange(-(-k_total // group_width) * group_width).reshape(-1, group_width).T.ravel()
    order = order[order < k_total]  # position 0 of every group, then position 1, ...
    total = TowardZeroSum((left.shape[0], right.shape[1]))
    step = max(1, CHUNK_ELEMENTS // max(total.acc.size, 1))
    for k in range(0, len(order), step):
        ks = order[k : k + step]
        total.add_terms(left.T[ks][:, :, None] * right[ks][:, None, :])
    if bias is not None:
        total.add(np.asarray(bias, np.float32).reshape(1, -1))
    return total.acc


def conv2d_sums(x: np.ndarray, w: np.ndarray, strides: tuple[int, int], pads: tuple[int, int, int, int],
                dilations: tuple[int, int], group: int, bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """The float32 sums of a bf16 conv2d (x NCHW, w (OC, C/group, KH, KW)) before the bf16 rounding."""
    win = windows(pad_hw(np.asarray(x, np.float32), pads), w.shape[2:], strides, dilations)
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
