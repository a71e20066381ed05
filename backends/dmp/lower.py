"""Lower a canonical float IR graph to the DV700 layer table (spec §1.10, §1.11).

Every IR tensor maps to a `Value`: a region of the shared io buffer plus how the graph sees it (NCHW, NHWC
through an absorbed transpose, or flat). Ops lower through the LOWER registry (see `lower_ops.py`); a conv
run then absorbs its sole consumers while the hardware order [conv]→[add]→[max pool]→[act] allows (bias adds,
activations, PReLU, max pooling). Offsets are assigned last by a first-fit live-range allocator, and weights
are packed per run in execution order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from npuc.compiler import coverage
from npuc.compiler.coverage import per_op
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op

from . import weights as wpack
from .convert import u8_table
from .layers import (
    CONV_OFF,
    WFMT_8BIT,
    WFMT_FP16,
    ConvConf,
    Layer,
    Network,
    Run,
    TensorBinding,
)
from .validate import Hardware, check_layer

MEM_ALIGN = 16


@dataclass
class Value:
    """A tensor in the io buffer. dims are (W, H, C); layout 'whc8' (fp16) or 'hwc' (CPU layer output)."""

    buf: int
    dims: tuple[int, int, int]
    layout: str = "whc8"
    dtype: str = "float16"
    view: str = "nchw"
    perm: np.ndarray | None = None  # flat views: buffer position of each graph element
    layer: int | None = None  # producing layer (None: the network input)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.dims)) * np.dtype(self.dtype).itemsize


@dataclass
class RunWeights:
    """A run's float weights, packed once the layer table is final."""

    weight: np.ndarray  # (M, C/group, kh, kw)
    bias: np.ndarray
    prelu: np.ndarray | None = None
    dilated: bool = False
    fp16_only: bool = False


@dataclass
class LayerRefs:
    input: int
    output: int
    eltwise: int | None = None
    params: dict[str, int] = field(default_factory=dict)  # custom param name -> buffer id


@dataclass
class Lowering:
    graph: Graph
    quantized: bool
    hw: Hardware = field(default_factory=Hardware)
    layers: list[Layer] = field(default_factory=list)
    refs: list[LayerRefs] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)  # bytes per buffer id
    run_weights: dict[int, RunWeights] = field(default_factory=dict)  # id(run) -> weights
    consumed: set[str] = field(default_factory=set)  # ops absorbed into an earlier run
    parents: dict[int, tuple[int, int]] = field(default_factory=dict)  # buffer -> (enclosing buffer, byte offset)

    # ---- helpers used by the op handlers --------------------------------------------------------------
    def new_buffer(self, nbytes: int) -> int:
        self.sizes.append(int(nbytes))
        return len(self.sizes) - 1

    def value(self, op: Op, index: int = 0) -> Value:
        name = op.inputs[index]
        if name not in self.values:
            raise UserError(f"op '{op.name}' ({op.kind}): input '{name}' is not an activation DMP can address")
        return self.values[name]

    def const(self, name: str) -> np.ndarray | None:
        return self.graph.const(name)

    def sole_user(self, name: str) -> Op | None:
        if name in self.graph.outputs:
            return None
        users = self.graph.consumers().get(name, [])
        return users[0] if len(users) == 1 else None

    def add_layer(self, layer: Layer, src: Value, out: Value, eltwise: Value | None = None, **params: Value) -> int:
        index = len(self.layers)
        layer.input_dim = list(src.dims)
        layer.output_dim = list(out.dims)
        layer.output_size = out.nbytes
        # The input is in the FPGA layout (the network input of a conv layer is prepared on the CPU, so not).
        layer.is_input_hw_layout = src.layout == "whc8" and not (src.layer is None and layer.type == "LT_CONV")
        self.layers.append(layer)
        self.refs.append(
            LayerRefs(src.buf, out.buf, eltwise.buf if eltwise else None, {k: v.buf for k, v in params.items()})
        )
        out.layer = index
        return index

    def conv_layer(self, name: str, src: Value, runs: list[Run], dims: tuple[int, int, int], ops: list[str]) -> Value:
        out = Value(self.new_buffer(int(np.prod(dims)) * 2), dims)
        conf = ConvConf(w=src.dims[0], h=src.dims[1], c=src.dims[2], runs=runs, topo=1 << (len(runs) - 1))
        layer = Layer(name, "LT_CONV", 0, 0, 0, [], [], conv=conf, ops=ops)
        self.add_layer(layer, src, out)
        return out


Handler = Callable[[Lowering, Op], None]
LOWER: dict[str, Handler] = {}


def lowers(*kinds: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for kind in kinds:
            LOWER[kind] = fn
        return fn

    return register


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
    from . import lower_concat, lower_cpu, lower_ops, lower_pool  # noqa: F401  (register the op handlers)

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


def set_act(run: Run, code: int, param: float = 0.0) -> None:
    run.actfunc = code
    run.actfunc_param = int(np.float16(param).view(np.uint16)) if param else 0


def fp16_bits(x: float) -> int:
    return int(np.float16(x).view(np.uint16))
