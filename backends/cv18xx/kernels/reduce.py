"""bf16 reductions (sum, mean, max) over a run of adjacent axes, as one TIU pool window per kept value.

The input is viewed as (outer, reduced, inner): the TDMA loads it with the kept values on channels (lanes) and
the reduced ones along H of each channel — strides do the transposition, nothing is copied first — then an
average pool with multiplier 1 (sum) or bf16(1/count) (mean), or a max pool, of window (count, 1) leaves one
value per channel. (Spatial means over H and W of NCHW never get here: they are global pools.)
"""

from __future__ import annotations

import math

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, does_not_fit, kernel, no_kernel, op_where, quant_of
from npuc.backends.cv18xx.kernels.pool import BF16_LOWEST
from npuc.backends.cv18xx.lmem import GTensor, local_bytes
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.ir import Op

MAX_DIM = 4095  # the 12-bit shape and window fields
ESIZE = 2


def _view(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, int, int]:
    """(outer, reduced, inner) element counts of a reduction over adjacent `axes`."""
    first, last = axes[0], axes[-1]
    return math.prod(shape[:first]), math.prod(shape[first : last + 1]), math.prod(shape[last + 1 :])


@kernel("reduce")
def reduce(cg: Codegen, op: Op) -> None:
    kind = op.attrs.kind
    if quant_of(op).mode != "bf16":
        raise no_kernel(op, f"an int8 reduce {kind}")
    if kind not in ("sum", "mean", "max"):
        raise no_kernel(op, f"reduce {kind}")
    shape = cg.graph.shape(op.inputs[0])
    axes = tuple(sorted(a % len(shape) for a in op.attrs.axes))
    if axes != tuple(range(axes[0], axes[-1] + 1)):
        raise no_kernel(op, f"a reduce over axes {list(axes)} that are not adjacent")
    outer, count, inner = _view(shape, axes)
    if count > MAX_DIM:
        raise no_kernel(op, f"a reduce of {count} values per result (at most {MAX_DIM})")
    x, y = (cg.plan.places[n] for n in (op.inputs[0], op.outputs[0]))
    # kept values on channels: the inner ones (outer as a loop), or the outer ones when nothing is inner
    if inner == 1:
        loops, channels, c_stride, h_stride = 1, outer, count * ESIZE, ESIZE
    else:
        loops, channels, c_stride, h_stride = outer, inner, ESIZE, inner * ESIZE
    chip, s, local = cg.chip, cg.stream, cg.local(op)
    tile_c = min(channels, MAX_DIM)
    per_tile = lambda c: local_bytes(chip, (1, c, count, 1), "bf16") + local_bytes(chip, (1, c, 1, 1), "bf16")  # noqa: E731
    while tile_c > chip.lanes and per_tile(tile_c) > chip.lmem_size:
        tile_c = max(chip.lanes, (tile_c // 2 + chip.lanes - 1) // chip.lanes * chip.lanes)
    if per_tile(tile_c) > chip.lmem_size:
        raise does_not_fit(op_where(op), f"a column of {count} bf16 values", chip)
    window = tiu.Window(count, 1)
    mult = int(bf16_bits(np.float32(1.0 if kind == "sum" else 1.0 / count)))
    for loop in range(loops):
        for c0 in range(0, channels, tile_c):
            nc = min(channels, c0 + tile_c) - c0
            local.reset()
            tx = local.tensor((1, nc, count, 1), "bf16")
            ty = local.tensor((1, nc, 1, 1), "bf16")
            base = loop * count * inner + c0 * c_stride // ESIZE
            dma.load(s, GTensor(x.region, x.offset + base * ESIZE, (1, nc, count, 1), "bf16",
                                (0, c_stride, h_stride, ESIZE)), tx)  # fmt: skip
            if kind == "max":
                s.tiu(tiu.max_pool(ty, tx, window, BF16_LOWEST))
            else:
                s.tiu(tiu.avg_pool(ty, tx, window, mult, 0, False))
            out = (loop * inner if inner > 1 else 0) + c0
            dma.store(s, ty, GTensor(y.region, y.offset + out * ESIZE, (1, nc, 1, 1), "bf16", (0, ESIZE, ESIZE, ESIZE)))
