"""Element-wise kernels: eltwise add/sub/mul/max/min and ReLU-family activations, int8 and bf16.

int8 add/sub is cvikernel's MUL-then-MAC chain: the first input times its int8 multiplier into a 16-bit
accumulator (two byte planes), every further input multiplied and accumulated, the last MAC shifting right
with rounding and saturating to int8 (specs/cv18xx.md §3.4). max/min rescale each input first; mul uses
the 32-bit QDM multiplier. Tensors are tiled along N, C (in lane multiples) and H.

bf16 LeakyReLU, hard-sigmoid and hard-swish are TIU arithmetic with bf16 constants, step for step what
compiler/kernels/quantized/bf16_act.py computes: leaky `max(x, 0) + min(x, 0) * alpha` (one MAC);
hard-sigmoid `y = beta` (a max and a min against it), `y += x * alpha`, clamped to [0, 1]; hard-swish
`x * hard_sigmoid(x)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, does_not_fit, fused_relu, kernel, no_kernel, op_where, quant_of, to4d
from npuc.backends.cv18xx.kernels.tiling import largest_fit
from npuc.backends.cv18xx.lmem import GTensor, LocalAllocator, LTensor, local_bytes
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op
from npuc.compiler.kernels.quantized.bf16_act import HARD_SWISH_ALPHA, HARD_SWISH_BETA

BF16_ONE, BF16_MINUS_ONE = 0x3F80, 0xBF80
MAX_TIU_DIM = 4095  # TIU shape fields are 12 bits: a tile has at most this many channels and rows


def tiles(cg: Codegen, op: Op, shape: tuple[int, int, int, int], fmt: str, count: int) -> Iterator[tuple]:
    """(n, (c0, c1), (h0, h1)) tiles of `shape` such that `count` local tiles of it fit at once."""
    chip = cg.chip
    n, c, h, w = shape
    tile_c = min(c, MAX_TIU_DIM // chip.lanes * chip.lanes)  # the 12-bit channel field
    while tile_c > chip.lanes and count * local_bytes(chip, (1, tile_c, 1, w), fmt) > chip.lmem_size:
        tile_c = max(chip.lanes, (tile_c // 2 + chip.lanes - 1) // chip.lanes * chip.lanes)
    rows = largest_fit(
        min(h, MAX_TIU_DIM), lambda r: count * local_bytes(chip, (1, tile_c, r, w), fmt) <= chip.lmem_size
    )
    if rows == 0:
        raise does_not_fit(op_where(op), f"one row of its {'x'.join(map(str, shape))} {fmt} tensor", chip)
    for b in range(n):
        for c0 in range(0, c, tile_c):
            for h0 in range(0, h, rows):
                yield b, (c0, min(c, c0 + tile_c)), (h0, min(h, h0 + rows))


def _part(g: GTensor, b: int, cs: tuple[int, int], hs: tuple[int, int]) -> GTensor:
    return g.slice(n=(b, b + 1), c=cs, h=hs)


def clamp(cg: Codegen, op: Op, t: LTensor) -> None:
    """The fused activation an op could not apply itself: ReLU6 bound (int8) or clip/relu (bf16)."""
    relu, relu_max = fused_relu(op)
    if relu_max is not None:
        cg.stream.tiu(tiu.minimum(t, t, relu_max))
    act = getattr(op.attrs, "act", None)
    if t.fmt == "bf16" and act is not None and act.kind == "clip" and np.isfinite(act.hi):
        cg.stream.tiu(tiu.minimum(t, t, int(bf16_bits(np.float32(act.hi)))))


@dataclass(frozen=True)
class Operand:
    """An eltwise input broadcast to the output's 4-D shape: gmem view (zero strides on broadcast N/C) and
    whether its H and W repeat (the TIU then reads it with zero h/w strides)."""

    g: GTensor
    repeat_h: bool
    repeat_w: bool

    def load(self, cg: Codegen, local: LocalAllocator, b: int, cs: tuple[int, int], hs: tuple[int, int],
             out_w: int) -> LTensor:  # fmt: skip
        rows = 1 if self.repeat_h else hs[1] - hs[0]
        t = local.tensor((1, cs[1] - cs[0], rows, 1 if self.repeat_w else out_w), self.g.fmt)
        nb = 0 if self.g.shape[0] == 1 else b
        dma.load(cg.stream, self.g.slice(n=(nb, nb + 1), c=cs, h=(0, 1) if self.repeat_h else hs), t)
        n_str, c_str, h_str, w_str = t.strides
        shape = (1, cs[1] - cs[0], hs[1] - hs[0], out_w)
        strides = (n_str, c_str, 0 if self.repeat_h else h_str, 0 if self.repeat_w else w_str)
        return LTensor(t.addr, shape, t.fmt, strides)


def operands(cg: Codegen, op: Op) -> tuple[list[Operand], GTensor]:
    out_shape = tuple(cg.graph.shape(op.outputs[0]))
    y = cg.gtensor(op.outputs[0])
    result = []
    for name in op.inputs:
        shape = tuple(cg.graph.shape(name))
        aligned = to4d((1,) * (len(out_shape) - len(shape)) + shape)  # numpy broadcasting aligns on the right
        if any(a not in (1, o) for a, o in zip(aligned, y.shape)):
            raise UserError(f"op '{op.name}' ({op.kind}): input {shape} does not broadcast to {out_shape}")
        g = cg.gtensor(name, aligned)
        if aligned[1] != y.shape[1]:  # every channel reads the same plane: a zero channel stride
            g = GTensor(g.region, g.offset, (g.shape[0], y.shape[1], *g.shape[2:]), g.fmt,
                        (g.strides[0], 0, *g.strides[2:]))  # fmt: skip
        result.append(Operand(g, aligned[2] != y.shape[2], aligned[3] != y.shape[3]))
    return result, y


@kernel("eltwise")
def eltwise(cg: Codegen, op: Op) -> None:
    special = ELTWISE_KERNELS.get(op.attrs.kind)
    if special is not None:
        special(cg, op)
        return
    if op.attrs.kind not in ELTWISE_KINDS:
        raise no_kernel(op, f"eltwise {op.attrs.kind}")
    xs, y = operands(cg, op)
    local = cg.local(op)
    for b, cs, hs in tiles(cg, op, y.shape, y.fmt, 2 * len(xs) + 2):
        local.reset()
        ins = [x.load(cg, local, b, cs, hs, y.shape[3]) for x in xs]
        out = local.tensor((1, cs[1] - cs[0], hs[1] - hs[0], y.shape[3]), y.fmt)
        compute_eltwise(cg, op, out, ins, lambda o=out: local.tensor(o.shape, o.fmt))
        dma.store(cg.stream, out, _part(y, b, cs, hs))


ELTWISE_KINDS = ("add", "sub", "max", "min", "mul")
ELTWISE_KERNELS: dict[str, Callable[[Codegen, Op], None]] = {}  # kinds with a kernel of their own (div)


@kernel("expand")
def expand(cg: Codegen, op: Op) -> None:
    """Broadcast copy: the input read with zero strides on the repeated dims (as an eltwise operand), one
    TIU copy per tile."""
    (x,), y = operands(cg, op)
    local = cg.local(op)
    for b, cs, hs in tiles(cg, op, y.shape, y.fmt, 2):
        local.reset()
        src = x.load(cg, local, b, cs, hs, y.shape[3])
        out = local.tensor((1, cs[1] - cs[0], hs[1] - hs[0], y.shape[3]), y.fmt)
        cg.stream.tiu(tiu.copy(out, src))
        dma.store(cg.stream, out, _part(y, b, cs, hs))


def eltwise_scratch(op: Op) -> int:
    """Output-shaped temporaries `compute_eltwise` asks for: the int16 high plane of an int8 add, the rescaled
    inputs of an int8 max/min."""
    q = quant_of(op)
    if q.mode == "bf16":
        return 0
    if op.attrs.kind in ("add", "sub"):
        return 1
    if op.attrs.kind in ("max", "min"):
        mults = np.broadcast_to(np.asarray(q.multiplier).ravel(), (len(op.inputs),))
        shifts = np.broadcast_to(np.asarray(q.rshift).ravel(), (len(op.inputs),))
        return int(np.count_nonzero((mults != 1) | (shifts != 0)))
    return 0


def compute_eltwise(cg: Codegen, op: Op, out: LTensor, ins: list[LTensor], new_tile: Callable[[], LTensor]) -> None:
    """The TIU ops of one eltwise tile: `ins` (read with explicit strides) into `out`; `new_tile()` gives the
    `eltwise_scratch(op)` temporaries."""
    q = quant_of(op)
    kind = op.attrs.kind
    s = cg.stream
    relu, _ = fused_relu(op)
    bf16 = q.mode == "bf16"
    mults = np.asarray(q.multiplier).ravel() if q.multiplier is not None else None
    rshift = int(np.asarray(q.rshift).ravel()[0]) if q.rshift is not None else 0
    ins = list(ins)
    if kind in ("add", "sub"):
        if bf16:
            coeffs = [BF16_ONE] + [BF16_ONE if kind == "add" else BF16_MINUS_ONE] * (len(ins) - 1)
            s.tiu(tiu.mul(out, ins[0], coeffs[0]))
            for i, lt in enumerate(ins[1:], 1):
                s.tiu(tiu.mac(out, lt, coeffs[i], 16, 0, relu and i == len(ins) - 1, True))
        else:
            plane = new_tile().addr - out.addr
            s.tiu(tiu.mul(out, ins[0], int(mults[0]), out16_plane=plane))
            for i, lt in enumerate(ins[1:], 1):
                last = i == len(ins) - 1
                s.tiu(tiu.mac(out, lt, int(mults[i]), plane, rshift, relu and last, last))
    elif kind in ("max", "min"):
        if not bf16:
            shifts = np.broadcast_to(np.asarray(q.rshift).ravel(), (len(ins),))
            for j, (lt, m, r) in enumerate(zip(ins, mults, shifts)):
                if int(m) != 1 or int(r) != 0:
                    scaled = new_tile()
                    s.tiu(tiu.mul(scaled, lt, int(m), int(r)))
                    ins[j] = scaled
        pick = tiu.maximum if kind == "max" else tiu.minimum
        s.tiu(pick(out, ins[0], ins[1]))
        for lt in ins[2:]:
            s.tiu(pick(out, out, lt))
        if relu:
            s.tiu(tiu.maximum(out, out, 0))
    elif kind == "mul":
        if bf16:  # ReLU as its own max: npuc's simulator ignores a bf16 MUL's relu flag, the vendor's does not
            s.tiu(tiu.mul(out, ins[0], ins[1]))
            for lt in ins[2:]:
                s.tiu(tiu.mul(out, out, lt))
            if relu:
                s.tiu(tiu.maximum(out, out, 0))
        else:
            if len(ins) != 2:
                raise no_kernel(op, f"int8 mul of {len(ins)} inputs")
            s.tiu(tiu.mul_qm(out, ins[0], ins[1], int(mults[0]), rshift, relu))
    clamp(cg, op, out)


def _bf16(value: float) -> int:
    return int(bf16_bits(np.float32(value)))


BF16_TIU_ACTS = ("leaky_relu", "hard_sigmoid", "hard_swish")  # bf16-only activations of compute_relu_like
WRITES_APART = ("hard_sigmoid", "hard_swish")  # they need `out` apart from `x` (else a temporary)


def relu_like(cg: Codegen, op: Op) -> None:
    """A ReLU-family / hard-sigmoid / hard-swish / leaky activation op tiled through local memory."""
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    local = cg.local(op)
    apart = op.attrs.act.kind in WRITES_APART
    for b, cs, hs in tiles(cg, op, y.shape, y.fmt, 2):
        local.reset()
        lt = local.tensor((1, cs[1] - cs[0], hs[1] - hs[0], y.shape[3]), y.fmt)
        out = local.tensor(lt.shape, lt.fmt) if apart else lt
        dma.load(cg.stream, _part(x, b, cs, hs), lt)
        compute_relu_like(cg, op, out, lt, lambda t=lt: local.tensor(t.shape, t.fmt))
        dma.store(cg.stream, out, _part(y, b, cs, hs))


def relu_like_ok(op: Op) -> bool:
    act, mode = op.attrs.act, quant_of(op).mode
    return act.kind in ("relu", "clip") or (act.kind in BF16_TIU_ACTS and mode == "bf16")


def _hard_sigmoid(cg: Codegen, y: LTensor, x: LTensor, alpha: float, beta: float) -> None:
    """y = clip(x * alpha + beta, 0, 1) with one rounding before the clamp; `y` must not be `x`."""
    s = cg.stream
    s.tiu(tiu.maximum(y, x, _bf16(beta)))  # with the min: y = beta whatever x is
    s.tiu(tiu.minimum(y, y, _bf16(beta)))
    s.tiu(tiu.mac(y, x, _bf16(alpha), 16, 0, False, True))
    s.tiu(tiu.maximum(y, y, 0))
    s.tiu(tiu.minimum(y, y, BF16_ONE))


def compute_relu_like(cg: Codegen, op: Op, out: LTensor, x: LTensor, new_tile: Callable[[], LTensor]) -> None:
    """ReLU / clip (int8, bf16) and bf16 LeakyReLU, hard-sigmoid, hard-swish of one tile. `out` may be `x`
    except for hard-sigmoid/-swish (a layer group gives every op's output its own slot); leaky takes one
    temporary from `new_tile()`."""
    q = quant_of(op)
    act = op.attrs.act
    s = cg.stream
    bf16 = q.mode == "bf16"
    if not relu_like_ok(op):
        raise no_kernel(op, f"{q.mode} {act.kind}")
    if act.kind == "leaky_relu":
        neg = new_tile()
        s.tiu(tiu.minimum(neg, x, 0))
        s.tiu(tiu.maximum(out, x, 0))
        s.tiu(tiu.mac(out, neg, _bf16(act.alpha), 16, 0, False, True))
        return
    if act.kind in WRITES_APART:
        if out.addr == x.addr:
            raise ValueError(f"{op_where(op)}: {act.kind} writes a tile apart from its input")
        if act.kind == "hard_sigmoid":
            _hard_sigmoid(cg, out, x, act.alpha, act.beta)
        else:  # the multiply reads x and the hard sigmoid in `out`, writing in place
            _hard_sigmoid(cg, out, x, HARD_SWISH_ALPHA, HARD_SWISH_BETA)
            s.tiu(tiu.mul(out, x, out))
        return
    lo = 0 if act.kind == "relu" else act.lo
    if bf16:
        src = x
        if np.isfinite(lo):
            s.tiu(tiu.maximum(out, src, _bf16(lo)))
            src = out
        if act.kind == "clip" and np.isfinite(act.hi):
            s.tiu(tiu.minimum(out, src, _bf16(act.hi)))
            src = out
        if src is not out:
            s.tiu(tiu.copy(out, x))
    else:
        s.tiu(tiu.maximum(out, x, 0))
        if q.relu_max is not None:
            s.tiu(tiu.minimum(out, out, q.relu_max))
