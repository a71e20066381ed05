"""Layer groups on the CV18xx: a run of conv / pool / eltwise / activation / PReLU ops computed in local memory.

passes/lowering/layer_group.py forms the groups and gives each tile's rows; here every op of a group gets a local
kernel (the same TIU ops as its stand-alone kernel, on local tiles), and the group a local-memory plan:

- resident: every op's constants (filters, per-channel records, lookup tables), loaded once per group at the
  bottom of each lane;
- slots: one per tensor the tile holds, first-fit above the residents, alive from the op that fills it (its
  producer, or a load from gmem before its first reader) to its last reader; every tile uses the same
  addresses, sized for the tallest tile. A group input read by ops that need different rows (a 3x3 conv and
  the residual add) gets a slot per distinct read; a tensor made inside the group holds the union of its
  readers' rows, so an op that derives strides from the shape (conv, pool, lookup) must read all of it;
- scratch: the temporaries an op asks for (the int16 high plane of an int8 add), freed right after it.

Only the group's output goes back to gmem, a tile at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, fused_relu, kernel, quant_of
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
from npuc.backends.cv18xx.kernels.tiling import Geometry, largest_fit, pipeline
from npuc.backends.cv18xx.lmem import GTensor, LTensor, Resident, local_bytes, local_strides
from npuc.compiler.allocator import FreeList
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op
from npuc.passes.lowering.layer_group import LayerGroup, Read, Rows, Tile, form_groups

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


def _tile_window(g: Geometry, read: Read) -> tiu.Window:
    """The tile's window: the rows' padding from the read, the columns' from the whole layer."""
    left = g.pads[1]
    need_w = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1
    top, bottom = read.pads
    return tiu.Window(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, (top, bottom, left, max(0, need_w - g.iw - left)))


# --- conv ------------------------------------------------------------------------------------------------


def _conv_geometry(cg: Codegen, op: Op) -> Geometry:
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
        check_window(op, _conv_geometry(cg, op))
    except UserError:
        return False  # the stand-alone kernel reports it
    return _resident_bytes(cg, op) <= cg.chip.lmem_size // RESIDENT_SHARE


def _conv_emit(cg: Codegen, op: Op, out: LTensor, ins: list[LTensor], reads: list[Read], res: list[LTensor],
               new_tile: Callable[[], LTensor]) -> None:  # fmt: skip
    has_bias = len(op.inputs) > 2 and bool(op.inputs[2])
    relu, relu_max = fused_relu(op)
    win = _tile_window(_conv_geometry(cg, op), reads[0])
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
    pool_tile(cg, op, op.attrs.mode, g, out, ins[0], _tile_window(g, reads[0]), first_row, edges)


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


def _exact(op: Op) -> bool:
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


# --- the local-memory plan of a group --------------------------------------------------------------------


@dataclass
class _Slot:
    tensor: str
    readers: list[tuple[int, int]]  # (op index, input index)
    start: int  # op index that fills it
    end: int  # op index of its last reader
    loaded: bool
    addr: int = 0
    copy_stride: int = 0  # bytes between the two copies of a double-buffered slot (0: one copy)

    def at(self, tile_index: int) -> int:
        """The copy tile `tile_index` uses: double-buffered slots alternate, so the next tile's transfer
        runs while this tile computes."""
        return self.addr + (tile_index % 2) * self.copy_stride

    def rows(self, group: LayerGroup, tile: Tile) -> Rows:
        if not self.loaded:
            return tile.rows[self.tensor]
        spans = [tile.reads[(group.ops[k].name, i)].rows for k, i in self.readers]
        return min(s[0] for s in spans), max(s[1] for s in spans)


