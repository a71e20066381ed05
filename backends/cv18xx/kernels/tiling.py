"""Row tiling shared by the windowed kernels (conv, depthwise, pooling): each output-row tile loads the input
rows its windows read (the halo included), computes in local memory and is stored back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from npuc.backends.cv18xx import dma
from npuc.backends.cv18xx.codegen import does_not_fit, op_where
from npuc.backends.cv18xx.lmem import GTensor, LocalAllocator, LTensor, local_bytes
from npuc.backends.cv18xx.tiu import Window
from npuc.compiler.ir import Op

if TYPE_CHECKING:
    from npuc.backends.cv18xx.codegen import Codegen


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


def stream_rows(
    cg: Codegen,
    op: Op,
    local: LocalAllocator,
    g: Geometry,
    x: GTensor,
    y: GTensor,
    compute: Callable[[LTensor, LTensor, Window], None],
) -> None:
    """Produce `y` (one channel tile) from `x` in the largest row tiles that fit above `local.top` (where the
    op's weights already sit): load the rows each tile reads, `compute(out_tile, in_tile, window)`, store."""
    chip, fmt = cg.chip, x.fmt
    mark = local.top
    ic, oc = x.shape[1], y.shape[1]

    def fits(rows: int) -> bool:
        need = local_bytes(chip, (1, ic, min(g.ih, g.rows_needed(rows)), g.iw), fmt)
        return mark + need + local_bytes(chip, (1, oc, rows, g.ow), fmt) <= chip.lmem_size

    rows = largest_fit(g.oh, fits)
    if rows == 0:
        raise does_not_fit(op_where(op), "one output row with the input rows it reads", chip)
    for b in range(x.shape[0]):
        for tile in row_tiles(g, rows):
            local.reset(mark)
            lx = local.tensor((1, ic, tile.ih1 - tile.ih0, g.iw), fmt)
            ly = local.tensor((1, oc, tile.oh1 - tile.oh0, g.ow), fmt)
            dma.load(cg.stream, x.slice(n=(b, b + 1), h=(tile.ih0, tile.ih1)), lx)
            compute(ly, lx, tile.window)
            dma.store(cg.stream, ly, y.slice(n=(b, b + 1), h=(tile.oh0, tile.oh1)))
