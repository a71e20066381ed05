"""Lowering of pooling, elementwise and upsampling ops to conv-less DV700 runs (spec §1.11)."""

from __future__ import annotations

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op

from .layers import CONV_OFF, POOL_AVG, POOL_MAX, POOL_UPSAMPLE, Run, pack2, pack4
from .lower_context import Lowering, fp16_bits, lowers
from .lower_ops import _affine_run, _custom, _pool_fields, _try_act, _whc8_input
from .validate import MAX_KERNEL, MAX_POOL_SIZES

POOL_LIMIT = {POOL_MAX: 3, POOL_AVG: MAX_KERNEL}


def _factors(n: int, limit: int) -> list[int] | None:
    """n as a product of factors <= limit, largest first (None if a prime factor exceeds the limit)."""
    out = []
    while n > 1:
        f = next((d for d in range(min(n, limit), 1, -1) if n % d == 0), None)
        if f is None:
            return None
        out.append(f)
        n //= f
    return out or [1]


def _pool_runs(op: Op, mode: int, size: tuple[int, int], stride: int, pad: int) -> list[Run]:
    """One run, or a cascade of stride == kernel runs when the window exceeds the HW limit."""
    kw, kh = size
    fits = size in MAX_POOL_SIZES if mode == POOL_MAX else max(size) <= MAX_KERNEL
    if fits:
        return [_pool_run(op, mode, size, stride, pad)]
    same = kw == kh and kw % 2 and stride == pack2(1, 1) and pad == pack4(*(kw // 2,) * 4)
    if mode == POOL_MAX and same:  # YOLO's SPPF: a stride-1 "same" max pool is a cascade of 3x3 ones
        return [_pool_run(op, mode, (3, 3), stride, pack4(1, 1, 1, 1)) for _ in range(kw // 2)]
    if stride != pack2(kw, kh) or pad:
        raise UserError(
            f"pool '{op.name}' has a {kw}x{kh} window, over the DV700 limit, and can only be split into a "
            "cascade when stride == kernel and there is no padding (or, for max pools, an odd window at stride 1 "
            "with 'same' padding)"
        )
    fw, fh = _factors(kw, POOL_LIMIT[mode]), _factors(kh, POOL_LIMIT[mode])
    if fw is None or fh is None:
        raise UserError(f"pool '{op.name}': window {kw}x{kh} does not factor into DV700-sized stages")
    n = max(len(fw), len(fh))
    stages = list(zip(fw + [1] * (n - len(fw)), fh + [1] * (n - len(fh))))
    if mode == POOL_MAX and any(s not in MAX_POOL_SIZES for s in stages):
        raise UserError(f"pool '{op.name}': window {kw}x{kh} cannot be cascaded from the allowed max-pool sizes")
    return [_pool_run(op, mode, s, pack2(*s), 0) for s in stages]


def _pool_run(op: Op, mode: int, size: tuple[int, int], stride: int, pad: int) -> Run:
    run = Run(m=0, conv_enable=CONV_OFF, pool_enable=mode, pool_size=pack2(*size), pool_stride=stride, pool_pad=pad)
    if mode == POOL_AVG:
        run.pool_avg_param = fp16_bits(1.0 / (size[0] * size[1]))
    run.ops.append(op.name)
    return run


def _emit_pool(ctx: Lowering, op: Op, runs: list[Run]) -> None:
    from .validate import run_output_dims

    src = _whc8_input(ctx, op)
    dims = src.dims
    for run in runs:
        run.m = dims[2]
        dims = run_output_dims(run, dims)
    act = getattr(op.attrs, "act", None)
    if act is not None and not _try_act(runs[-1], act):
        raise UserError(f"pool '{op.name}' carries activation {act.kind}, which DV700 cannot apply")
    ctx.values[op.outputs[0]] = ctx.conv_layer(op.name, src, runs, dims, [op.name])


@lowers("pool2d")
def lower_pool(ctx: Lowering, op: Op) -> None:
    fields = _pool_fields(ctx, op)
    if fields is None:
        raise UserError(f"pool '{op.name}' is dilated; DV700 pools are not")
    mode, size, stride, pad = fields
    if mode == POOL_AVG and pad and not op.attrs.count_include_pad:
        raise UserError(
            f"average pool '{op.name}' pads without counting the padding; DV700 always divides by kx*ky, "
            "so remove the padding or use count_include_pad=1"
        )
    _emit_pool(ctx, op, _pool_runs(op, mode, size, stride, pad))


@lowers("global_pool")
def lower_global_pool(ctx: Lowering, op: Op) -> None:
    w, h, _ = ctx.value(op).dims
    mode = POOL_MAX if op.attrs.mode == "max" else POOL_AVG
    _emit_pool(ctx, op, _pool_runs(op, mode, (w, h), pack2(w, h), 0))


@lowers("resize")
def lower_resize(ctx: Lowering, op: Op) -> None:
    """Nearest upsampling by 2^k: k layers of the 2x2 upsample run (nearest of nearest is nearest: output row i
    reads input row i // 2^k either way)."""
    a = op.attrs
    factor = a.scales[-1] if len(a.scales) >= 2 else 0
    steps = int(np.log2(factor)) if factor >= 2 and float(factor).is_integer() else 0
    if (
        a.mode != "nearest"
        or steps < 1
        or 2**steps != factor
        or a.scales[-2] != factor
        or tuple(a.scales[:2]) not in ((1.0, 1.0), ())
    ):
        raise UserError(
            f"resize '{op.name}': DV700 upsamples only by nearest 2x2 (repeated: 4x4, 8x8, ...); "
            f"got {a.mode} scales {a.scales}"
        )
    src = _whc8_input(ctx, op)
    for k in range(steps):
        run = Run(m=src.dims[2], pool_enable=POOL_UPSAMPLE, pool_size=pack2(2, 2), pool_stride=pack2(2, 2))
        run.ops.append(op.name)
        name = op.name if k == steps - 1 else f"{op.name}_x{2 ** (k + 1)}"
        src = ctx.conv_layer(name, src, [run], (2 * src.dims[0], 2 * src.dims[1], src.dims[2]), [op.name])
    ctx.values[op.outputs[0]] = src


@lowers("eltwise")
def lower_eltwise(ctx: Lowering, op: Op) -> None:
    kind = op.attrs.kind
    consts = [ctx.const(n) for n in op.inputs]
    if len(op.inputs) != 2:
        raise UserError(f"eltwise '{op.name}' has {len(op.inputs)} inputs; DV700 adds pairs, split it")
    out_shape = ctx.graph.shape(op.outputs[0])
    if any(c is not None for c in consts):
        _eltwise_const(ctx, op, consts)
        return
    a, b = (ctx.graph.shape(n) for n in op.inputs)
    if kind == "add" and a == b == out_shape:
        _eltwise_add(ctx, op)
    elif kind == "mul" and len(a) == 4 and (a == out_shape or b == out_shape):
        big = 0 if a == out_shape else 1
        small = ctx.graph.shape(op.inputs[1 - big])
        if small[2:] != (1, 1):
            raise UserError(f"mul '{op.name}': DV700 multiplies tensors only by a per-channel (Nx C x1x1) vector")
        if big == 1:
            op.inputs = op.inputs[::-1]
        _custom(ctx, op, "channel_mul", {}, scale_offs=ctx.value(op, 1))
        if op.attrs.act is not None:
            raise UserError(f"mul '{op.name}' carries an activation; npuc's channel_mul layer has none")
    else:
        raise UserError(f"eltwise {kind} '{op.name}' of {list(a)} and {list(b)} has no DV700 lowering")


def _eltwise_const(ctx: Lowering, op: Op, consts: list[np.ndarray | None]) -> None:
    kind = op.attrs.kind
    data = next(c for c in consts if c is not None)
    src = ctx.value(op, 0 if consts[0] is None else 1)
    c = src.dims[2]
    flat = np.asarray(data, np.float32).reshape(-1)
    if flat.size not in (1, c) or consts[0] is not None and kind == "sub":
        raise UserError(f"eltwise {kind} '{op.name}': the constant must be a scalar or per-channel, after the tensor")
    vec = np.broadcast_to(flat, (c,))
    if consts[0] is not None:
        op.inputs = op.inputs[::-1]
    if kind == "mul" and flat.size == 1 and op.attrs.act is None:  # the tool's Power: avg-pool 1x1 with a gain
        run = Run(m=c, pool_enable=POOL_AVG, pool_size=pack2(1, 1), pool_avg_param=fp16_bits(float(flat[0])))
        run.ops.append(op.name)
        ctx.values[op.outputs[0]] = ctx.conv_layer(op.name, _whc8_input(ctx, op), [run], src.dims, [op.name])
    elif kind in ("add", "sub"):
        _affine_run(ctx, op, np.ones(c, np.float32), vec if kind == "add" else -vec, op.attrs.act)
    elif kind == "mul":
        _affine_run(ctx, op, vec, np.zeros(c, np.float32), op.attrs.act)
    elif kind == "div":
        _affine_run(ctx, op, 1.0 / vec, np.zeros(c, np.float32), op.attrs.act)
    else:
        raise UserError(f"eltwise {kind} '{op.name}' with a constant has no DV700 lowering")


def _eltwise_add(ctx: Lowering, op: Op) -> None:
    """[avg_pool 1x1]→[add]→[act] in a conv-less run; the second operand comes through eltwise_buf."""
    src, other = _whc8_input(ctx, op, 0), _whc8_input(ctx, op, 1)
    run = Run(m=src.dims[2], pool_enable=POOL_AVG, pool_size=pack2(1, 1), pool_avg_param=fp16_bits(1.0))
    run.ops.append(op.name)
    if op.attrs.act is not None and not _try_act(run, op.attrs.act):
        raise UserError(f"add '{op.name}' carries activation {op.attrs.act.kind}, which DV700 cannot apply")
    out = ctx.conv_layer(op.name, src, [run], src.dims, [op.name])
    ctx.layers[-1].conv.output_mode = 1
    ctx.refs[-1].eltwise = other.buf  # its offset is resolved after allocation
    ctx.values[op.outputs[0]] = out