@dataclass
class _Plan:
    tiles: list[Tile]
    resident: list[list[int]]  # per op: the lane address of each resident
    slots: list[_Slot]
    slot_of: dict[tuple[int, int], _Slot] = field(default_factory=dict)  # (op index, input index) -> slot
    out_slot: dict[int, _Slot] = field(default_factory=dict)  # op index -> the slot its output fills
    scratch: dict[int, list[int]] = field(default_factory=dict)  # op index -> temporaries' addresses
    peak: int = 0  # bytes per lane the plan uses, from address 0
    double: bool = False  # group inputs and output have two copies (tiles alternate)

    def shift(self, by: int) -> None:
        """Move every address up by `by` bytes."""
        self.resident = [[a + by for a in addrs] for addrs in self.resident]
        for s in self.slots:
            s.addr += by
        self.scratch = {k: [a + by for a in addrs] for k, addrs in self.scratch.items()}


def _local_tensor(cg: Codegen, name: str, rows: Rows, addr: int) -> LTensor:
    _, c, _, w = cg.graph.shape(name)
    shape = (1, c, rows[1] - rows[0], w)
    fmt = LOCAL_FMT[cg.fmt[name]]
    return LTensor(addr, shape, fmt, local_strides(cg.chip, shape, fmt))


def _view(cg: Codegen, slot: LTensor, held: Rows, rows: Rows) -> LTensor:
    """Rows `rows` of a slot holding `held`, with the slot's strides (only explicit-stride readers use it)."""
    if rows == held:
        return slot
    offset = (rows[0] - held[0]) * slot.strides[2]
    return LTensor(slot.addr + offset, (*slot.shape[:2], rows[1] - rows[0], slot.shape[3]), slot.fmt, slot.strides)


def _slots(cg: Codegen, group: LayerGroup, tiles: list[Tile]) -> tuple[list[_Slot], dict, dict] | None:
    """The group's slots; None when a tensor made inside cannot serve all its readers from one copy."""
    ops = group.ops
    slots: list[_Slot] = []
    slot_of: dict[tuple[int, int], _Slot] = {}
    out_slot: dict[int, _Slot] = {}
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, op in enumerate(ops):
        for i, name in enumerate(op.inputs):
            if name and not cg.graph.tensors[name].is_const:
                readers.setdefault(name, []).append((k, i))

    def read(t: Tile, key: tuple[int, int]) -> Rows:
        return t.reads[(ops[key[0]].name, key[1])].rows

    for k, op in enumerate(ops):
        name = op.outputs[0]
        mine = readers.get(name, [])
        slot = _Slot(name, mine, k, max([k, *(r[0] for r in mine)]), loaded=False)
        for key in mine:
            if _exact(ops[key[0]]) and any(read(t, key) != t.rows[name] for t in tiles):
                return None
            slot_of[key] = slot
        slots.append(slot)
        out_slot[k] = slot
    for name in group.inputs:
        mine: list[_Slot] = []
        keys = readers[name]
        for key in sorted(keys, key=lambda kk: not _exact(ops[kk[0]])):  # exact readers first
            exact = _exact(ops[key[0]])
            home = None
            for cand in mine:
                first = cand.readers[0]
                if exact and all(read(t, first) == read(t, key) for t in tiles):
                    home = cand
                elif not exact and all(_inside(read(t, key), cand.rows(group, t)) for t in tiles):
                    home = cand
                if home is not None:
                    break
            if home is None:
                home = _Slot(name, [], key[0], key[0], loaded=True)
                mine.append(home)
                slots.append(home)
            home.readers.append(key)
            home.start, home.end = min(home.start, key[0]), max(home.end, key[0])
            slot_of[key] = home
    return slots, slot_of, out_slot


def _inside(rows: Rows, held: Rows) -> bool:
    return held[0] <= rows[0] and rows[1] <= held[1]


def _slot_bytes(cg: Codegen, group: LayerGroup, slot: _Slot, tiles: list[Tile]) -> int:
    _, c, _, w = cg.graph.shape(slot.tensor)
    fmt = LOCAL_FMT[cg.fmt[slot.tensor]]
    tallest = max(r[1] - r[0] for r in (slot.rows(group, t) for t in tiles))
    return local_bytes(cg.chip, (1, c, tallest, w), fmt)


