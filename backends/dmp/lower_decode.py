"""A detection head's decode on the host: the per-level head outputs (1xCxHxW, on the DV700) reshaped to
1xCx(H·W) and concatenated along the anchors, then everything after that concat up to the graph output, as
one `yolo_decode` CPU custom layer. The DV700 has no exp and no tensor-by-tensor multiply (spec §1.3, §1.11),
so the DFL softmax and the box arithmetic cannot run on it; the class-score sigmoid can, as the class convs'
activation.

The ops after the concat are recognised by what they compute, not by their names: the float interpreter runs
them on a seeded random head output and the result must equal `decode.yolo_decode` with the levels' geometry
(stride = input width / level width). Anything else is refused, naming the ops."""

from __future__ import annotations

import numpy as np

from npuc.compiler import interp
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op

from .decode import yolo_decode
from .layers import ACT_NONE, ACT_SIGMOID, Layer
from .lower_context import Lowering, Value, set_act

ROWS = "rows"  # a 1xCxHxW tensor seen as 1xCx(H·W): the same WHC8 buffer
TOLERANCE = 1e-3  # relative to the largest decoded value: float32 reorderings stay far below it


def rows_alias(ctx: Lowering, op: Op, src: Value) -> bool:
    """Bind a reshape 1xCxHxW → 1xCx(H·W) whose only readers are anchor-axis concats as a view of the same
    buffer (the decode reads it); False if the reshape is not that."""
    w, h, c = src.dims
    out = op.outputs[0]
    if ctx.graph.shape(out) != (1, c, h * w) or src.view != "nchw" or src.layout != "whc8" or src.layer is None:
        return False
    readers = ctx.consumers().get(out, [])
    if out in ctx.graph.outputs or not readers or any(r.kind != "concat" or r.attrs.axis % 3 != 2 for r in readers):
        return False
    ctx.values[out] = Value(src.buf, src.dims, src.layout, src.dtype, ROWS, None, src.layer)
    return True


def lower_anchor_concat(ctx: Lowering, op: Op, srcs: list[Value]) -> None:
    """The concat of the levels' rows and every op after it, as one yolo_decode custom layer."""
    tail, final = _tail(ctx.graph, op)
    names = ", ".join(o.name for o in [op, *tail])
    channels = {s.dims[2] for s in srcs}
    k = ctx.graph.shape(final)[1] if len(ctx.graph.shape(final)) == 3 else 0
    reg_max = (channels.pop() - k + 4) // 4 if len(channels) == 1 and k > 4 else 0
    levels = _levels(ctx, srcs)
    if reg_max < 1 or levels is None or not _computes_decode(ctx.graph, op, tail, final, levels, reg_max):
        raise UserError(
            f"the ops after concat '{op.name}' ({names}) are not the YOLOv8 DFL decode that npuc's yolo_decode "
            "CPU custom layer computes, and the DV700 cannot run them (no exp, no tensor products); export the "
            "model without its decode (the raw head outputs) and decode on the host"
        )
    n = sum(w * h for w, h, _ in levels)
    out = Value(ctx.new_buffer(k * n * 4), (1, 1, k * n), "hwc", "float32", "flat")
    params: dict[str, float] = {"reg_max": float(reg_max), "levels": float(len(levels))}
    for i, (w, h, stride) in enumerate(levels):
        params |= {f"w{i}": float(w), f"h{i}": float(h), f"stride{i}": float(stride)}
    params["sigmoid"] = 0.0 if _scores_on_dv700(ctx, srcs, k - 4) else 1.0
    layer = Layer(op.name, "LT_CUSTOM", 0, 0, 0, [], [], is_f32_output=True, custom_type="yolo_decode")
    layer.ops = [op.name] + [o.name for o in tail]
    layer.custom_params = params
    ctx.add_layer(layer, srcs[0], out, **{f"level{i}_offs": s for i, s in enumerate(srcs)})
    layer.output_dim = [k * n]
    ctx.consumed.update(o.name for o in tail)
    ctx.values[final] = out


def _scores_on_dv700(ctx: Lowering, srcs: list[Value], classes: int) -> bool:
    """Give the class-score sigmoid to the DV700 (the activation of the class convs; it commutes with the
    reshapes and concats) when every level is a free LT_CONCAT whose last input is a one-run conv layer of
    `classes` channels, without activation, that nothing else reads. True if it did."""
    runs = []
    consumers = ctx.consumers()
    for s in srcs:
        level = ctx.layers[s.layer]
        cls = ctx.layers[level.input_layers[-1]] if level.type == "LT_CONCAT" and level.input_layers else None
        if cls is None or cls.conv is None or len(cls.conv.runs) != 1 or cls.output_dim[2] != classes:
            return False
        buf = ctx.refs[level.input_layers[-1]].output
        names = [name for name, v in ctx.values.items() if v.buf == buf]
        readers = {c.name for name in names for c in consumers.get(name, [])}
        if cls.is_output or readers - set(level.ops) or any(name in ctx.graph.outputs for name in names):
            return False
        runs.append(cls.conv.runs[0])
    if any(run.actfunc != ACT_NONE for run in runs):
        return False
    for run in runs:
        set_act(run, ACT_SIGMOID)
    return True


def _tail(graph: Graph, op: Op) -> tuple[list[Op], str]:
    """The ops reading (transitively) the concat's output, and the one graph output they make; they may read
    nothing else but constants, and nothing else may read them."""
    reached = set(op.outputs)
    tail: list[Op] = []
    for later in graph.ops[graph.ops.index(op) + 1 :]:
        if any(name in reached for name in later.inputs):
            tail.append(later)
            reached.update(later.outputs)
    inside = set(op.outputs) | {name for o in tail for name in o.outputs}
    finals = [name for name in graph.outputs if name in inside]
    foreign = [o.name for o in tail for name in o.inputs if name not in inside and graph.const(name) is None]
    consumers = graph.consumers()
    escapes = [c.name for name in inside for c in consumers.get(name, []) if c not in tail]
    if len(finals) != 1 or foreign or escapes:
        raise UserError(
            f"the ops after concat '{op.name}' must make exactly one graph output from the concat alone "
            f"(graph outputs {finals}, other inputs read by {sorted(set(foreign))[:3]}, read elsewhere by "
            f"{sorted(set(escapes))[:3]}); DMP runs such a decode as one CPU custom layer"
        )
    return tail, finals[0]


def _levels(ctx: Lowering, srcs: list[Value]) -> list[tuple[int, int, int]] | None:
    """(W, H, stride) per level, the stride being the input size over the level size (None: not integral)."""
    _, _, in_h, in_w = ctx.graph.shape(ctx.graph.inputs[0])
    levels = []
    for s in srcs:
        w, h, _ = s.dims
        if in_w % w or in_h % h or in_w // w != in_h // h:
            return None
        levels.append((w, h, in_w // w))
    return levels


def _computes_decode(
    graph: Graph, op: Op, tail: list[Op], final: str, levels: list[tuple[int, int, int]], reg_max: int
) -> bool:
    name = op.outputs[0]
    x = np.random.default_rng(0).normal(0.0, 3.0, graph.shape(name)).astype(np.float32)
    sub = Graph("decode", graph.tensors, tail, [name], [final])
    try:
        got = interp.run(sub, {name: x})[final][0]
    except UserError:
        return False
    want = yolo_decode(x[0], levels, reg_max)
    return got.shape == want.shape and float(np.max(np.abs(got - want))) <= TOLERANCE * float(np.max(np.abs(want)))
