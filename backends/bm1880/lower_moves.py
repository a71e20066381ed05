"""BM1880 lowerings of data moves and table lookups: slice/split, nearest upsample, LUT activations, products.

- slice / split / transpose: a `copy` layer per output, GDMA gmem-to-gmem copies with the source strides
  scaled by the steps and permuted (GDMA has n/c/h strides only, so a step along W is refused; a transpose that
  moves W copies single bytes). The bytes move unchanged, so the output
  takes the input's threshold.
- nearest resize by integer factors: an `upsample` layer (TIU copies into a strided output tile); the output
  takes the input's threshold.
- any other elementwise activation (hard-swish, hard-sigmoid, sigmoid, tanh, clip, ...): a `lut` layer, the
  256 output codes of the input codes `sat8(floor(f(q·Tx/128)·128/Ty + 0.5))` (the table `bmk1880_tpu_lut`
  reads, specs/bm1880.md §2.7).
- multiply of two tensors, the second the same shape or one value per channel (SE blocks, SiLU's x·sigmoid):
  a `mul` layer, `sat8((x·s·m + 2^(r−1)) >> r)` with m/2^r ≈ Tx·Ts/(128·Ty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from npuc.compiler import ops
from npuc.compiler.ir import Op
from npuc.compiler.kernels import FLOAT_KERNELS, apply_activation
from npuc.compiler.numformats.bm1880_int8 import (
    bm1880_dequantize_activation,
    bm1880_quantize_activation,
    bm1880_quantize_layer,
    bm1880_requant_multiplier,
)

from .layers import Layer, LowerContext, unsupported

AXES_4D = {4: (0, 1, 2, 3), 3: (0, 1, 3), 2: (0, 1), 1: (1,)}  # IR axis -> NCHW-view axis (as_4d)
GDMA_H_STRIDE_BITS = 16  # specs/bm1880.md §2.6


def _axis4(ctx: LowerContext, op: Op, name: str, axis: int) -> int:
    rank = len(ctx.graph.shape(name))
    return AXES_4D[rank][axis % rank]


def _same_scale(ctx: LowerContext, src: str, out: str) -> None:
    """A move keeps the bytes, hence the scale: the output is read with the input's threshold."""
    ctx.net.thresholds[out] = ctx.t(src)


def _add_copy(ctx: LowerContext, op: Op, out: str, offsets: list[int], steps: list[int], perm=(0, 1, 2, 3)) -> None:
    src = op.inputs[0]
    if steps[3] != 1:
        raise unsupported(op, f"with step {steps[3]} along the last axis (GDMA has no element stride)")
    _, c, h, w = ctx.net.shapes[src]
    h_walk = (c * h * w, h * w, w, 1)[perm[2]] * steps[perm[2]]
    if h_walk >= 1 << GDMA_H_STRIDE_BITS:
        raise unsupported(op, f"reading rows {h_walk} bytes apart (a GDMA h stride has {GDMA_H_STRIDE_BITS} bits)")
    _same_scale(ctx, src, out)
    ctx.add(Layer(f"{op.name}#{out}" if len(op.outputs) > 1 else op.name, "copy", (src,), out,
                  offsets=tuple(offsets), steps=tuple(steps), perm=tuple(perm)))  # fmt: skip


def lower_transpose(ctx: LowerContext, op: Op) -> None:
    """Any permutation of the NCHW view: S2S copies with permuted strides (moves.copy; whole rows when the last
    axis stays, single bytes when it moves)."""
    src = op.inputs[0]
    rank = len(ctx.graph.shape(src))
    axes = AXES_4D.get(rank, ())
    if not axes:
        raise unsupported(op, f"on a rank-{rank} input (BM1880 tensors are 4-D views)")
    perm4 = [0, 1, 2, 3]
    for k, p in enumerate(op.attrs.perm):
        perm4[axes[k]] = axes[p]
    _add_copy(ctx, op, op.outputs[0], [0, 0, 0, 0], [1, 1, 1, 1], perm4)


def lower_slice(ctx: LowerContext, op: Op) -> None:
    a: ops.Slice = op.attrs
    src = op.inputs[0]
    dims = ctx.graph.shape(src)
    offsets, steps = [0, 0, 0, 0], [1, 1, 1, 1]
    for start, end, axis, step in zip(a.starts, a.ends, a.axes, a.steps, strict=True):
        if step < 1:
            raise unsupported(op, f"with step {step} (only forward steps are GDMA copies)")
        first, _, _ = slice(int(start), int(end), int(step)).indices(dims[axis % len(dims)])
        k = _axis4(ctx, op, src, axis)
        offsets[k], steps[k] = first, int(step)
    _add_copy(ctx, op, op.outputs[0], offsets, steps)


def lower_split(ctx: LowerContext, op: Op) -> None:
    a: ops.Split = op.attrs
    k = _axis4(ctx, op, op.inputs[0], a.axis)
    start = 0
    for out, size in zip(op.outputs, a.sizes, strict=True):
        offsets = [0, 0, 0, 0]
        offsets[k] = start
        _add_copy(ctx, op, out, offsets, [1, 1, 1, 1])
        start += size