def plan_group(cg: Codegen, group: LayerGroup, rows: int, double: bool = False) -> _Plan | None:
    """Addresses of every resident, slot and temporary for tiles of `rows` output rows; None if they don't fit.

    With `double`, the slots the TDMA fills (group inputs) and drains (the group output) get two copies. With
    cg.top_aligned the whole layout moves up against the top of the lane: consecutive units alternate, so a
    group's resident loads land where the unit before it is not working and run under its compute."""
    chip = cg.chip
    tiles = list(group.tiles(cg.graph, rows))
    made = _slots(cg, group, tiles)
    if made is None:
        return None
    slots, slot_of, out_slot = made
    plan = _Plan(tiles, [], slots, slot_of, out_slot, double=double)

    top = 0
    for op in group.ops:
        addrs = []
        for r in LOCAL_KERNELS[op.kind].resident(cg, op):
            size = local_bytes(chip, r.shape, r.fmt, r.eu_align)
            addrs.append(top)
            top += size
        plan.resident.append(addrs)
    base = top
    free = FreeList()
    sizes = {id(s): _slot_bytes(cg, group, s, tiles) for s in slots}
    last = out_slot[len(group.ops) - 1]
    copies = {id(s): 2 if double and (s.loaded or s is last) else 1 for s in slots}

    def take(s: _Slot) -> None:
        size = sizes[id(s)] * copies[id(s)]
        s.addr = base + free.alloc(size)
        s.copy_stride = sizes[id(s)] if copies[id(s)] == 2 else 0

    def give(s: _Slot) -> None:
        size = sizes[id(s)] * copies[id(s)]
        free.release(s.addr - base, size)

    # Double-buffered slots are placed before the tile's first op and live through it: the next tile's inputs
    # are prefetched into them while this tile runs, and the last tile's output drains from them.
    pinned = [s for s in slots if copies[id(s)] == 2]
    for s in pinned:
        take(s)
    for k, op in enumerate(group.ops):
        for s in slots:
            if s.loaded and s.start == k and s not in pinned:
                take(s)
        out = out_slot[k]
        if out not in pinned:
            take(out)
        temps = [free.alloc(sizes[id(out)]) for _ in range(LOCAL_KERNELS[op.kind].scratch(op))]
        plan.scratch[k] = [base + t for t in temps]
        plan.peak = max(plan.peak, base + free.top)
        if plan.peak > chip.lmem_size:
            return None
        for t in temps:
            free.release(t, sizes[id(out)])
        for s in slots:
            if s.end == k and s not in pinned and not (s is out and k == len(group.ops) - 1):
                give(s)
    if cg.top_aligned:
        plan.shift(chip.lmem_size - plan.peak)
    return plan


def _best_plan(cg: Codegen, group: LayerGroup) -> _Plan | None:
    """Double-buffered when that costs no extra tiles, else single. (Shorter tiles to make room for two
    copies were measured on resnet18_224: the halo rows they recompute and reload cost more than the
    overlap gains, so the group keeps the tile height it was formed with.)"""
    return plan_group(cg, group, group.rows, double=True) or plan_group(cg, group, group.rows)


def rows_that_fit(cg: Codegen, group: LayerGroup) -> int:
    height = cg.graph.shape(group.output)[2]
    return largest_fit(height, lambda rows: plan_group(cg, group, rows) is not None)


def layer_groups(cg: Codegen, ops: list[Op], pinned: set[str]) -> list[Op | LayerGroup]:
    return form_groups(cg.graph, ops, lambda op: can_join(cg, op), lambda g: rows_that_fit(cg, g), pinned)


# --- emission --------------------------------------------------------------------------------------------


def _place(cg: Codegen, group: LayerGroup, plan: _Plan) -> None:
    """Shift the plan to where its first op's constants meet the oldest local data of the units before it
    (reorder.LastTouch), so their loads can run under that compute."""
    at = cg.chip.lmem_size - plan.peak if cg.top_aligned else 0  # where plan_group put it
    first = [
        (addr - at, addr - at + local_bytes(cg.chip, r.shape, r.fmt, r.eu_align))
        for r, addr in zip(LOCAL_KERNELS[group.ops[0].kind].resident(cg, group.ops[0]), plan.resident[0])
    ]
    touched = cg.stream.touched
    touched.update(cg.stream.records, len(cg.stream.records))
    plan.shift(touched.best_shift(first, plan.peak, cg.top_aligned) - at)


