"""Pooling kernels: max and average pooling (TIU pool ops), global pooling as one window over H x W.

int8 max pooling pads with -128 and keeps the input's scale; int8 average pooling multiplies the window sum
by an int8 constant and shifts right (multiplier and shift from the quantize pass); bf16 average pooling
multiplies by the bf16 value of 1/(kh*kw), as the hardware has no divider. A bf16 average that excludes the
padding then multiplies each block of output positions whose windows cover equally many input cells by the
bf16 of kh*kw/count (a constant per block, so a few TIU ops per tile); int8 keeps the 1/(kh*kw) average.
"""

from __future__ import annotations

import numpy as np
from npuc.backends.cv18xx import tiu
from npuc.backends.cv18xx.codegen import Codegen, fused_relu, kernel, quant_of
from npuc.backends.cv18xx.kernels.tiling import Geometry, stream_rows
from npuc.backends.cv18xx.lmem import GTensor, LTensor, local_bytes
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op
from npuc.compiler.kernels.quantized.bf16 import pad_exclusion_factors

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


def pool_tile(cg: Codegen, op: Op, mode: str, g: Geometry, out: LTensor, x: LTensor, win: tiu.Window) -> None:
    """The TIU ops of one pooling tile (both operands in the default local layout)."""
    s = cg.stream
    bf16 = quant_of(op).mode == "bf16"
    relu, relu_max = fused_relu(op)
    if mode == "max":
        s.tiu(tiu.max_pool(out, x, win, BF16_LOWEST if bf16 else -128))
        if relu:
            s.tiu(tiu.maximum(out, out, 0))
    else:
        mult, rshift = _avg_factors(op, g)
        s.tiu(tiu.avg_pool(out, x, win, mult, rshift, relu))
    if relu_max is not None:
        s.tiu(tiu.minimum(out, out, relu_max))


def _runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) runs of equal consecutive rows of a 2-D array."""
    starts = [0, *(np.nonzero(np.any(rows[1:] != rows[:-1], axis=1))[0] + 1).tolist()]
    return list(zip(starts, [*starts[1:], len(rows)]))


def exclusion_blocks(factors: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """(row0, row1, col0, col1, bf16 bits) of the output blocks whose average needs rescaling."""
    blocks = []
    for r0, r1 in _runs(factors):
        for c0, c1 in _runs(factors.T):
            if factors[r0, c0] != 1.0:
                blocks.append((r0, r1, c0, c1, int(bf16_bits(factors[r0, c0]))))
    return blocks


def _rescale_tile(cg: Codegen, out: LTensor, oh0: int, blocks: list[tuple[int, int, int, int, int]]) -> None:
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


def _pool(cg: Codegen, op: Op, mode: str, g: Geometry, x: GTensor, y: GTensor,
          blocks: list[tuple[int, int, int, int, int]] = ()) -> None:  # fmt: skip
    chip = cg.chip
    fmt = x.fmt
    c = x.shape[1]
    check_pool(op, g)
    local = cg.local(op)
    tile_c = c
    while tile_c > chip.lanes and local_bytes(chip, (1, tile_c, min(g.ih, g.rows_needed(1)), g.iw), fmt) + \
            local_bytes(chip, (1, tile_c, 1, g.ow), fmt) > chip.lmem_size:  # fmt: skip
        tile_c = max(chip.lanes, (tile_c // 2 + chip.lanes - 1) // chip.lanes * chip.lanes)
    done = [0]  # output rows computed so far: tiles come in row order, image after image, channel tile after tile

    def compute(ly: LTensor, lx: LTensor, win: tiu.Window) -> None:
        pool_tile(cg, op, mode, g, ly, lx, win)
        _rescale_tile(cg, ly, done[0] % g.oh, blocks)
        done[0] += ly.shape[2]

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


def pool_supported(op: Op) -> bool:
    """Whether one TIU pool op per tile computes the op (what a layer group fuses); a bf16 average that
    excludes the padding also rescales blocks of each tile, which only the stand-alone kernel does."""
    a = op.attrs
    return not (a.mode == "avg" and not a.count_include_pad and any(a.pads) and quant_of(op).mode == "bf16")


@kernel("pool2d")
def pool2d(cg: Codegen, op: Op) -> None:
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    g = pool_geometry(op, x.shape, y.shape)
    factors = pad_exclusion_factors(op, x.shape[2:], y.shape[2:]) if quant_of(op).mode == "bf16" else None
    _pool(cg, op, op.attrs.mode, g, x, y, exclusion_blocks(factors) if factors is not None else [])


@kernel("global_pool")
def global_pool(cg: Codegen, op: Op) -> None:
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    ih, iw = x.shape[2], x.shape[3]
    if ih > 4095 or iw > 4095:
        raise UserError(f"op '{op.name}': a {ih}x{iw} global pool exceeds the TIU kernel size fields")
    g = Geometry(ih, iw, 1, 1, 1, 1, (0, 0, 0, 0), ih, iw, 1, 1)
    _pool(cg, op, op.attrs.mode, g, x, y)
