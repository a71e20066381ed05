"""Pooling kernels: max and average pooling (TIU pool ops), global pooling as one window over H x W.

int8 max pooling pads with -128 and keeps the input's scale; int8 average pooling multiplies the window sum
by an int8 constant and shifts right (multiplier and shift from the quantize pass); bf16 average pooling
multiplies by the bf16 value of 1/(kh*kw), as the hardware has no divider.

Where windows count fewer cells than kh*kw (the padding excluded, ONNX's default, or a ceil_mode overhang)
the output splits into blocks of positions whose windows count equally many (interior, edges, corners):
int8 issues one pool op per block, each with the multiplier/rshift of its count, so every output is rounded
once; bf16 pools the whole tile by 1/(kh*kw), then multiplies each block by the bf16 of kh*kw/count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuc.backends.cv18xx import tiu
from npuc.backends.cv18xx.codegen import Codegen, fused_relu, kernel, quant_of
from npuc.backends.cv18xx.kernels.tiling import Geometry, stream_rows
from npuc.backends.cv18xx.lmem import GTensor, LTensor, local_bytes
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op
from npuc.compiler.kernels.quantized.bf16 import pad_exclusion_factors
from npuc.compiler.kernels.quantized.int8 import pool_requant

BF16_LOWEST = 0xFF7F  # the most negative finite bf16: the max-pool pad value


def _avg_factors(op: Op, g: Geometry) -> tuple[int, int]:
    """(multiplier, right shift) of an average pool: int8 from the quantize pass, bf16 the bf16 of 1/(kh*kw)."""
    q = quant_of(op)
    if q.mode == "bf16":
        return int(bf16_bits(np.float32(1.0 / (g.kh * g.kw)))), 0
    return int(np.asarray(q.multiplier).ravel()[0]), int(np.asarray(q.rshift).ravel()[0])


def check_pool(op: Op, g: Geometry) -> None:
    if max(g.pads) >= 16 or max(g.sh, g.sw) >= 16 or g.dh != 1 or g.dw != 1:
        raise UserError(f"op '{op.name}': pool pads/strides >= 16 or dilation are beyond the TIU pool fields")


@dataclass(frozen=True)
class Borders:
    """Where an average pool's windows count fewer than kh*kw cells: int8 pools each block of output positions
    with its own (multiplier, rshift); bf16 multiplies each block by the bf16 of kh*kw/count after the pool."""

    pools: tuple[tuple[int, int, int, int, int, int], ...] = ()  # (row0, row1, col0, col1, multiplier, rshift)
    rescales: tuple[tuple[int, int, int, int, int], ...] = ()  # (row0, row1, col0, col1, bf16 bits)


NO_BORDERS = Borders()


def borders(op: Op, x_shape: tuple[int, ...], y_shape: tuple[int, ...]) -> Borders:
    """The blocks of a pool whose windows count different numbers of cells (none for max or full windows)."""
    q = quant_of(op)
    if op.kind != "pool2d" or op.attrs.mode != "avg":
        return NO_BORDERS
    if q.mode == "bf16":
        factors = pad_exclusion_factors(op, x_shape[2:], y_shape[2:])
        return NO_BORDERS if factors is None else Borders(rescales=tuple(exclusion_blocks(factors)))
    if q.position_multiplier is None:
        return NO_BORDERS
    return Borders(pools=tuple(requant_blocks(*pool_requant(q))))


def pool_tile(cg: Codegen, op: Op, mode: str, g: Geometry, out: LTensor, x: LTensor, win: tiu.Window,
              oh0: int = 0, edges: Borders = NO_BORDERS) -> None:  # fmt: skip
    """The TIU ops of one pooling tile (both operands in the default local layout) whose first output row is
    `oh0`; `edges` splits an average pool into blocks (see Borders)."""
    s = cg.stream
    bf16 = quant_of(op).mode == "bf16"
    relu, relu_max = fused_relu(op)
    if mode == "max":
        s.tiu(tiu.max_pool(out, x, win, BF16_LOWEST if bf16 else -128))
        if relu:
            s.tiu(tiu.maximum(out, out, 0))
    elif edges.pools:
        _block_pools(cg, op, g, out, x, win, oh0, edges.pools)
    else:
        mult, rshift = _avg_factors(op, g)
        s.tiu(tiu.avg_pool(out, x, win, mult, rshift, relu))
    _rescale_tile(cg, out, oh0, edges.rescales)
    if relu_max is not None:
        s.tiu(tiu.minimum(out, out, relu_max))


def _runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) runs of equal consecutive rows of an array (compared over all trailing axes)."""
    flat = rows.reshape(len(rows), -1)
    starts = [0, *(np.nonzero(np.any(flat[1:] != flat[:-1], axis=1))[0] + 1).tolist()]
    return list(zip(starts, [*starts[1:], len(rows)]))


