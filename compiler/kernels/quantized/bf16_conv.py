"""bf16 convolution sums as the cv18xx TIU forms them: float32 additions rounded toward zero, in a fixed order.

Each product of two bf16 values is exact in float32. The TIU adds them one at a time into a float32
accumulator whose every addition rounds toward zero: kernel positions in row-major order (kh, then kw), the
input channels innermost, the fp32 bias last; the total is then rounded to the nearest even bf16. Found by
fitting the vendor simulator's outputs: over conv_basic, conv_group, conv_5x5, conv_dilated and
conv_depthwise inputs where a float64 sum disagreed with it in the last bit (17 outputs of 55,296), this
order and rounding agree everywhere, while round-to-nearest additions in any of the orders tried do not.

The sum depends on the order, so it loops over the kernel terms (kh·kw·ic steps), each step vectorized over
all outputs.
"""

from __future__ import annotations

import numpy as np

from ..conv import pad_hw, windows


def add_toward_zero(acc: np.ndarray, term: np.ndarray) -> np.ndarray:
    """float32 `acc + term` rounded toward zero. The float64 sum and its exact error (TwoSum) give the
    true sum's side of the nearest float32, so the result is exact even when float64 cannot hold the sum."""
    a = np.asarray(acc, np.float64)
    b = np.asarray(term, np.float64)
    s = a + b
    t = s - a
    err = (a - (s - t)) + (b - t)  # the exact sum is s + err
    with np.errstate(over="ignore"):
        nearest = s.astype(np.float32)
    beyond = (nearest.astype(np.float64) - s) - err  # nearest - exact sum; its sign is exact
    outward = (beyond != 0) & (np.signbit(beyond) == np.signbit(nearest)) & (nearest != 0)
    return np.where(outward, np.nextafter(nearest, np.float32(0)), nearest).astype(np.float32)


def accumulate_windows(win: np.ndarray, w: np.ndarray, group: int, bias: np.ndarray | None = None) -> np.ndarray:
    """float32 sums (N, OC, OH, OW) of bf16 windows `win` (N, C, OH, OW, KH, KW) with filters `w`
    (OC, C/group, KH, KW), plus the fp32 `bias` (OC,), in the TIU's order and rounding."""
    n, c, oh, ow, kh, kw = win.shape
    oc = w.shape[0]
    cg, ocg = c // group, oc // group
    x = np.asarray(win, np.float32).reshape(n, group, 1, cg, oh, ow, kh, kw)
    f = np.asarray(w, np.float32).reshape(1, group, ocg, cg, 1, 1, kh, kw)
    acc = np.zeros((n, group, ocg, oh, ow), np.float32)
    for i in range(kh):
        for j in range(kw):
            for k in range(cg):
                acc = add_toward_zero(acc, x[:, :, :, k, :, :, i, j] * f[:, :, :, k, :, :, i, j])
    acc = acc.reshape(n, oc, oh, ow)
    if bias is not None:
        acc = add_toward_zero(acc, np.asarray(bias, np.float32).reshape(1, oc, 1, 1))
    return acc


def conv2d_sums(x: np.ndarray, w: np.ndarray, strides: tuple[int, int], pads: tuple[int, int, int, int],
                dilations: tuple[int, int], group: int, bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """The float32 sums of a bf16 conv2d (x NCHW, w (OC, C/group, KH, KW)) before the bf16 rounding."""
    win = windows(pad_hw(np.asarray(x, np.float32), pads), w.shape[2:], strides, dilations)
    return accumulate_windows(win, w, group, bias)