@kernel("layer_group")
def emit_group(cg: Codegen, group: LayerGroup) -> None:
    plan = _best_plan(cg, group)
    if plan is None:
        raise UserError(f"{group.name}: its tiles no longer fit {cg.chip.name} local memory")
    s = cg.stream
    _place(cg, group, plan)
    residents: list[list[LTensor]] = []
    sources: list[list[GTensor]] = []  # placed in the weight area in op order, loaded in load() below
    for op, addrs in zip(group.ops, plan.resident):
        mine = []
        for r, addr in zip(LOCAL_KERNELS[op.kind].resident(cg, op), addrs):
            mine.append(LTensor(addr, r.shape, r.fmt, local_strides(cg.chip, r.shape, r.fmt, r.eu_align)))
        residents.append(mine)
        sources.append([r.source() for r in LOCAL_KERNELS[op.kind].resident(cg, op)])

    def load_residents(ops: range) -> None:
        for k in ops:
            for src, lt in zip(sources[k], residents[k]):
                dma.load(s, src, lt)

    def loaded(j: int) -> dict[int, tuple[LTensor, Rows]]:
        """Tile j's group inputs: the slot copy each is loaded into, and the rows it holds."""
        tile, held = plan.tiles[j], {}
        for slot in plan.slots:
            if slot.loaded:
                rows = slot.rows(group, tile)
                held[id(slot)] = (_local_tensor(cg, slot.tensor, rows, slot.at(j)), rows)
        return held

    def load(j: int, at_op: int | None = None) -> None:
        """Load tile j's group inputs: all of them, or (at_op) those first read by op `at_op`. The first op's
        constants go before tile 0's inputs and the other ops' right after them: the TDMA runs its loads in
        order, so the first op starts as soon as its own operands are in while the rest stream in under it."""
        b, held = plan.tiles[j].batch, loaded(j)
        if j == 0 and at_op in (None, 0):
            load_residents(range(1))
        for slot in plan.slots:
            if slot.loaded and at_op in (None, slot.start):
                lt, rows = held[id(slot)]
                dma.load(s, cg.gtensor(slot.tensor).slice(n=(b, b + 1), h=rows), lt)
        if j == 0 and at_op in (None, 0):
            load_residents(range(1, len(group.ops)))

    def work(j: int) -> None:
        tile = plan.tiles[j]
        held = loaded(j)
        for k, op in enumerate(group.ops):
            if not plan.double:  # single copies: an input's slot may hold earlier temporaries until op k
                load(j, at_op=k)
            ins, reads = [], []
            for i, name in enumerate(op.inputs):
                if not name or cg.graph.tensors[name].is_const:
                    continue
                read = tile.reads[(op.name, i)]
                lt, rows = held[id(plan.slot_of[(k, i)])]
                ins.append(_view(cg, lt, rows, read.rows))
                reads.append(read)
            out_slot = plan.out_slot[k]
            rows = tile.rows[op.outputs[0]]
            out = _local_tensor(cg, op.outputs[0], rows, out_slot.at(j))
            held[id(out_slot)] = (out, rows)
            temps = iter(plan.scratch[k])

            def new_tile(out: LTensor = out, temps=temps) -> LTensor:
                return LTensor(next(temps), out.shape, out.fmt, out.strides)

            LOCAL_KERNELS[op.kind].emit(cg, op, out, ins, reads, residents[k], new_tile)
        last = held[id(plan.out_slot[len(group.ops) - 1])][0]
        b = tile.batch
        dma.store(s, last, cg.gtensor(group.output).slice(n=(b, b + 1), h=tile.rows[group.output]))

    if plan.double:
        pipeline(len(plan.tiles), 2, load, work)
    else:
        for j in range(len(plan.tiles)):
            work(j)
