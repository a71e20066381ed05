"""int8 PReLU: max(x, 0) and min(x, 0) each rescaled per channel by a 1x1 depthwise conv (int8 weight plus the
QDM multiplier and shift the quantize pass chose), then added with the MUL/MAC chain.

bf16 PReLU: `neg = min(x, 0)`, `y = max(x, 0)`, then one MAC `y += neg * slope` with the per-channel bf16
slopes read with zero h/w strides, rounded once (compiler/kernels/quantized/bf16_act.py computes the same).

`constants` + `compute_prelu` are one tile's work; the stand-alone kernel and layer groups both use them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, kernel, no_kernel, quant_of, to4d
from npuc.backends.cv18xx.kernels.elementwise import _part, tiles
from npuc.backends.cv18xx.lmem import LTensor, Resident
from npuc.backends.cv18xx.weights import bf16_bits, channel_records
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op


def constants(cg: Codegen, op: Op) -> list[Resident]:
    """int8: positive-side weight and records, negative-side weight and records; bf16: the slopes."""
    q = quant_of(op)
    c = to4d(cg.graph.shape(op.inputs[0]))[1]
    if q.mode == "bf16":
        slopes = bf16_bits(channel_slopes(cg, op)).reshape(1, c, 1, 1)
        return [Resident((1, c, 1, 1), "bf16", True, lambda: cg.weights.add(f"{op.name}_slope", slopes, "bf16"))]
    if q.mode != "int8":
        raise UserError(f"op '{op.name}': {q.mode} PReLU has no cv18xx kernel; quantize it to int8 or bf16")
    weights = np.asarray(cg.const(op.inputs[1]), np.int8).reshape(2, c)
    made = []
    for i, name in enumerate(("pos", "neg")):
        rec = channel_records(None, np.asarray(q.multiplier)[i], np.asarray(q.rshift)[i])
        w = weights[i].reshape(1, c, 1, 1)
        made.append(Resident((1, c, 1, 1), "i8", True, lambda w=w, n=name: cg.weights.add(f"{op.name}_{n}_weight", w)))
        records = Resident((1, c, 1, 5), "i8", False, lambda r=rec, n=name: cg.weights.add(f"{op.name}_{n}_quant", r))
        made.append(records)
    return made


def compute_prelu(cg: Codegen, op: Op, out: LTensor, x: LTensor, consts: list[LTensor],
                  new_tile: Callable[[], LTensor]) -> None:  # fmt: skip
    """One tile: `out` may be `x`; int8 takes two temporaries from `new_tile()`, bf16 one."""
    s = cg.stream
    neg = new_tile()
    s.tiu(tiu.minimum(neg, x, 0))
    s.tiu(tiu.maximum(out, x, 0))
    if out.fmt == "bf16":
        slope = LTensor(consts[0].addr, out.shape, "bf16", (*consts[0].strides[:2], 0, 0))  # one per channel
        s.tiu(tiu.mac(out, neg, slope, 16, 0, False, True))
        return
    one = tiu.Window(1, 1)
    high = new_tile()
    s.tiu(tiu.depthwise(out, out, consts[0], consts[1], one, False, False))
    s.tiu(tiu.depthwise(neg, neg, consts[2], consts[3], one, False, False))
    s.tiu(tiu.mul(out, out, 1, out16_plane=high.addr - out.addr))
    s.tiu(tiu.mac(out, neg, 1, high.addr - out.addr, 0, False, True))


@kernel("prelu")
def prelu(cg: Codegen, op: Op) -> None:
    shape = to4d(cg.graph.shape(op.inputs[0]))
    fmt = "bf16" if quant_of(op).mode == "bf16" else "i8"
    consts = [(k, k.source()) for k in constants(cg, op)]
    x, y = cg.gtensor(op.inputs[0], shape), cg.gtensor(op.outputs[0], shape)
    s = cg.stream
    local = cg.local(op)
    temps = 2 if fmt == "bf16" else 3
    for b, cs, hs in tiles(cg, op, shape, fmt, temps + 1):
        local.reset()
        t = cs[1] - cs[0]
        part = (1, t, hs[1] - hs[0], shape[3])
        lx = local.tensor(part, fmt)
        dma.load(s, _part(x, b, cs, hs), lx)
        mine = []
        for k, g in consts:
            lc = local.tensor((1, t, *k.shape[2:]), k.fmt, eu_align=k.eu_align)
            dma.load(s, g.slice(c=cs), lc)
            mine.append(lc)
        compute_prelu(cg, op, lx, lx, mine, lambda part=part: local.tensor(part, fmt))
        dma.store(s, lx, _part(y, b, cs, hs))


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