def lower_resize(ctx: LowerContext, op: Op) -> None:
    """Nearest resize by integer H/W factors whose ONNX index map is a plain repeat (checked on an iota)."""
    a: ops.Resize = op.attrs
    src, out = op.inputs[0], op.outputs[0]
    n, c, h, w = ctx.net.shapes[src]
    on, oc, oh, ow = ctx.net.shapes[out]
    if a.mode != "nearest" or len(ctx.graph.shape(src)) != 4 or (on, oc) != (n, c) or oh % h or ow % w:
        raise unsupported(op, f"mode {a.mode} from {(n, c, h, w)} to {(on, oc, oh, ow)} (need nearest x integer)")
    sh, sw = oh // h, ow // w
    iota = np.arange(h * w, dtype=np.float32).reshape(1, 1, h, w)
    probe = Op(op.name, "resize", [src], [out], dataclasses.replace(a, out_shape=(1, 1, oh, ow), scales=()))
    (got,) = FLOAT_KERNELS["resize"](probe, [iota])
    if not np.array_equal(got, iota.repeat(sh, axis=2).repeat(sw, axis=3)):
        raise unsupported(op, f"nearest with coordinate mode {a.coord_mode}/{a.nearest_mode} (not a plain repeat)")
    _same_scale(ctx, src, out)
    ctx.add(Layer(op.name, "upsample", (src,), out, steps=(1, 1, sh, sw)))


def lookup_table(fn: Callable[[np.ndarray], np.ndarray], tx: float, ty: float) -> np.ndarray:
    """int8 output code for each input byte 0..255 (the byte of code q is q & 0xFF)."""
    codes = np.arange(256, dtype=np.uint8).view(np.int8)
    with np.errstate(all="ignore"):
        y = fn(bm1880_dequantize_activation(codes, tx))
    if not np.all(np.isfinite(y)):
        raise ValueError(f"not finite on [-{tx}, {tx}]")
    return bm1880_quantize_activation(y, ty)


def _add_lut(ctx: LowerContext, op: Op, mode: str, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    src, out = op.inputs[0], op.outputs[0]
    try:
        table = lookup_table(fn, ctx.t(src), ctx.t(out))
    except ValueError as exc:
        raise unsupported(op, f"as a lookup table ({exc})") from None
    ctx.add(Layer(op.name, "lut", (src,), out, mode, weight=table))


def lower_lut(ctx: LowerContext, op: Op) -> None:
    act = op.attrs.act
    _add_lut(ctx, op, act.kind, lambda x: apply_activation(x, act))


def _lower_mul_const(ctx: LowerContext, op: Op, src: str, k: np.ndarray) -> None:
    """x·k: one constant is a lookup; one per channel a 1x1 depthwise conv (weight k, no bias)."""
    c = ctx.net.shapes[src][1]
    if k.size == 1:
        op = Op(op.name, op.kind, [src], op.outputs, op.attrs)
        _add_lut(ctx, op, "scale", lambda x: x * np.float32(k.reshape(())))
        return
    rank = len(ctx.graph.shape(src))
    kshape = (1,) * (rank - k.ndim) + k.shape  # numpy broadcasting aligns the constant on the right
    if rank < 2 or len(kshape) != rank or kshape[1] != c or int(np.prod(kshape)) != c:
        raise unsupported(op, f"mul by a constant of shape {list(k.shape)} (need one value or one per channel)")
    q = bm1880_quantize_layer(k.reshape(c, 1, 1, 1), None, ctx.t(src), ctx.t(op.outputs[0]))
    ctx.add(Layer(op.name, "dwconv", (src,), op.outputs[0], "", weight=q.weight.reshape(c, 1, 1), rshift=q.rshift))


def lower_mul(ctx: LowerContext, op: Op) -> None:
    """x·s, s of x's shape or (N, C, 1, 1): a 16-bit product, then one multiplier and shift into int8."""
    a: ops.Eltwise = op.attrs
    out = op.outputs[0]
    if a.act is not None or len(op.inputs) != 2:
        raise unsupported(op, "mul with a fused activation or more than two inputs")
    consts = [ctx.graph.const(i) for i in op.inputs]
    if all(k is not None for k in consts):
        raise unsupported(op, "mul of two constants (fold it first)")
    for i, k in enumerate(consts):
        if k is not None:
            _lower_mul_const(ctx, op, op.inputs[1 - i], np.asarray(k, np.float32))
            return
    x, s = op.inputs
    if ctx.graph.shape(x) != ctx.graph.shape(out):
        x, s = s, x
    n, c, h, w = ctx.net.shapes[out]
    if ctx.graph.shape(x) != ctx.graph.shape(out) or ctx.net.shapes[s] not in ((n, c, h, w), (n, c, 1, 1)):
        raise unsupported(op, f"mul of {ctx.graph.shape(x)} by {ctx.graph.shape(s)} (need equal or per-channel)")
    m, r = bm1880_requant_multiplier(ctx.t(x) * ctx.t(s) / 128.0, ctx.t(out))
    ctx.add(Layer(op.name, "mul", (x, s), out, "mul", rshift=r, multipliers=(m,)))
