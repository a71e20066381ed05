"""Channel concat on the DV700, cheapest form first (spec §1.9, §1.10):

1. branches: every input is a chain of at most two single-run conv layers reading one shared tensor, each
   branch with C % 8 == 0 → the chains become ONE conv layer with several runs. A run whose topo bit is set
   writes its branch to the output buffer (branches adjacent, in run order) and the next run starts again
   from the layer input; a run whose bit is clear feeds the next run through the UBUF. The merge is kept
   only if the merged command passes every driver rule (one tile per UBUF-kept run, single-tile peak).
2. LT_CONCAT: every input but the last has C % 8 == 0 and a 16-byte-aligned size → the producers write
   adjacent regions of the concat's buffer (the allocator places them there) and the layer does nothing.
3. LT_COPY_CONCAT otherwise: a CPU copy that re-chunks the inputs into one FPGA-layout tensor.
"""

from __future__ import annotations

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op

from .layers import CONV_DECONV_BIT, MAX_RUNS, ConvConf, Layer
from .lower_context import Lowering, Value, lowers
from .lower_decode import ROWS, lower_anchor_concat
from .lower_split import inputs_by_layer
from .validate import check_layer

BRANCH_DEPTH = 2  # the tool merges branches of at most two layers
CHANNEL_BLOCK = 8


@lowers("concat")
def lower_concat(ctx: Lowering, op: Op) -> None:
    srcs = [ctx.value(op, i) for i in range(len(op.inputs))]
    if any(s.view == ROWS for s in srcs):
        lower_anchor_concat(ctx, op, srcs)
        return
    if op.attrs.axis % 4 != 1 or any(s.view != "nchw" or s.layout != "whc8" for s in srcs):
        raise UserError(f"concat '{op.name}': DV700 concatenates NCHW FPGA-layout tensors along channels only")
    srcs = inputs_by_layer(ctx, op, srcs)
    if any(s.layer is None for s in srcs):
        raise UserError(f"concat '{op.name}' reads the network input directly; put a layer before it")
    if _merge_branches(ctx, op, srcs) or _free_concat(ctx, op, srcs):
        return
    w, h, _ = srcs[0].dims
    out = Value(ctx.new_buffer(w * h * sum(s.dims[2] for s in srcs) * 2), (w, h, sum(s.dims[2] for s in srcs)))
    layer = Layer(op.name, "LT_COPY_CONCAT", 0, 0, 0, [], [], input_layers=[s.layer for s in srcs], ops=[op.name])
    ctx.add_layer(layer, srcs[0], out)
    ctx.values[op.outputs[0]] = out


# ---------------------------------------------------------------------------------------------------------
# 1. branches as one multi-run layer
# ---------------------------------------------------------------------------------------------------------


def _readers(ctx: Lowering, buf: int) -> list[int]:
    """Layers reading buffer `buf` (as input, eltwise operand, custom parameter or concat input)."""
    found = [i for i, r in enumerate(ctx.refs) if buf in (r.input, r.eltwise, *r.params.values())]
    found += [i for i, layer in enumerate(ctx.layers) for j in layer.input_layers if ctx.refs[j].output == buf]
    return sorted(set(found))


def _private(ctx: Lowering, buf: int, lowered: set[str], readers: list[int]) -> bool:
    """True if nothing but `readers` reads `buf`, now or later (no graph output, no op still to lower)."""
    if _readers(ctx, buf) != readers or buf in ctx.parents:
        return False
    consumers = ctx.consumers()
    names = [name for name, value in ctx.values.items() if value.buf == buf]
    later = [c for name in names for c in consumers.get(name, []) if c.name not in lowered]
    return not later and not any(name in ctx.graph.outputs for name in names)


def _mergeable(layer: Layer) -> bool:
    conf = layer.conv
    if layer.type != "LT_CONV" or conf is None or len(conf.runs) != 1 or conf.topo != 1:
        return False
    run = conf.runs[0]
    plain = run.conv_dilation == 0 and not run.lrn & 1 and not run.conv_enable & CONV_DECONV_BIT
    return conf.output_mode == 0 and plain and conf.u8tofp16_offs is None


def _chain(ctx: Lowering, value: Value, source: int | None) -> list[int] | None:
    """Layer indices of the branch producing `value` from buffer `source` (None: any source), or None."""
    chain: list[int] = []
    index = value.layer
    while index is not None and len(chain) < BRANCH_DEPTH and _mergeable(ctx.layers[index]):
        chain.insert(0, index)
        if ctx.refs[index].input == source:
            return chain
        producers = [i for i, r in enumerate(ctx.refs) if r.output == ctx.refs[index].input]
        index = producers[0] if len(producers) == 1 else None
    return chain if source is None and chain else None


