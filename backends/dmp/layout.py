"""The DV700 activation layout WHC8 (spec §1.9): 8-channel chunks, each stored x-major, then y, then the
chunk's channels interleaved; the last chunk is not padded."""

from __future__ import annotations

from functools import cache

import numpy as np


@cache
def whc8_positions(w: int, h: int, c: int) -> np.ndarray:
    """(H, W, C) array of each element's index in the flat WHC8 buffer."""
    y, x, ch = np.meshgrid(np.arange(h), np.arange(w), np.arange(c), indexing="ij")
    chunk = ch // 8
    width = np.minimum(8, c - 8 * chunk)
    pos = 8 * chunk * w * h + (x * h + y) * width + (ch - 8 * chunk)
    pos.setflags(write=False)
    return pos


def whc8_encode(hwc: np.ndarray) -> np.ndarray:
    """(H, W, C) -> flat WHC8 array of the same dtype."""
    h, w, c = hwc.shape
    flat = np.empty(h * w * c, hwc.dtype)
    flat[whc8_positions(w, h, c)] = hwc
    return flat


def whc8_decode(flat: np.ndarray, w: int, h: int, c: int) -> np.ndarray:
    """Flat WHC8 array -> (H, W, C)."""
    return flat[whc8_positions(w, h, c)]
