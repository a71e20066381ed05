"""Lower a canonical float IR graph to the DV700 layer table (spec §1.10, §1.11).

Every IR tensor maps to a `Value`: a region of the shared io buffer plus how the graph sees it (NCHW, NHWC
through an absorbed transpose, or flat). Ops lower through the LOWER registry (see `lower_ops.py`); a conv
run then absorbs its sole consumers while the hardware order [conv]→[add]→[max pool]→[act] allows (bias adds,
activations, PReLU, max pooling). Offsets are assigned last by a first-fit live-range allocator, and weights
are packed per run in execution order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from npuc.compiler import coverage
from npuc.compiler.coverage import per_op
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph

from . import lower_concat, lower_cpu, lower_ops, lower_pool  # noqa: F401  (their handlers register in LOWER)
from . import weights as wpack
from .convert import u8_table
from .layers import (
    CONV_OFF,
    WFMT_8BIT,
    WFMT_FP16,
    Network,
    TensorBinding,
)
from .lower_context import LOWER, MEM_ALIGN, Lowering, Value
from .validate import Hardware, check_layer

# ---------------------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------------------


def lower_graph(
    graph: Graph,
    *,
    name: str,
    quantized: bool,
    input_convert: dict[str, Any] | None = None,
    hardware: Hardware | None = None,
) -> tuple[Network, bytes]:
    """The layer table and the packed weights file of `graph` (a canonical float IR graph), checked against
    the driver rules for `hardware` (default: the DV700 limits)."""
    if len(graph.inputs) != 1:
        raise UserError(f"DMP networks have one input; this model has {len(graph.inputs)}: {graph.inputs}")
    hw = hardware or Hardware()
    ctx = Lowering(graph, quantized, hw)
    in_name = graph.inputs[0]
    shape = graph.shape(in_name)
    if len(shape) != 4 or shape[0] != 1:
        raise UserError(f"input '{in_name}' has shape {list(shape)}; DMP needs a 1xCxHxW image input (batch 1)")
    _, c, h, w = shape
    convert = dict(input_convert or {})
    u8 = convert.get("policy", "none") != "none"
    src = Value(
        ctx.new_buffer(w * h * c * (1 if u8 else 2)), (w, h, c), "u8" if u8 else "whc8", "uint8" if u8 else "float16"
    )
    ctx.values[in_name] = src
    for op in graph.ops:
        if op.name in ctx.consumed:
            continue
        with per_op(op):
            handler = LOWER.get(op.kind)
            if handler is None:
                raise UserError(
                    f"op '{op.name}' ({op.kind}) has no DV700 lowering; supported: {', '.join(sorted(LOWER))}"
                )
            handler(ctx, op)
        if coverage.active():  # a failed op: stand-in outputs, so the ops after it are judged on their own
            for name in op.outputs:
                if name not in ctx.values:
                    numel = int(np.prod(graph.shape(name)))
                    ctx.values[name] = Value(ctx.new_buffer(numel * 2), (1, 1, numel))
    coverage.stop_if_gaps()
    if not ctx.layers:
        raise UserError("the model has no layer DV700 can run; it needs at least one conv, pool or CPU layer")
    if u8:
        _attach_u8_table(ctx, src)
    outputs = _bind_outputs(ctx)
    offsets = _allocate(ctx, src)
    io_size = max((offsets[b] + _round(s) for b, s in enumerate(ctx.sizes)), default=0)
    blob = _pack_weights(ctx)
    table = b""
    if u8:
        table = u8_table(convert, c)
        ctx.layers[0].conv.u8tofp16_offs = len(blob)
    for i, (layer, refs) in enumerate(zip(ctx.layers, ctx.refs)):
        layer.input_offs, layer.output_offs = offsets[refs.input], offsets[refs.output]
        if layer.conv is not None and refs.eltwise is not None:
            layer.conv.eltwise_offs = offsets[refs.eltwise]
        layer.custom_params.update({k: offsets[b] for k, b in refs.params.items()})
        check_layer(i, layer, hw)
    inputs = [
        TensorBinding(
            in_name,
            [1, h, w, c] if graph.input_layouts.get(in_name) == "nhwc" else [1, c, h, w],
            offsets[src.buf],
            [w, h, c],
            src.layout,
            src.dtype,
            graph.input_layouts.get(in_name, "nchw"),
        )
    ]
    for binding, value in outputs:
        binding.offs = offsets[value.buf]
    net = Network(
        name=name,
        layers=ctx.layers,
        weights_size=len(blob) + len(table),
        io_size=io_size,
        inputs=inputs,
        outputs=[b for b, _ in outputs],
        weight_format="8bit" if quantized else "fp16",
        input_convert=convert,
        hardware=dict(vars(hw)),
    )
    return net, blob + table


def _round(n: int) -> int:
    return -(-n // MEM_ALIGN) * MEM_ALIGN


def _bind_outputs(ctx: Lowering) -> list[tuple[TensorBinding, Value]]:
    bound = []
    for name in ctx.graph.outputs:
        value = ctx.values.get(name)
        if value is None or value.layer is None:
            raise UserError(f"graph output '{name}' is not produced by any DMP layer; it cannot be an input alias")
        layer = ctx.layers[value.layer]
        layer.is_output = True
        perm = None if value.perm is None else [int(i) for i in value.perm]
        binding = TensorBinding(
            name, list(ctx.graph.shape(name)), 0, list(value.dims), value.layout, value.dtype, value.view, perm
        )
        bound.append((binding, value))
    return bound


def _allocate(ctx: Lowering, src: Value) -> list[int]:
    """First-fit by offset over live ranges (buffer alive from its producing layer to its last reader).

    A buffer placed inside another (an LT_CONCAT input) is not allocated itself: it lives at its offset in
    the enclosing buffer, whose live range covers its own.
    """
    n = len(ctx.layers)
    first = [n] * len(ctx.sizes)
    last = [-1] * len(ctx.sizes)
    first[src.buf] = -1
    for i, refs in enumerate(ctx.refs):
        first[refs.output] = min(first[refs.output], i)
        for b in (refs.input, refs.eltwise, *refs.params.values()):
            if b is not None:
                last[b] = max(last[b], i)
    for layer_index, layer in enumerate(ctx.layers):
        for j in layer.input_layers:
            last[ctx.refs[j].output] = max(last[ctx.refs[j].output], layer_index)
    for name in ctx.graph.outputs:
        last[ctx.values[name].buf] = n
    root = {b: _root(ctx, b) for b in range(len(ctx.sizes))}
    for b, (top, _) in root.items():
        if top != b:
            first[top], last[top] = min(first[top], first[b]), max(last[top], last[b])
    offsets = [0] * len(ctx.sizes)
    live: list[tuple[int, int, int]] = []  # (offset, size, last use)
    for b in sorted(range(len(ctx.sizes)), key=lambda k: (first[k], k)):
        if root[b][0] != b or (first[b] >= n and last[b] < 0):
            continue  # placed inside another buffer, or never used
        live = [entry for entry in live if entry[2] >= first[b]]
        size, offs = _round(ctx.sizes[b]), 0
        for start, length, _ in sorted(live):
            if offs + size <= start:
                break
            offs = max(offs, start + length)
        offsets[b] = offs
        live.append((offs, size, max(last[b], first[b])))
    for b, (top, delta) in root.items():
        if top != b:
            offsets[b] = offsets[top] + delta
    return offsets


def _root(ctx: Lowering, buf: int) -> tuple[int, int]:
    """The outermost enclosing buffer of `buf` and `buf`'s byte offset inside it."""
    delta = 0
    while buf in ctx.parents:
        buf, step = ctx.parents[buf]
        delta += step
    return buf, delta


