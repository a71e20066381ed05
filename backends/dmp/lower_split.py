"""Channel split and slice on the DV700 (spec §1.9): in WHC8, channel chunk k starts at element 8k·W·H, so
channels [8k, 8k + n) with n % 8 == 0 (or running to the last channel) are a view of the source: a buffer
placed inside the source's. Layers that address a tensor by offset (convs, adds, custom layers) read a view
directly; layers that read their inputs by producing layer (LT_CONCAT, LT_COPY_CONCAT) get either the whole
source back (the views cover it in order) or a DV700 copy of the view. Unaligned chunks are 1x1 convs that
pick their channels (fp16 weights 0/1, so the copy is exact)."""

from __future__ import annotations

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op

from .layers import CONV_ON, POOL_AVG, Run, pack2
from .lower_context import Lowering, RunWeights, Value, fp16_bits, lowers

CHANNEL_BLOCK = 8


def _channel_source(ctx: Lowering, op: Op) -> Value:
    src = ctx.value(op)
    if len(ctx.graph.shape(op.inputs[0])) != 4 or src.view != "nchw" or src.layout != "whc8":
        raise UserError(
            f"{op.kind} '{op.name}': DV700 splits FPGA-layout 1xCxHxW tensors along channels only "
            f"(this one is {src.view}, {src.layout})"
        )
    return src


def _chunk(ctx: Lowering, op: Op, src: Value, start: int, size: int, out: str, name: str) -> Value:
    w, h, c = src.dims
    aligned = start % CHANNEL_BLOCK == 0 and (size % CHANNEL_BLOCK == 0 or start + size == c)
    if aligned and src.dtype == "float16" and out not in ctx.graph.outputs:  # an output is a layer's own
        view = Value(ctx.new_buffer(w * h * size * 2), (w, h, size), layer=src.layer)
        ctx.parents[view.buf] = (src.buf, 2 * start * w * h)
        ctx.views.add(view.buf)
        return view
    pick = np.zeros((size, c, 1, 1), np.float32)
    pick[np.arange(size), start + np.arange(size), 0, 0] = 1.0
    run = Run(m=size, conv_enable=CONV_ON, p=1)
    run.ops.append(op.name)
    ctx.run_weights[id(run)] = RunWeights(pick, np.zeros(size, np.float32), fp16_only=True)
    return ctx.conv_layer(name, src, [run], (w, h, size), [op.name])


@lowers("split")
def lower_split(ctx: Lowering, op: Op) -> None:
    if op.attrs.axis % 4 != 1:
        raise UserError(f"split '{op.name}' along axis {op.attrs.axis}: DV700 splits along channels only")
    src = _channel_source(ctx, op)
    starts = np.cumsum((0,) + tuple(op.attrs.sizes))
    for name, start, size in zip(op.outputs, starts, op.attrs.sizes):
        ctx.values[name] = _chunk(ctx, op, src, int(start), int(size), name, f"{op.name}:{name}")


@lowers("slice")
def lower_slice(ctx: Lowering, op: Op) -> None:
    a = op.attrs
    if len(a.axes) != 1 or a.axes[0] % 4 != 1 or a.steps != (1,):
        raise UserError(f"slice '{op.name}' (axes {list(a.axes)}, steps {list(a.steps)}): DV700 slices channels only")
    src = _channel_source(ctx, op)
    start, end, _ = slice(a.starts[0], a.ends[0]).indices(src.dims[2])
    if end <= start:
        raise UserError(f"slice '{op.name}' selects no channel")
    ctx.values[op.outputs[0]] = _chunk(ctx, op, src, start, end - start, op.outputs[0], op.name)


def inputs_by_layer(ctx: Lowering, op: Op, srcs: list[Value]) -> list[Value]:
    """`srcs` made readable by producing layer: consecutive views that cover their source in order become
    the source; any other view becomes a DV700 copy (a 1x1 average pool with gain 1)."""
    out: list[Value] = []
    i = 0
    while i < len(srcs):
        if srcs[i].buf not in ctx.views:
            out.append(srcs[i])
            i += 1
            continue
        whole = _covering_run(ctx, srcs, i)
        if whole is not None:
            out.append(whole[0])
            i = whole[1]
            continue
        run = Run(m=srcs[i].dims[2], pool_enable=POOL_AVG, pool_size=pack2(1, 1), pool_avg_param=fp16_bits(1.0))
        run.ops.append(op.name)
        out.append(ctx.conv_layer(f"{op.name}:copy{i}", srcs[i], [run], srcs[i].dims, [op.name]))
        i += 1
    return out


def _covering_run(ctx: Lowering, srcs: list[Value], i: int) -> tuple[Value, int] | None:
    """(the source value, index after the run) if srcs[i:] starts with views covering their source in order."""
    source, offset = ctx.parents[srcs[i].buf]
    if offset != 0:
        return None
    j = i
    while j < len(srcs) and srcs[j].buf in ctx.views and ctx.parents[srcs[j].buf] == (source, offset):
        offset += srcs[j].nbytes
        j += 1
        if offset == ctx.sizes[source]:
            whole = [v for v in ctx.values.values() if v.buf == source and v.view == "nchw" and v.layout == "whc8"]
            return (whole[0], j) if whole and whole[0].layer is not None else None
    return None
