"""int8 PReLU: max(x, 0) and min(x, 0) each rescaled per channel by a 1x1 depthwise conv (int8 weight plus the
QDM multiplier and shift the quantize pass chose), then added with the MUL/MAC chain. bf16: the same halves
with bf16 weights (the slope and 1.0) and a bf16 add."""

from __future__ import annotations

import numpy as np
from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, kernel, quant_of, to4d
from npuc.backends.cv18xx.kernels.elementwise import _part, tiles
from npuc.backends.cv18xx.weights import channel_records
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op


@kernel("prelu")
def prelu(cg: Codegen, op: Op) -> None:
    q = quant_of(op)
    if q.mode != "int8":
        raise UserError(f"op '{op.name}': {q.mode} PReLU has no cv18xx kernel yet; calibrate it for int8")
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
