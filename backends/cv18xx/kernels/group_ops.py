"""An op's part in a CV18xx layer group: whether it may join one, the constants it keeps resident in local memory,
the scratch tiles it asks for, and the TIU ops it emits on one local tile (`LOCAL_KERNELS`, one `LocalKernel` per
op kind: conv, pool, eltwise, activation, PReLU). Each runs the same TIU ops as its stand-alone kernel, on local
tiles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from npuc.backends.cv18xx import tiu
from npuc.backends.cv18xx.codegen import Codegen, fused_relu, quant_of
from npuc.backends.cv18xx.kernels.conv import ConvParams, check_window, conv_weights
from npuc.backends.cv18xx.kernels.elementwise import (
    ELTWISE_KINDS,
    compute_eltwise,
    compute_relu_like,
    eltwise_scratch,
    relu_like_ok,
)
from npuc.backends.cv18xx.kernels.lut import lookup, replicated_table, table_shape
from npuc.backends.cv18xx.kernels.pool import borders, check_pool, pool_geometry, pool_tile
from npuc.backends.cv18xx.kernels.prelu import compute_prelu
from npuc.backends.cv18xx.kernels.prelu import constants as prelu_constants
from npuc.backends.cv18xx.kernels.tiling import Geometry
from npuc.backends.cv18xx.lmem import LTensor, Resident, local_bytes
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op
from npuc.passes.lowering.layer_group import Read, Rows

LOCAL_FMT = {"int8": "i8", "bf16": "bf16"}
RESIDENT_SHARE = 2  # an op's constants may take at most 1/RESIDENT_SHARE of a lane to join a group


Emit = Callable[[Codegen, Op, LTensor, list[LTensor], list[Read], list[LTensor], Callable[[], LTensor]], None]


@dataclass(frozen=True)
class LocalKernel:
    """An op kind's part in a group: may it join, its constants, its temporaries, its TIU ops on one tile.
    `exact`: it reads its inputs with strides derived from their shape, so they must hold exactly its rows."""

    can_join: Callable[[Codegen, Op], bool]
    emit: Emit
    resident: Callable[[Codegen, Op], list[Resident]] = lambda cg, op: []
    scratch: Callable[[Op], int] = lambda op: 0
    exact: bool = True


def _hw(graph: Graph, name: str) -> tuple[int, int]:
    shape = graph.shape(name)
    return shape[2], shape[3]


def tile_window(g: Geometry, read: Read) -> tiu.Window:
    """The tile's window: the rows' padding from the read, the columns' from the whole layer."""
    left = g.pads[1]
    need_w = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1
    top, bottom = read.pads
    return tiu.Window(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, (top, bottom, left, max(0, need_w - g.iw - left)))


# --- conv ------------------------------------------------------------------------------------------------


def conv_geometry(cg: Codegen, op: Op) -> Geometry:
    w = cg.graph.tensors[op.inputs[1]].shape
    (ih, iw), (oh, ow) = _hw(cg.graph, op.inputs[0]), _hw(cg.graph, op.outputs[0])
    return Geometry(w[2], w[3], *op.attrs.strides, *op.attrs.dilations, tuple(op.attrs.pads), ih, iw, oh, ow)


def _depthwise(cg: Codegen, op: Op) -> bool:
    w = cg.graph.tensors[op.inputs[1]].shape
    return op.attrs.group > 1 and op.attrs.group == cg.graph.shape(op.inputs[0])[1] == w[0] and w[1] == 1


def _conv_resident(cg: Codegen, op: Op) -> list[Resident]:
    bf16 = quant_of(op).mode == "bf16"
    fmt = "bf16" if bf16 else "i8"
    oc, icg, kh, kw = cg.graph.tensors[op.inputs[1]].shape
    depthwise = _depthwise(cg, op)
    filt = Resident(
        (1, oc, kh, kw) if depthwise else (1, oc, kh * kw, icg),
        fmt,
        depthwise,
        lambda: conv_weights(cg, op, bf16, depthwise).place(),
    )
    has_bias = len(op.inputs) > 2 and bool(op.inputs[2])
    if bf16 and not has_bias:
        return [filt]
    params = (2, oc, 1, 1) if bf16 else (1, oc, 1, 9 if has_bias else 5)
    return [filt, Resident(params, fmt, False, lambda: ConvParams(cg, op, oc, bf16).g)]


