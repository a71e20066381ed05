"""int8 PReLU: max(x, 0) and min(x, 0) each rescaled per channel by a 1x1 depthwise conv (int8 weight plus the
QDM multiplier and shift the quantize pass chose), then added with the MUL/MAC chain.

bf16 PReLU: `neg = min(x, 0)`, `x = max(x, 0)`, then one MAC `x += neg * slope` with the per-channel bf16
slopes read with zero h/w strides, rounded once (compiler/kernels/quantized/bf16_act.py computes the same).
"""

from __future__ import annotations

import numpy as np
from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, kernel, no_kernel, quant_of, to4d
from npuc.backends.cv18xx.kernels.elementwise import _part, tiles
from npuc.backends.cv18xx.lmem import LTensor
from npuc.backends.cv18xx.weights import bf16_bits, channel_records
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op


@kernel("prelu")
def prelu(cg: Codegen, op: Op) -> None:
    q = quant_of(op)
    if q.mode == "bf16":
        _bf16_prelu(cg, op)
        return
    if q.mode != "int8":
        raise UserError(f"op '{op.name}': {q.mode} PReLU has no cv18xx kernel; quantize it to int8 or bf16")
    shape = to4d(cg.graph.shape(op.inputs[0]))
    c = shape[1]
    x, y = cg.gtensor(op.inputs[0], shape), cg.gtensor(op.outputs[0], shape)
    weights = np.asarray(cg.const(op.inputs[1]), np.int8).reshape(2, c)
    halves = []
    for i, name in enumerate(("pos", "neg")):
        w = cg.weights.add(f"{op.name}_{name}_weight", weights[i].reshape(1, c, 1, 1))
        rec = channel_records(None, np.asarray(q.multiplier)[i], np.asarray(q.rshift)[i])
        halves.append((w, cg.weights.add(f"{op.name}_{name}_quant", rec)))
    s = cg.stream
    local = cg.local(op)
    one = tiu.Window(1, 1)
    for b, cs, hs in tiles(cg, op, shape, "i8", 7):
        local.reset()
        t = cs[1] - cs[0]
        part = (1, t, hs[1] - hs[0], shape[3])
        lx = local.tensor(part, "i8")
        dma.load(s, _part(x, b, cs, hs), lx)
        results = []
        for (w, rec), clamp in zip(halves, (tiu.maximum, tiu.minimum)):
            lw = local.tensor((1, t, 1, 1), "i8")
            lp = local.tensor((1, t, 1, 5), "i8", eu_align=False)
            dma.load(s, w.slice(c=cs), lw)
            dma.load(s, rec.slice(c=cs), lp)
            half = local.tensor(part, "i8")
            s.tiu(clamp(half, lx, 0))
            s.tiu(tiu.depthwise(half, half, lw, lp, one, False, False))
            results.append(half)
        out = local.tensor(part, "i8")
        high = local.tensor(part, "i8")
        s.tiu(tiu.mul(out, results[0], 1, out16_plane=high.addr - out.addr))
        s.tiu(tiu.mac(out, results[1], 1, high.addr - out.addr, 0, False, True))
        dma.store(s, out, _part(y, b, cs, hs))


def channel_slopes(cg: Codegen, op: Op) -> np.ndarray:
    """The slope per channel of a PReLU whose slope broadcasts along the channel axis only (or is one value)."""
    shape = tuple(cg.graph.shape(op.inputs[0]))
    slope = np.asarray(cg.const(op.inputs[1]), np.float32)
    try:
        full = np.broadcast_to(slope, shape).reshape(to4d(shape))
    except ValueError:
        full = None
    if full is None or not np.array_equal(full, np.broadcast_to(full[:1, :, :1, :1], full.shape)):
        raise no_kernel(op, f"a PReLU slope of shape {slope.shape} (not one per channel)")
    return np.ascontiguousarray(full[0, :, 0, 0])


def _bf16_prelu(cg: Codegen, op: Op) -> None:
    shape = to4d(cg.graph.shape(op.inputs[0]))
    c = shape[1]
    x, y = cg.gtensor(op.inputs[0], shape), cg.gtensor(op.outputs[0], shape)
    slopes = cg.weights.add(f"{op.name}_slope", bf16_bits(channel_slopes(cg, op)).reshape(1, c, 1, 1), "bf16")
    s = cg.stream
    local = cg.local(op)
    for b, cs, hs in tiles(cg, op, shape, "bf16", 3):
        local.reset()
        part = (1, cs[1] - cs[0], hs[1] - hs[0], shape[3])
        lx, neg = local.tensor(part, "bf16"), local.tensor(part, "bf16")
        ls = local.tensor((1, part[1], 1, 1), "bf16")
        dma.load(s, _part(x, b, cs, hs), lx)
        dma.load(s, slopes.slice(c=cs), ls)
        slope = LTensor(ls.addr, part, "bf16", (*ls.strides[:2], 0, 0))  # one value per channel
        s.tiu(tiu.minimum(neg, lx, 0))
        s.tiu(tiu.maximum(lx, lx, 0))
        s.tiu(tiu.mac(lx, neg, slope, 16, 0, False, True))
        dma.store(s, lx, _part(y, b, cs, hs))
