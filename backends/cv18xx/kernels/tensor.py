"""Data-movement kernels: reshape copies, concat, format casts at the model's edges, nearest upsampling.

Casts build fp32 words out of bf16 halves: the TPU has no fp32 arithmetic, so int8 -> fp32 converts to bf16
on the load, multiplies by the bf16 scale and writes the bf16 into the high half of zeroed 4-byte words;
fp32 -> bf16 keeps the high halves (truncation). bf16 -> int8 (a bf16 layer feeding int8 ones) multiplies by
the bf16 of 127/threshold and lets the store's TDMA convert, rounding half to even and saturating.
"""

from __future__ import annotations

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, kernel, no_kernel, quant_of, to4d
from npuc.backends.cv18xx.kernels.elementwise import _part, tiles
from npuc.backends.cv18xx.lmem import GTensor, LTensor
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op


def _copy(cg: Codegen, op: Op, src: GTensor, dst: GTensor) -> None:
    """gmem -> lmem -> gmem copy of equally shaped views (for `op`)."""
    s = cg.stream
    local = cg.local(op)
    for b, cs, hs in tiles(cg, op, src.shape, src.fmt, 1):
        local.reset()
        lt = local.tensor((1, cs[1] - cs[0], hs[1] - hs[0], src.shape[3]), src.fmt)
        dma.load(s, _part(src, b, cs, hs), lt)
        dma.store(s, lt, _part(dst, b, cs, hs))


@kernel("reshape", "flatten", "squeeze", "unsqueeze")
def reshape(cg: Codegen, op: Op) -> None:
    src, dst = cg.plan.places[op.inputs[0]], cg.plan.places[op.outputs[0]]
    if src == dst:
        return  # the memory plan made the output an alias of the input
    x = cg.gtensor(op.inputs[0])
    _copy(cg, op, x, x.__class__.contiguous(dst.region, dst.offset, x.shape, x.fmt))


