"""bf16 layer normalization on the TIU: rows on lanes, the normalized values of a row along H x W of its lane.

Per tile of R rows, (1, R, h, w) with h * w the normalized size (as tpu-mlir's kernel lays it out):

    mean = avgpool_{h x w}(x)            x -= mean (broadcast: h/w strides 0)
    s = x * x                            var = avgpool_{h x w}(s) + eps
    rstd = exp_table[index(var)] * mantissa_table[var]              x *= rstd (broadcast)
    y = beta; y += x * gamma             (gamma and beta loaded into every row with a channel stride of 0)

1/sqrt(var) comes from two 256-entry bf16 lookups, one by var's exponent and one by its mantissa
(kernels/scientific.py).
"""

from __future__ import annotations

import math

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, does_not_fit, kernel, no_kernel, op_where, quant_of
from npuc.backends.cv18xx.kernels.scientific import emit_lookup, load_tables
from npuc.backends.cv18xx.lmem import GTensor, LTensor, local_bytes
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.ir import Op

MAX_DIM = 4095  # the 12-bit shape and kernel fields
SMALLEST_VAR = 2.0**-62  # the exponent-index move knows exponents 2^-63 .. 2^63 only


def _plane(size: int) -> tuple[int, int]:
    """(h, w) with h * w = size, both within the shape fields (a row of w first)."""
    if size <= MAX_DIM:
        return 1, size
    for h in range(math.isqrt(size), 1, -1):
        if size % h == 0 and size // h <= MAX_DIM:
            return h, size // h
    return 0, 0


def _spread(t: LTensor, shape: tuple[int, int, int, int]) -> LTensor:
    """A (1, R, 1, 1) per-row value read as (1, R, h, w): h and w strides 0."""
    return LTensor(t.addr, shape, t.fmt, (t.strides[0], t.strides[1], 0, 0))


def _bits(value: float) -> int:
    return int(bf16_bits(np.float32(value)))


@kernel("layer_norm")
def layer_norm(cg: Codegen, op: Op) -> None:
    if quant_of(op).mode != "bf16":
        raise no_kernel(op, "an int8 layer_norm")
    shape = cg.graph.shape(op.inputs[0])
    axis = op.attrs.axis % len(shape)
    outer, size = math.prod(shape[:axis]), math.prod(shape[axis:])
    h, w = _plane(size)
    if not h:
        raise no_kernel(op, f"a layer_norm over {size} values (no h x w split within {MAX_DIM})")
    x = cg.gtensor(op.inputs[0]).reshaped((1, outer, h, w))
    y = cg.gtensor(op.outputs[0]).reshaped((1, outer, h, w))
    if x.fmt != "bf16" or y.fmt != "bf16":
        raise no_kernel(op, "a layer_norm on int8 tensors")
    gamma = np.asarray(cg.const(op.inputs[1]), np.float32).reshape(-1)
    beta = np.asarray(cg.const(op.inputs[2]), np.float32).reshape(-1) if len(op.inputs) > 2 else np.zeros(1)
    affine = bool(np.any(gamma != 1) or np.any(beta != 0))
    s, local, chip = cg.stream, cg.local(op), cg.chip
    tables = load_tables(cg, local, op.name, "rsqrt")
    params = []
    if affine:
        for part, values in (("gamma", gamma), ("beta", beta)):
            row = bf16_bits(np.broadcast_to(values, (size,))).reshape(1, 1, h, w)
            params.append(cg.weights.add(f"{op.name}_{part}", row, "bf16"))
    top = local.top
    full_tiles = 3 if affine else 2
    rows = _rows_per_tile(cg, outer, h, w, full_tiles, chip.lmem_size - top)
    if rows < 1:
        raise does_not_fit(op_where(op), f"a row of {size} bf16 values", chip)
    inv_size, eps = _bits(1.0 / size), _bits(op.attrs.epsilon)
    for r0 in range(0, outer, rows):
        local.reset(top)
        r = min(rows, outer - r0)
        tile = (1, r, h, w)
        tx, ts = local.tensor(tile, "bf16"), local.tensor(tile, "bf16")
        mean, var, index, factor = (local.tensor((1, r, 1, 1), "bf16") for _ in range(4))
        dma.load(s, x.slice(c=(r0, r0 + r)), tx)
        s.tiu(tiu.avg_pool(mean, tx, tiu.Window(h, w), inv_size, 0, False))
        s.tiu(tiu.sub(tx, tx, _spread(mean, tile)))
        s.tiu(tiu.mul(ts, tx, tx))
        s.tiu(tiu.avg_pool(var, ts, tiu.Window(h, w), inv_size, 0, False))
        s.tiu(tiu.add(var, var, eps))
        s.tiu(tiu.maximum(var, var, _bits(SMALLEST_VAR)))
        emit_lookup(cg, index, var, factor, tables)  # 1 / sqrt(var)
        s.tiu(tiu.mul(tx, tx, _spread(index, tile)))
        out = tx
        if affine:
            ty = local.tensor(tile, "bf16")
            g_gamma, g_beta = (GTensor(g.region, g.offset, tile, "bf16", (0, 0, w * 2, 2)) for g in params)
            dma.load(s, g_beta, ty)
            dma.load(s, g_gamma, ts)
            s.tiu(tiu.mac(ty, tx, ts, 16, 0, False, True))
            out = ty
        dma.store(s, out, y.slice(c=(r0, r0 + r)))


def _rows_per_tile(cg: Codegen, outer: int, h: int, w: int, full_tiles: int, free: int) -> int:
    """The most rows (a multiple of the lane count, or all of them) whose tiles fit in `free` bytes per lane."""
    chip = cg.chip

    def need(r: int) -> int:
        return full_tiles * local_bytes(chip, (1, r, h, w), "bf16") + 4 * local_bytes(chip, (1, r, 1, 1), "bf16")

    rows = min(outer, MAX_DIM)
    if need(rows) <= free:
        return rows
    rows = rows // chip.lanes * chip.lanes
    while rows > 0 and need(rows) > free:
        rows -= chip.lanes
    return rows