def _pack_weights(ctx: Lowering) -> bytes:
    parts: list[bytes] = []
    offs = 0
    for layer in ctx.layers:
        for run in layer.conv.runs if layer.conv else []:
            pending = ctx.run_weights.get(id(run))
            run.weight_offs = offs
            if pending is None or run.conv_enable == CONV_OFF:
                run.weight_fmt, run.weight_size = 0, 0
                continue
            quantized = ctx.quantized and not pending.fp16_only and pending.prelu is None and run.actfunc != 4
            data = wpack.pack_conv(
                pending.weight, pending.bias, quantized=quantized, prelu=pending.prelu, dilated=pending.dilated
            )
            run.weight_fmt = WFMT_8BIT if quantized else WFMT_FP16
            run.weight_size = len(data)
            parts.append(data)
            offs += len(data)
    return b"".join(parts)


def _attach_u8_table(ctx: Lowering, src: Value) -> None:
    first = ctx.layers[0]
    users = [i for i, r in enumerate(ctx.refs) if r.input == src.buf or r.eltwise == src.buf]
    if first.conv is None or users != [0] or first.conv.runs[0].conv_enable == CONV_OFF:
        raise UserError(
            "input conversion (u8→fp16 table) needs the network input to feed exactly one conv layer; "
            "build without the convert option"
        )