def _axis_views(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, inner, width): elements before `axis`, after it, and the row width that tiles what follows."""
    outer = int(np.prod(shape[:axis]))
    inner = int(np.prod(shape[axis + 1 :]))
    width = shape[-1] if axis < len(shape) - 1 else 1
    return outer, inner, width


def _move_slots(cg: Codegen, op: Op, moves: list[tuple[GTensor, GTensor, tuple[int, int] | None]]) -> None:
    """Copy each (src, dst) pair of equally shaped (outer, size, rows, width) views through local memory,
    requantizing by (multiplier, rshift) when one is given."""
    s = cg.stream
    for src, dst, rescale in moves:
        local = cg.local(op)
        for b, cs, hs in tiles(cg, op, src.shape, src.fmt, 1):
            local.reset()
            lt = local.tensor((1, cs[1] - cs[0], hs[1] - hs[0], src.shape[3]), src.fmt)
            dma.load(s, _part(src, b, cs, hs), lt)
            if rescale is not None:
                s.tiu(tiu.mul(lt, lt, *rescale))
            dma.store(s, lt, _part(dst, b, cs, hs))


def _slot(g: GTensor, total: int, start: int, size: int, outer: int, inner: int, width: int) -> GTensor:
    """The (outer, size, rows, width) view of positions start..start+size along the axis of a packed tensor
    whose axis has `total` positions."""
    e = 2 if g.fmt == "bf16" else 1
    view = (outer, size, inner // width, width)
    return GTensor(g.region, g.offset + start * inner * e, view, g.fmt, (total * inner * e, inner * e, width * e, e))


@kernel("concat")
def concat(cg: Codegen, op: Op) -> None:
    q = quant_of(op)
    out_shape = cg.graph.shape(op.outputs[0])
    axis = op.attrs.axis % len(out_shape)
    outer, inner, width = _axis_views(out_shape, axis)
    y = cg.gtensor(op.outputs[0])
    mults = np.asarray(q.multiplier).ravel() if q.multiplier is not None else None
    shifts = np.broadcast_to(np.asarray(q.rshift).ravel(), (len(op.inputs),)) if q.rshift is not None else None
    moves, start = [], 0
    for i, name in enumerate(op.inputs):
        size = cg.graph.shape(name)[axis]
        src = _slot(cg.gtensor(name), size, 0, size, outer, inner, width)
        rescale = mults is not None and (int(mults[i]) != 1 or int(shifts[i]) != 0)
        moves.append((src, _slot(y, out_shape[axis], start, size, outer, inner, width),
                      (int(mults[i]), int(shifts[i])) if rescale else None))  # fmt: skip
        start += size
    _move_slots(cg, op, moves)


@kernel("split")
def split(cg: Codegen, op: Op) -> None:
    """Each output is a copy of its run of positions along the axis (the codes keep the input's scale)."""
    in_shape = cg.graph.shape(op.inputs[0])
    axis = op.attrs.axis % len(in_shape)
    outer, inner, width = _axis_views(in_shape, axis)
    x = cg.gtensor(op.inputs[0])
    moves, start = [], 0
    for name, size in zip(op.outputs, op.attrs.sizes, strict=True):
        dst = _slot(cg.gtensor(name), size, 0, size, outer, inner, width)
        moves.append((_slot(x, in_shape[axis], start, size, outer, inner, width), dst, None))
        start += size
    _move_slots(cg, op, moves)


@kernel("slice")
def slice_op(cg: Codegen, op: Op) -> None:
    """A contiguous run along one axis (step 1): a split with one kept part."""
    a = op.attrs
    in_shape = cg.graph.shape(op.inputs[0])
    out_shape = cg.graph.shape(op.outputs[0])
    changed = [i for i, (d_in, d_out) in enumerate(zip(in_shape, out_shape)) if d_in != d_out]
    if len(changed) > 1 or any(step != 1 for step in a.steps):
        raise no_kernel(op, "a slice over several axes or with steps")
    if not changed:
        reshape(cg, op)
        return
    axis = changed[0]
    start = next(int(st) for st, ax in zip(a.starts, a.axes) if ax % len(in_shape) == axis)
    start = start + in_shape[axis] if start < 0 else min(start, in_shape[axis])
    outer, inner, width = _axis_views(in_shape, axis)
    size = out_shape[axis]
    src = _slot(cg.gtensor(op.inputs[0]), in_shape[axis], start, size, outer, inner, width)
    dst = _slot(cg.gtensor(op.outputs[0]), size, 0, size, outer, inner, width)
    _move_slots(cg, op, [(src, dst, None)])


def _high_halves(f32: LTensor, shape: tuple[int, int, int, int]) -> LTensor:
    """The bf16 high halves of a local tile of fp32 words (stored as bf16 pairs)."""
    n_str, c_str, h_str, _ = f32.strides
    return LTensor(f32.addr + 2, shape, "bf16", (n_str, c_str, h_str, 4))


MAX_TIU_DIM = 4095  # TIU shape fields are 12 bits


def _fold_rows(shape: tuple[int, int, int, int], widen: int) -> tuple[int, int, int, int]:
    """An elementwise view of a packed (n, c, h, w) tensor whose rows, `widen` times wider as fp32 halves, fit
    the TIU: h x w refolded as h' x w' with w' the largest divisor of h*w that is small enough."""
    n, c, h, w = shape
    if w * widen <= MAX_TIU_DIM:
        return shape
    plane = h * w
    width = next(d for d in range(MAX_TIU_DIM // widen, 0, -1) if plane % d == 0)
    return (n, c, plane // width, width)


@kernel("cast")
def cast(cg: Codegen, op: Op) -> None:
    src_fmt, dst_fmt = cg.fmt[op.inputs[0]], cg.fmt[op.outputs[0]]
    q = quant_of(op)
    shape = _fold_rows(to4d(cg.graph.shape(op.inputs[0])), 4)  # fp32 words are handled as 4 bf16-byte lanes
    x = cg.gtensor(op.inputs[0], shape)
    y = cg.gtensor(op.outputs[0], shape)
    s = cg.stream
    local = cg.local(op)
    w = shape[3]
    for b, cs, hs in tiles(cg, op, shape, "bf16", 4):
        local.reset()
        part = (1, cs[1] - cs[0], hs[1] - hs[0], w)
        if dst_fmt == "float32":
            lx = local.tensor(part, "bf16")
            dma.load(s, _part(x, b, cs, hs), lx)  # int8 -> bf16 converts exactly on the way in
            f32 = local.tensor((*part[:3], 2 * w), "bf16")
            s.tiu(tiu.xor_zero(LTensor(f32.addr, (*part[:3], 4 * w), "i8", f32.strides[:3] + (1,))))
            if src_fmt == "int8":
                scale = int(bf16_bits(np.float32(q.inputs[0].scale)))
                s.tiu(tiu.mul(_high_halves(f32, part), lx, scale))
            else:
                s.tiu(tiu.copy(_high_halves(f32, part), lx))
            dma.store(s, f32, _part(y, b, cs, hs))
        elif src_fmt == "float32" and dst_fmt == "bf16":
            f32 = local.tensor((*part[:3], 2 * w), "bf16")
            dma.load(s, _part(x, b, cs, hs), f32)
            ly = local.tensor(part, "bf16")
            s.tiu(tiu.copy(ly, _high_halves(f32, part)))
            dma.store(s, ly, _part(y, b, cs, hs))
        elif src_fmt == "int8" and dst_fmt == "bf16":
            lx = local.tensor(part, "bf16")
            dma.load(s, _part(x, b, cs, hs), lx)
            s.tiu(tiu.mul(lx, lx, int(bf16_bits(np.float32(q.inputs[0].scale)))))
            dma.store(s, lx, _part(y, b, cs, hs))
        elif src_fmt == "bf16" and dst_fmt == "int8":
            lx = local.tensor(part, "bf16")
            dma.load(s, _part(x, b, cs, hs), lx)
            s.tiu(tiu.mul(lx, lx, int(bf16_bits(np.float32(127.0) / np.float32(q.output.threshold)))))
            dma.store(s, lx, _part(y, b, cs, hs))  # the TDMA rounds to nearest even and saturates
        else:
            raise UserError(
                f"op '{op.name}': a {src_fmt} -> {dst_fmt} cast inside the TPU routine has no cv18xx kernel; "
                "keep the neighbouring layers in one format (--float-layers) or use --quant bf16"
            )


@kernel("resize")
def resize(cg: Codegen, op: Op) -> None:
    a = op.attrs
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    n, c, ih, iw = x.shape
    oh, ow = y.shape[2], y.shape[3]
    if a.mode != "nearest" or oh % ih or ow % iw:
        raise UserError(f"op '{op.name}': only nearest resizing by integer factors has a cv18xx kernel")
    sh, sw = oh // ih, ow // iw
    e = 2 if x.fmt == "bf16" else 1
    s = cg.stream
    local = cg.local(op)
    for b, cs, hs in tiles(cg, op, x.shape, x.fmt, 1 + sh * sw):
        local.reset()
        rows = hs[1] - hs[0]
        lx = local.tensor((1, cs[1] - cs[0], rows, iw), x.fmt)
        ly = local.tensor((1, cs[1] - cs[0], rows * sh, ow), x.fmt)
        dma.load(s, _part(x, b, cs, hs), lx)
        for i in range(sh):
            for j in range(sw):
                dst = LTensor(ly.addr + (i * ow + j) * e, lx.shape, x.fmt, (ly.strides[0], ly.strides[1], sh * ow * e,
                              sw * e))  # fmt: skip
                s.tiu(tiu.copy(dst, lx))
        dma.store(s, ly, y.slice(n=(b, b + 1), c=cs, h=(hs[0] * sh, hs[1] * sh)))


@kernel("transpose")
def transpose(cg: Codegen, op: Op) -> None:
    """A permutation as strided gmem -> gmem moves of single elements: the output's last three axes become
    the move's n, c and h (w = 1), read through the input's strides; one move per index of the first axis."""
    perm = op.attrs.perm
    in_shape = tuple(cg.graph.shape(op.inputs[0]))
    if len(perm) > 4:
        raise no_kernel(op, f"a {len(perm)}-D transpose")
    pad = 4 - len(perm)
    perm4 = tuple(range(pad)) + tuple(p + pad for p in perm)
    shape4 = (1,) * pad + in_shape
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    e = 2 if x.fmt == "bf16" else 1
    in_strides = [int(np.prod(shape4[i + 1 :])) * e for i in range(4)]
    out_shape = tuple(shape4[p] for p in perm4)
    out_strides = [int(np.prod(out_shape[i + 1 :])) * e for i in range(4)]
    if max(out_shape[1:]) > 0xFFFF:
        raise UserError(f"op '{op.name}': transposed dims {out_shape} exceed the TDMA shape fields")
    for i in range(out_shape[0]):
        src = GTensor(x.region, x.offset + i * in_strides[perm4[0]], (*out_shape[1:], 1), x.fmt,
                      (*(in_strides[p] for p in perm4[1:]), e))  # fmt: skip
        dst = GTensor(y.region, y.offset + i * out_strides[0], (*out_shape[1:], 1), y.fmt, (*out_strides[1:], e))
        dma.copy_global(cg.stream, src, dst)