def _branches(ctx: Lowering, op: Op, srcs: list[Value]) -> tuple[int, list[list[int]]] | None:
    """(shared source buffer, one layer chain per input) if the inputs can become one multi-run layer."""
    if len(srcs) < 2 or len({s.buf for s in srcs}) != len(srcs) or any(s.dims[2] % CHANNEL_BLOCK for s in srcs):
        return None
    first = _chain(ctx, srcs[0], None)
    lowered = {o.name for o in ctx.graph.ops[: ctx.graph.ops.index(op)]}
    for source in dict.fromkeys(ctx.refs[i].input for i in first or []):  # deepest candidate first
        chains = [_chain(ctx, s, source) for s in srcs]
        if any(c is None for c in chains):
            continue
        layers = [i for c in chains for i in c]
        if len(set(layers)) != len(layers) or len(layers) > MAX_RUNS:
            continue
        if len({tuple(ctx.layers[c[0]].input_dim) for c in chains}) != 1:
            continue
        if not _driver_accepts(ctx, chains):
            continue
        private = all(
            _private(ctx, ctx.refs[a].output, lowered, [b]) for c in chains for a, b in zip(c, c[1:])
        ) and all(_private(ctx, ctx.refs[c[-1]].output, lowered | {op.name}, []) for c in chains)
        if private:
            return source, chains
    return None


def _topo(chains: list[list[int]]) -> int:
    """One topo bit per branch, at the branch's last run (that run writes to memory)."""
    ends = np.cumsum([len(c) for c in chains]) - 1
    return sum(1 << int(e) for e in ends)


def _driver_accepts(ctx: Lowering, chains: list[list[int]]) -> bool:
    """True if the merged multi-run command passes every driver rule: each run kept in the UBUF fits one
    tile and the whole command's single-tile UBUF peak fits the device's unified buffer."""
    runs = [ctx.layers[i].conv.runs[0] for c in chains for i in c]
    w, h, c = ctx.layers[chains[0][0]].input_dim
    probe = Layer("probe", "LT_CONV", 0, 0, 0, [], [], conv=ConvConf(w=w, h=h, c=c, runs=runs, topo=_topo(chains)))
    try:
        check_layer(0, probe, ctx.hw)
    except UserError:
        return False
    return True


def _merge_branches(ctx: Lowering, op: Op, srcs: list[Value]) -> bool:
    found = _branches(ctx, op, srcs)
    if found is None:
        return False
    source, chains = found
    layers = [i for c in chains for i in c]
    runs = [ctx.layers[i].conv.runs[0] for i in layers]
    first_layer = ctx.layers[chains[0][0]]
    ops = [name for i in layers for name in ctx.layers[i].ops] + [op.name]
    _drop_layers(ctx, layers)
    src_value = next(v for v in ctx.values.values() if v.buf == source)
    src = Value(source, tuple(first_layer.input_dim), src_value.layout, src_value.dtype, "nchw", None, src_value.layer)
    topo = _topo(chains)
    w, h, _ = srcs[0].dims
    dims = (w, h, sum(s.dims[2] for s in srcs))
    conf = ConvConf(w=src.dims[0], h=src.dims[1], c=src.dims[2], runs=runs, topo=topo)
    out = Value(ctx.new_buffer(int(np.prod(dims)) * 2), dims)
    ctx.add_layer(Layer(", ".join(ops), "LT_CONV", 0, 0, 0, [], [], conv=conf, ops=ops), src, out)
    ctx.layers[-1].is_input_hw_layout = first_layer.is_input_hw_layout
    ctx.values[op.outputs[0]] = out
    return True


def _drop_layers(ctx: Lowering, drop: list[int]) -> None:
    """Remove layers (whose outputs nothing else reads) and renumber the layer references that remain."""
    gone = set(drop)
    keep = [i for i in range(len(ctx.layers)) if i not in gone]
    new_index = {old: new for new, old in enumerate(keep)}
    ctx.layers = [ctx.layers[i] for i in keep]
    ctx.refs = [ctx.refs[i] for i in keep]
    for layer in ctx.layers:
        layer.input_layers = [new_index[j] for j in layer.input_layers]
    for value in ctx.values.values():
        if value.layer is not None:
            value.layer = new_index.get(value.layer, -1)  # -1: a dropped layer's dead intermediate


# ---------------------------------------------------------------------------------------------------------
# 2. free concat: producers write adjacent regions
# ---------------------------------------------------------------------------------------------------------


def _free_concat(ctx: Lowering, op: Op, srcs: list[Value]) -> bool:
    if len({s.buf for s in srcs}) != len(srcs) or any(s.dtype != "float16" or s.buf in ctx.parents for s in srcs):
        return False
    if any(s.dims[2] % CHANNEL_BLOCK or s.nbytes % 16 for s in srcs[:-1]):
        return False
    w, h, _ = srcs[0].dims
    dims = (w, h, sum(s.dims[2] for s in srcs))
    out = Value(ctx.new_buffer(int(np.prod(dims)) * 2), dims)
    offset = 0
    for s in srcs:
        ctx.parents[s.buf] = (out.buf, offset)
        offset += s.nbytes
    layer = Layer(op.name, "LT_CONCAT", 0, 0, 0, [], [], input_layers=[s.layer for s in srcs], ops=[op.name])
    ctx.add_layer(layer, srcs[0], out)
    ctx.values[op.outputs[0]] = out
    return True