def _resident_bytes(cg: Codegen, op: Op) -> int:
    return sum(local_bytes(cg.chip, r.shape, r.fmt, r.eu_align) for r in LOCAL_KERNELS[op.kind].resident(cg, op))


def _conv_joins(cg: Codegen, op: Op) -> bool:
    if op.attrs.group != 1 and not _depthwise(cg, op):
        return False
    try:
        check_window(op, conv_geometry(cg, op))
    except UserError:
        return False  # the stand-alone kernel reports it
    return True


def resident_fits(cg: Codegen, op: Op) -> bool:
    """May `op`'s constants stay in local memory for a whole group (at most 1/RESIDENT_SHARE of a lane)?"""
    return _resident_bytes(cg, op) <= cg.chip.lmem_size // RESIDENT_SHARE


def _conv_emit(cg: Codegen, op: Op, out: LTensor, ins: list[LTensor], reads: list[Read], res: list[LTensor],
               new_tile: Callable[[], LTensor]) -> None:  # fmt: skip
    has_bias = len(op.inputs) > 2 and bool(op.inputs[2])
    relu, relu_max = fused_relu(op)
    win = tile_window(conv_geometry(cg, op), reads[0])
    params = res[1] if len(res) > 1 else None
    build = tiu.depthwise if _depthwise(cg, op) else tiu.conv
    cg.stream.tiu(build(out, ins[0], res[0], params, win, relu, has_bias))
    if relu_max is not None:
        cg.stream.tiu(tiu.minimum(out, out, relu_max))


# --- pool, eltwise, activation ---------------------------------------------------------------------------


def _pool_geometry(cg: Codegen, op: Op) -> Geometry:
    return pool_geometry(op, cg.graph.shape(op.inputs[0]), cg.graph.shape(op.outputs[0]))


def _pool_joins(cg: Codegen, op: Op) -> bool:
    try:
        check_pool(op, _pool_geometry(cg, op))
    except UserError:
        return False
    return op.attrs.mode in ("max", "avg")


def _pool_emit(cg: Codegen, op: Op, out: LTensor, ins: list[LTensor], reads: list[Read], res: list[LTensor],
               new_tile: Callable[[], LTensor]) -> None:  # fmt: skip
    g = _pool_geometry(cg, op)
    first_row = (reads[0].wanted[0] + g.pads[0]) // g.sh  # the read starts at first_row * stride - pad_top
    edges = borders(op, cg.graph.shape(op.inputs[0]), cg.graph.shape(op.outputs[0]))
    pool_tile(cg, op, op.attrs.mode, g, out, ins[0], tile_window(g, reads[0]), first_row, edges)


def _eltwise_joins(cg: Codegen, op: Op) -> bool:
    out = cg.graph.shape(op.outputs[0])
    same = all(not cg.graph.tensors[n].is_const and cg.graph.shape(n) == out for n in op.inputs)
    return op.attrs.kind in ELTWISE_KINDS and same and (op.attrs.kind != "mul" or len(op.inputs) == 2)


def _eltwise_emit(cg: Codegen, op: Op, out: LTensor, ins: list[LTensor], reads: list[Read], res: list[LTensor],
                  new_tile: Callable[[], LTensor]) -> None:  # fmt: skip
    compute_eltwise(cg, op, out, ins, new_tile)


def _is_lut(op: Op) -> bool:
    return quant_of(op).lut is not None


def _activation_joins(cg: Codegen, op: Op) -> bool:
    q = quant_of(op)
    return (q.mode == "int8" and _is_lut(op)) or (not _is_lut(op) and relu_like_ok(op))