def _blocks(table: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(row0, row1, col0, col1) blocks of an (oh, ow, ...) table, constant within each block."""
    cols = _runs(np.swapaxes(table, 0, 1))
    return [(r0, r1, c0, c1) for r0, r1 in _runs(table) for c0, c1 in cols]


def exclusion_blocks(factors: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """(row0, row1, col0, col1, bf16 bits) of the output blocks whose average needs rescaling."""
    return [(r0, r1, c0, c1, int(bf16_bits(factors[r0, c0])))
            for r0, r1, c0, c1 in _blocks(factors) if factors[r0, c0] != 1.0]  # fmt: skip


def requant_blocks(multiplier: np.ndarray, rshift: np.ndarray) -> list[tuple[int, int, int, int, int, int]]:
    """(row0, row1, col0, col1, multiplier, rshift) of the output blocks of an int8 average pool whose
    windows count different numbers of cells: one TIU pool op each."""
    table = np.stack([multiplier, rshift], axis=-1)
    return [(r0, r1, c0, c1, int(multiplier[r0, c0]), int(rshift[r0, c0])) for r0, r1, c0, c1 in _blocks(table)]


def _view(t: LTensor, rows: tuple[int, int], cols: tuple[int, int]) -> LTensor:
    """Rows x cols of every channel of a local tensor, with its strides (an explicit-stride operand)."""
    addr = t.addr + rows[0] * t.strides[2] + cols[0] * t.strides[3]
    return LTensor(addr, (t.shape[0], t.shape[1], rows[1] - rows[0], cols[1] - cols[0]), t.fmt, t.strides)


def _span(first: int, last: int, stride: int, taps: int, pad: int, size: int) -> tuple[tuple[int, int], int, int]:
    """Input range [a, b) the outputs first..last read along one axis, and the pads before/after it."""
    a, b = first * stride - pad, last * stride - pad + taps
    return (max(a, 0), min(b, size)), max(0, -a), max(0, b - size)


def _block_pools(cg: Codegen, op: Op, g: Geometry, out: LTensor, x: LTensor, win: tiu.Window, oh0: int,
                 blocks: tuple[tuple[int, int, int, int, int, int], ...]) -> None:  # fmt: skip
    """One int8 TIU average pool per block meeting the tile's output rows [oh0, oh0 + rows)."""
    relu = fused_relu(op)[0]
    top, left = win.pads[0], win.pads[2]
    for r0, r1, c0, c1, mult, rshift in blocks:
        lo, hi = max(r0, oh0) - oh0, min(r1, oh0 + out.shape[2]) - oh0
        if lo >= hi:
            continue
        rows, up, down = _span(lo, hi - 1, g.sh, (g.kh - 1) * g.dh + 1, top, x.shape[2])
        cols, lf, rt = _span(c0, c1 - 1, g.sw, (g.kw - 1) * g.dw + 1, left, x.shape[3])
        if rows[0] >= rows[1] or cols[0] >= cols[1]:
            raise UserError(
                f"op '{op.name}': a pool window lies wholly in the padding; use pads smaller than the kernel"
            )
        src, dst = _view(x, rows, cols), _view(out, (lo, hi), (c0, c1))
        block_win = tiu.Window(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, (up, down, lf, rt))
        fields = tiu.avg_pool(dst, src, block_win, mult, rshift, relu)
        fields.update({**tiu.operand("res0", dst), **tiu.operand("opd0", src)})  # sub-blocks: explicit strides
        cg.stream.tiu(fields)


def _rescale_tile(cg: Codegen, out: LTensor, oh0: int, blocks: tuple[tuple[int, int, int, int, int], ...]) -> None:
    """Multiply the blocks that meet output rows [oh0, oh0 + rows) of a tile by their constants."""
    oh1 = oh0 + out.shape[2]
    e = out.esz
    for r0, r1, c0, c1, bits in blocks:
        lo, hi = max(r0, oh0), min(r1, oh1)
        if lo >= hi:
            continue
        view = LTensor(out.addr + ((lo - oh0) * out.shape[3] + c0) * e, (1, out.shape[1], hi - lo, c1 - c0),
                       out.fmt, (out.strides[0], out.strides[1], out.strides[2], e))  # fmt: skip
        cg.stream.tiu(tiu.mul(view, view, bits))


def _pool(cg: Codegen, op: Op, mode: str, g: Geometry, x: GTensor, y: GTensor, edges: Borders = NO_BORDERS) -> None:
    chip = cg.chip
    fmt = x.fmt
    c = x.shape[1]
    check_pool(op, g)
    local = cg.local(op)
    tile_c = c
    while tile_c > chip.lanes and local_bytes(chip, (1, tile_c, min(g.ih, g.rows_needed(1)), g.iw), fmt) + \
            local_bytes(chip, (1, tile_c, 1, g.ow), fmt) > chip.lmem_size:  # fmt: skip
        tile_c = max(chip.lanes, (tile_c // 2 + chip.lanes - 1) // chip.lanes * chip.lanes)

    def compute(ly: LTensor, lx: LTensor, win: tiu.Window, oh0: int) -> None:
        pool_tile(cg, op, mode, g, ly, lx, win, oh0, edges)

    for c0 in range(0, c, tile_c):
        cs = (c0, min(c, c0 + tile_c))
        local.reset()
        stream_rows(cg, op, local, g, x.slice(c=cs), y.slice(c=cs), compute)


def pool_geometry(op: Op, x_shape: tuple[int, ...], y_shape: tuple[int, ...]) -> Geometry:
    a = op.attrs
    top, left, _, _ = a.pads
    ih, iw, oh, ow = x_shape[2], x_shape[3], y_shape[2], y_shape[3]
    # ceil-mode windows read past the input: the bottom/right pads cover them
    bottom = max(0, (oh - 1) * a.strides[0] + a.kernel[0] - ih - top)
    right = max(0, (ow - 1) * a.strides[1] + a.kernel[1] - iw - left)
    return Geometry(*a.kernel, *a.strides, *a.dilations, (top, left, bottom, right), ih, iw, oh, ow)


@kernel("pool2d")
def pool2d(cg: Codegen, op: Op) -> None:
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    g = pool_geometry(op, x.shape, y.shape)
    _pool(cg, op, op.attrs.mode, g, x, y, borders(op, x.shape, y.shape))


@kernel("global_pool")
def global_pool(cg: Codegen, op: Op) -> None:
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    ih, iw = x.shape[2], x.shape[3]
    if ih > 4095 or iw > 4095:
        raise UserError(f"op '{op.name}': a {ih}x{iw} global pool exceeds the TIU kernel size fields")
    g = Geometry(ih, iw, 1, 1, 1, 1, (0, 0, 0, 0), ih, iw, 1, 1)
    _pool(cg, op, op.attrs.mode, g, x, y)
