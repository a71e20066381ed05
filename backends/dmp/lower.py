"""Lower a canonical float IR graph to the DV700 layer table (spec §1.10, §1.11).

Every IR tensor maps to a `Value`: a region of the shared io buffer plus how the graph sees it (NCHW, NHWC
through an absorbed transpose, or flat). Ops lower through the LOWER registry (see `lower_ops.py`); a conv
run then absorbs its sole consumers while the hardware order [conv]→[add]→[max pool]→[act] allows (bias adds,
activations, PReLU, max pooling). Offsets are assigned last by a first-fit live-range allocator, and weights
are packed per run in execution order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from npuc.compiler import coverage
from npuc.compiler.allocator import place_blocks
from npuc.compiler.coverage import per_op
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op

from . import lower_concat, lower_cpu, lower_ops, lower_pool, lower_split  # noqa: F401  (their handlers register in LOWER)
from . import weights as wpack
from .convert import u8_table
from .layers import (
    CONV_OFF,
    TRANSPOSED_WEIGHTS,
    WFMT_8BIT,
    WFMT_FP16,
    Layer,
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
    transposed: bool = False,
    kmeans_seed: int = 0,
) -> tuple[Network, bytes]:
    """The layer table and the packed weights file of `graph` (a canonical float IR graph), checked against
    the driver rules for `hardware` (default: the DV700 limits). `transposed`: kernels stored with kx and ky
    exchanged (the convertor's transpose_weight); `kmeans_seed`: OpenCV's seed for the 8-bit LUTs."""
    if len(graph.inputs) != 1:
        raise UserError(f"DMP networks have one input; this model has {len(graph.inputs)}: {graph.inputs}")
    hw = hardware or Hardware()
    graph = dataclasses.replace(graph, ops=convertor_order(graph))
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
    _flatten_conv_outputs(ctx)
    outputs = _bind_outputs(ctx)
    offsets = _allocate(ctx, src)
    io_size = max((offsets[b] + _round(s) for b, s in enumerate(ctx.sizes)), default=0)
    blob = _pack_weights(ctx, transposed, kmeans_seed)
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
        weights_transposed=transposed,
    )
    return net, blob + table


def convertor_order(graph: Graph) -> list[Op]:
    """The ops in the convertor's layer order (its weights file follows it): walk back from the outputs, in
    output order, taking an op once every op that reads it is taken; the reverse of that walk. Ops that no
    output needs keep their place after it."""
    producer = {name: op for op in graph.ops for name in op.outputs}
    readers: dict[int, set[int]] = {id(op): set() for op in graph.ops}
    for op in graph.ops:
        for name in op.inputs:
            if name in producer:
                readers[id(producer[name])].add(id(op))
    pending = list(dict.fromkeys(producer[name] for name in reversed(graph.outputs) if name in producer))
    walk: list[Op] = []
    taken: set[int] = set()
    while pending:
        op = pending.pop()
        if id(op) in taken:
            continue
        walk.append(op)
        taken.add(id(op))
        for name in op.inputs:
            source = producer.get(name)
            if source is not None and id(source) not in taken and readers[id(source)] <= taken:
                pending.append(source)
    walk.reverse()
    return walk + [op for op in graph.ops if id(op) not in taken]


def _round(n: int) -> int:
    return -(-n // MEM_ALIGN) * MEM_ALIGN


def _flatten_conv_outputs(ctx: Lowering) -> None:
    """As the convertor: a network output computed by a conv layer gets a flatten after it, which is an
    LT_FLATTEN (the CPU un-permutes WHC8 to HWC) unless the FPGA layout already is HWC (C <= 8 or 1x1)."""
    for k, name in enumerate(ctx.graph.outputs):
        src = ctx.values[name]
        w, h, c = src.dims
        if src.layer is None or ctx.layers[src.layer].type != "LT_CONV" or src.layout != "whc8":
            continue
        if c <= 8 or w * h == 1:
            continue
        out = Value(ctx.new_buffer(w * h * c * 2), (w, h, c), "hwc", "float16", src.view, src.perm)
        layer = Layer(f"dmp_conv_flat_{k}", "LT_FLATTEN", 0, 0, 0, [], [])
        ctx.add_layer(layer, src, out)
        layer.output_dim = [w * h * c]
        ctx.values[name] = out


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
    """Offsets in the io buffer: buffers alive at a common layer (from the producing layer to the last reader)
    never share bytes; of two placements (largest first, first-fit in layer order) the smaller is kept.

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
    placed = [b for b in range(len(ctx.sizes)) if root[b][0] == b and not (first[b] >= n and last[b] < 0)]
    blocks = [(ctx.sizes[b], first[b], max(last[b], first[b])) for b in placed]
    offsets = [0] * len(ctx.sizes)
    for b, offs in zip(placed, place_blocks(blocks, MEM_ALIGN)[0]):
        offsets[b] = offs
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


def _pack_weights(ctx: Lowering, transposed: bool, kmeans_seed: int) -> bytes:
    """Every conv run's packed weights in execution order (the order the convertor clusters them in)."""
    parts: list[bytes] = []
    offs = 0
    if ctx.quantized:
        wpack.reset_kmeans_seed(kmeans_seed)
    for layer in ctx.layers:
        if layer.conv is not None and transposed:
            layer.conv.input_circular_offset = TRANSPOSED_WEIGHTS
        for run in layer.conv.runs if layer.conv else []:
            pending = ctx.run_weights.get(id(run))
            run.weight_offs = offs
            if pending is None or run.conv_enable == CONV_OFF:
                run.weight_fmt, run.weight_size = 0, 0
                continue
            quantized = ctx.quantized and not pending.fp16_only and pending.prelu is None and run.actfunc != 4
            data = wpack.pack_conv(
                pending.weight,
                pending.bias,
                quantized=quantized,
                prelu=pending.prelu,
                dilated=pending.dilated,
                transposed=transposed,
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
