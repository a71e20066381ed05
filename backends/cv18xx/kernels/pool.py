"""Pooling kernels: max and average pooling (TIU pool ops), global pooling as one window over H x W.

int8 max pooling pads with -128 and keeps the input's scale; int8 average pooling multiplies the window sum
by an int8 constant and shifts right (multiplier and shift from the quantize pass); bf16 average pooling
multiplies by the bf16 value of 1/(kh*kw), as the hardware has no divider.
"""

from __future__ import annotations

import numpy as np
from npuc.backends.cv18xx import tiu
from npuc.backends.cv18xx.codegen import Codegen, fused_relu, kernel, no_kernel, quant_of
from npuc.backends.cv18xx.kernels.tiling import Geometry, stream_rows
from npuc.backends.cv18xx.lmem import GTensor, LTensor, local_bytes
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op

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


def _pool(cg: Codegen, op: Op, mode: str, g: Geometry, x: GTensor, y: GTensor) -> None:
    chip = cg.chip
    fmt = x.fmt
    c = x.shape[1]
    check_pool(op, g)
    local = cg.local(op)
    tile_c = c
    while tile_c > chip.lanes and local_bytes(chip, (1, tile_c, min(g.ih, g.rows_needed(1)), g.iw), fmt) + \
            local_bytes(chip, (1, tile_c, 1, g.ow), fmt) > chip.lmem_size:  # fmt: skip
        tile_c = max(chip.lanes, (tile_c // 2 + chip.lanes - 1) // chip.lanes * chip.lanes)
    for c0 in range(0, c, tile_c):
        cs = (c0, min(c, c0 + tile_c))

        def compute(ly: LTensor, lx: LTensor, win: tiu.Window) -> None:
            pool_tile(cg, op, mode, g, ly, lx, win)

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
    a = op.attrs
    return not (a.mode == "avg" and not a.count_include_pad and any(a.pads) and quant_of(op).mode == "bf16")


@kernel("pool2d")
def pool2d(cg: Codegen, op: Op) -> None:
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    if not pool_supported(op):
        raise no_kernel(op, "average pooling that excludes the padding")
    _pool(cg, op, op.attrs.mode, pool_geometry(op, x.shape, y.shape), x, y)


@kernel("global_pool")
def global_pool(cg: Codegen, op: Op) -> None:
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    ih, iw = x.shape[2], x.shape[3]
    if ih > 4095 or iw > 4095:
        raise UserError(f"op '{op.name}': a {ih}x{iw} global pool exceeds the TIU kernel size fields")
    g = Geometry(ih, iw, 1, 1, 1, 1, (0, 0, 0, 0), ih, iw, 1, 1)
    _pool(cg, op, op.attrs.mode, g, x, y)
