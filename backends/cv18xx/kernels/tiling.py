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
    """A 2-D window op on an (ih, iw) input: kernel, stride, dilation, pads (top, left, bottom, right), and
    the zeros inserted between input rows/columns (a transposed conv); pads count in the spread input."""

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
    ins_h: int = 0
    ins_w: int = 0

    def span(self, out_rows: int) -> int:
        """Rows of the spread, padded input that `out_rows` output rows read."""
        return (out_rows - 1) * self.sh + (self.kh - 1) * self.dh + 1

    def rows_needed(self, out_rows: int) -> int:
        """Input rows `out_rows` output rows read at most (wherever they start)."""
        return -(-self.span(out_rows) // (self.ins_h + 1))

    def spread_hw(self) -> tuple[int, int]:
        """(height, width) of the input once the zeros are inserted."""
        return (self.ih - 1) * (self.ins_h + 1) + 1, (self.iw - 1) * (self.ins_w + 1) + 1


@dataclass(frozen=True)
class RowTile:
    oh0: int
    oh1: int
    ih0: int  # first input row loaded
    ih1: int
    window: Window


def largest_fit(limit: int, fits: Callable[[int], bool], hint: int | None = None) -> int:
    """Largest t in 1..limit with fits(t) (fits is monotone); 0 when even 1 does not fit. A `hint` (a likely
    answer) is tried first, then the value above it: one or two calls where it is right, the same answer
    either way."""
    lo, hi = 0, limit
    if hint is not None and 1 <= hint <= limit:
        if not fits(hint):
            hi = hint - 1
        elif hint == limit or not fits(hint + 1):
            return hint
        else:
            lo = hint + 1
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
    step = g.ins_h + 1  # input row i sits at row i * step of the spread input
    spread_w = g.spread_hw()[1]
    for oh0 in range(0, g.oh, rows):
        oh1 = min(g.oh, oh0 + rows)
        start = oh0 * g.sh - top  # spread rows [start, end) are read
        end = start + g.span(oh1 - oh0)
        ih0, ih1 = max(0, -(-start // step)), min(g.ih, (end - 1) // step + 1)
        # the right pad covers what the last output column reads past the input
        need_w = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1
        pads = (ih0 * step - start, end - (ih1 - 1) * step - 1, left, max(0, need_w - spread_w - left))
        win = Window(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, pads, g.ins_h, g.ins_w)
        yield RowTile(oh0, oh1, ih0, ih1, win)


def stream_rows(
    cg: Codegen,
    op: Op,
    local: LocalAllocator,
    g: Geometry,
    x: GTensor,
    y: GTensor,
    compute: Callable[[LTensor, LTensor, Window, int], None],
) -> None:
    """Produce `y` (one channel tile) from `x` in the largest row tiles that fit above `local.top` (where the
    op's weights already sit): load the rows each tile reads, `compute(out_tile, in_tile, window, first_row)`
    (first_row: the tile's first output row), store.

    Tiles alternate between two buffer sets when that costs at most one extra tile, so the next tile's load
    and the last tile's store run while this tile computes."""
    chip, fmt = cg.chip, x.fmt
    mark = local.top
    ic, oc = x.shape[1], y.shape[1]

    def tile_bytes(rows: int) -> int:
        need = local_bytes(chip, (1, ic, min(g.ih, g.rows_needed(rows)), g.iw), fmt)
        return need + local_bytes(chip, (1, oc, rows, g.ow), fmt)

    single = largest_fit(g.oh, lambda rows: mark + tile_bytes(rows) <= chip.lmem_size)
    if single == 0:
        raise does_not_fit(op_where(op), "one output row with the input rows it reads", chip)
    rows, copies = single, 1
    double = largest_fit(g.oh, lambda rows: mark + 2 * tile_bytes(rows) <= chip.lmem_size)
    if double and -(-g.oh // double) <= -(-g.oh // single) + 1:
        rows, copies = double, 2
    tiles = [(b, tile) for b in range(x.shape[0]) for tile in row_tiles(g, rows)]

    def buffers(j: int) -> tuple[LTensor, LTensor]:
        tile = tiles[j][1]
        local.reset(mark + (j % copies) * tile_bytes(rows))
        lx = local.tensor((1, ic, tile.ih1 - tile.ih0, g.iw), fmt)
        return lx, local.tensor((1, oc, tile.oh1 - tile.oh0, g.ow), fmt)

    def load(j: int) -> None:
        b, tile = tiles[j]
        dma.load(cg.stream, x.slice(n=(b, b + 1), h=(tile.ih0, tile.ih1)), buffers(j)[0])

    def compute_and_store(j: int) -> None:
        b, tile = tiles[j]
        lx, ly = buffers(j)
        compute(ly, lx, tile.window, tile.oh0)
        dma.store(cg.stream, ly, y.slice(n=(b, b + 1), h=(tile.oh0, tile.oh1)))

    pipeline(len(tiles), copies, load, compute_and_store)


def pipeline(count: int, copies: int, load: Callable[[int], None], work: Callable[[int], None]) -> None:
    """Emit `count` tiles: `load(j)` its inputs, then `work(j)` (compute and store). With two buffer copies
    tile j+1's load is issued before tile j's work: the TDMA runs its stream in order, so only then can it
    fetch the next tile while the TIU computes this one (the sync ids carry the true dependencies)."""
    if copies < 2:
        for j in range(count):
            load(j)
            work(j)
        return
    if count:
        load(0)
    for j in range(count):
        if j + 1 < count:
            load(j + 1)
        work(j)