def _activation_resident(cg: Codegen, op: Op) -> list[Resident]:
    if not _is_lut(op):
        return []
    table = replicated_table(cg.chip, quant_of(op).lut)
    return [Resident(table_shape(cg.chip), "i8", True, lambda: cg.weights.add(f"{op.name}_lut", table, "i8"))]


def _activation_scratch(op: Op) -> int:
    return int(not _is_lut(op) and op.attrs.act.kind == "leaky_relu")


def _activation_emit(cg: Codegen, op: Op, out: LTensor, ins: list[LTensor], reads: list[Read], res: list[LTensor],
                     new_tile: Callable[[], LTensor]) -> None:  # fmt: skip
    if _is_lut(op):
        cg.stream.tiu(lookup(cg.chip, out, ins[0], res[0]))
    else:
        compute_relu_like(cg, op, out, ins[0], new_tile)


def _prelu_joins(cg: Codegen, op: Op) -> bool:
    try:
        prelu_constants(cg, op)
    except UserError:
        return False  # the stand-alone kernel reports it
    return True


def _prelu_scratch(op: Op) -> int:
    return 1 if quant_of(op).mode == "bf16" else 2  # the negative half (+ the int8 high plane)


def _prelu_emit(cg: Codegen, op: Op, out: LTensor, ins: list[LTensor], reads: list[Read], res: list[LTensor],
                new_tile: Callable[[], LTensor]) -> None:  # fmt: skip
    compute_prelu(cg, op, out, ins[0], res, new_tile)


def _activation_exact(op: Op) -> bool:
    return _is_lut(op)


LOCAL_KERNELS: dict[str, LocalKernel] = {
    "conv2d": LocalKernel(_conv_joins, _conv_emit, _conv_resident),
    "pool2d": LocalKernel(_pool_joins, _pool_emit),
    "eltwise": LocalKernel(_eltwise_joins, _eltwise_emit, scratch=eltwise_scratch, exact=False),
    "activation": LocalKernel(_activation_joins, _activation_emit, _activation_resident, _activation_scratch),
    "prelu": LocalKernel(_prelu_joins, _prelu_emit, prelu_constants, _prelu_scratch, exact=False),
}


def serves(op: Op, read: Read, held: Rows) -> bool:
    """Can `op` read its input rows `read` from a slot holding rows `held`? An explicit-stride reader: any rows
    inside. A shape-derived one: exactly its rows, or (a conv) more rows after them, since the TIU stops at the
    output height and never reads past the last window, provided that window needs no padding below."""
    if not needs_exact_rows(op):
        return held[0] <= read.rows[0] and read.rows[1] <= held[1]
    if read.rows == held:
        return True
    return op.kind == "conv2d" and read.rows[0] == held[0] and read.rows[1] < held[1] and read.pads[1] == 0


def needs_exact_rows(op: Op) -> bool:
    """Does `op` read its inputs with strides derived from their shape (so a slot must hold exactly its rows)?"""
    # the lookup reads shape-derived strides; ReLU-like activations read explicit ones like eltwise
    return _activation_exact(op) if op.kind == "activation" else LOCAL_KERNELS[op.kind].exact


def can_join(cg: Codegen, op: Op) -> bool:
    lk = LOCAL_KERNELS.get(op.kind)
    q = getattr(op.attrs, "quant", None)
    if lk is None or q is None or q.mode not in LOCAL_FMT or len(op.outputs) != 1:
        return False
    tensors = [n for n in op.inputs if n and not cg.graph.tensors[n].is_const] + op.outputs
    if not tensors[:-1] or any(len(cg.graph.shape(n)) != 4 or cg.fmt.get(n) not in LOCAL_FMT for n in tensors):
        return False
    if len({cg.graph.shape(n)[0] for n in tensors}) != 1:
        return False
    return lk.can_join(cg, op)
