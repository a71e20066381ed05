"""The fused preprocessing step (backends/cv18xx/preprocess.py): uint8 frame -> the model's first tensor.

Tiled over rows with every channel in one tile, channel k on lane k: each channel is loaded on its own from
the frame channel it comes from (a planar plane, or every C-th byte of a packed frame: the TDMA reads the rows
as one column with a pixel stride), so the colour-order change and the packed -> planar permute cost nothing
extra. int8: one TIU lookup through per-lane tables (lane k holds channel k's). bf16: the load converts the
unsigned bytes to bf16 (exact), then a multiply and an add per channel with that channel's constants.
"""

from __future__ import annotations

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, does_not_fit, kernel, op_where
from npuc.backends.cv18xx.kernels.lut import TABLE_ENTRIES, lookup, table_shape
from npuc.backends.cv18xx.kernels.tiling import largest_fit
from npuc.backends.cv18xx.lmem import GTensor, LTensor, local_bytes
from npuc.backends.cv18xx.preprocess import KIND, FusedPreprocess
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op

MAX_TIU_DIM = 4095


def _lane_tables(lanes: int, tables: np.ndarray) -> np.ndarray:
    """(1, lanes, 16, 16) int8: lane k holds channel k's 256 entries (lanes past the channels stay zero)."""
    out = np.zeros((lanes, TABLE_ENTRIES), np.int8)
    out[: len(tables)] = tables
    return out.reshape(1, lanes, 16, 16)


def _channel_source(frame: GTensor, a: FusedPreprocess, shape: tuple[int, int, int, int], b: int, k: int,
                    rows: tuple[int, int]) -> GTensor:  # fmt: skip
    """Rows h0..h1 of the frame channel model channel k reads, as a gmem operand of unsigned bytes: planar,
    a (1, 1, rows, w) block of its plane; packed, every c-th byte of each row as (rows, 1, w, 1) (the TDMA
    moves w contiguously, so a pixel stride goes in h, and rows - padded when aligned - in n)."""
    n, c, h, w = shape
    s, (h0, h1), f = a.source[k], rows, a.layout
    if a.packed:
        start = frame.offset + b * f.picture + h0 * f.row + s
        return GTensor(frame.region, start, (h1 - h0, 1, w, 1), "u8", (f.row, f.row, c, 1))
    start = frame.offset + b * f.picture + s * f.plane + h0 * f.row
    return GTensor(frame.region, start, (1, 1, h1 - h0, w), "u8", (f.plane, f.plane, f.row, 1))


def _lane_view(cg: Codegen, tile: LTensor, k: int, packed: bool) -> LTensor:
    """Channel k of a tile (on lane k), shaped like the load's source: a packed channel's rows in n."""
    _, _, r, w = tile.shape
    addr = tile.addr + k * cg.chip.lmem_size  # a local address names its lane in the high part
    if packed:
        return LTensor(addr, (r, 1, w, 1), tile.fmt, (w * tile.esz, tile.strides[1], tile.esz, tile.esz))
    return LTensor(addr, (1, 1, r, w), tile.fmt, tile.strides)


@kernel(KIND)
def fused_preprocess(cg: Codegen, op: Op) -> None:
    a: FusedPreprocess = op.attrs
    y = cg.gtensor(op.outputs[0])
    n, c, h, w = y.shape
    if c > cg.chip.lanes:
        raise UserError(f"op '{op.name}': a {c}-channel frame does not fit the chip's {cg.chip.lanes} lanes")
    place = cg.plan.places[op.inputs[0]]
    frame = GTensor(place.region, place.offset, (n, c, h, w), "u8")
    s = cg.stream
    local = cg.local(op)
    int8 = y.fmt == "i8"
    if int8:
        if a.tables is None:
            raise UserError(f"op '{op.name}': an int8 fused preprocess needs its lookup tables")
        gtable = cg.weights.add(f"{op.name}_scale_lut", _lane_tables(cg.chip.lanes, a.tables), "i8")
        table = local.tensor(table_shape(cg.chip), "i8")
        dma.load(s, gtable, table)
    top = local.top
    limit = min(h, MAX_TIU_DIM)
    rows = largest_fit(limit, lambda r: top + local_bytes(cg.chip, (1, c, r, w), y.fmt) <= cg.chip.lmem_size)
    if rows == 0:
        raise does_not_fit(op_where(op), f"one row of its {c}x{h}x{w} frame", cg.chip)
    for b in range(n):
        for h0 in range(0, h, rows):
            span = (h0, min(h, h0 + rows))
            local.reset(top)
            lt = local.tensor((1, c, span[1] - span[0], w), y.fmt)
            for k in range(c):
                dma.load(s, _channel_source(frame, a, (n, c, h, w), b, k, span), _lane_view(cg, lt, k, a.packed))
            if int8:
                s.tiu(lookup(cg.chip, lt, lt, table))
            else:
                for k in range(c):
                    view = _lane_view(cg, lt, k, False)
                    s.tiu(tiu.mul(view, view, int(bf16_bits(np.float32(a.scale[k])))))
                    s.tiu(tiu.add(view, view, int(bf16_bits(np.float32(-a.mean[k] * a.scale[k])))))
            dma.store(s, lt, y.slice(n=(b, b + 1), h=span))
