"""Row tiling shared by the windowed kernels (conv, depthwise, pooling)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from npuc.backends.cv18xx.tiu import Window


@dataclass(frozen=True)
class Geometry:
    """A 2-D window op on an (ih, iw) input: kernel, stride, dilation, pads (top, left, bottom, right)."""

    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pads: tuple[int, int, int, int]
    ih: int
    iw: int
    oh: int
    ow: int

    def rows_needed(self, out_rows: int) -> int:
        return (out_rows - 1) * self.sh + (self.kh - 1) * self.dh + 1


@dataclass(frozen=True)
class RowTile:
    oh0: int
    oh1: int
    ih0: int  # first input row loaded
    ih1: int
    window: Window


def largest_fit(limit: int, fits: Callable[[int], bool]) -> int:
    """Largest t in 1..limit with fits(t) (fits is monotone); 0 when even 1 does not fit."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def row_tiles(g: Geometry, rows: int) -> Iterator[RowTile]:
    """Output rows in tiles of `rows`, each with the input rows it reads and the padding it needs."""
    top, left, _, right = g.pads
    for oh0 in range(0, g.oh, rows):
        oh1 = min(g.oh, oh0 + rows)
        start = oh0 * g.sh - top
        end = start + g.rows_needed(oh1 - oh0)
        ih0, ih1 = max(0, start), min(g.ih, end)
        # the right pad covers what the last output column reads past the input
        need_w = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1
        win = Window(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, (ih0 - start, end - ih1, left, max(0, need_w - g.iw - left)))
        yield RowTile(oh0, oh1, ih0, ih1, win)
