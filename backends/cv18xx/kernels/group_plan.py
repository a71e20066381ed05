"""The local-memory plan of a CV18xx layer group, and the tile height at which one fits.

`layer_groups` has passes/lowering/layer_group.py form the groups, told which ops may join (group_ops.can_join)
and how many output rows per tile fit (`rows_that_fit`); it gives each tile's rows. The plan lays out a lane:

- resident: every op's constants (filters, per-channel records, lookup tables), loaded once per group at the
  bottom of each lane;
- slots: one per tensor the tile holds, first-fit above the residents, alive from the op that fills it (its
  producer, or a load from gmem before its first reader) to its last reader; every tile uses the same
  addresses, sized for the tallest tile. A group input read by ops that need different rows (a 3x3 conv and
  the residual add) gets a slot per distinct read; a tensor made inside the group holds the union of its
  readers' rows, so an op that derives strides from the shape (conv, pool, lookup) must read all of it, or
  (a conv) its leading rows (group_ops.serves);
- scratch: the temporaries an op asks for (the int16 high plane of an int8 add), freed right after it.

A group whose output is one tile (every row at once, batch 1) whose constants do not all fit may stream its
convs' filters instead (`streamed`, group_stream.py): each conv's filters pass through two chunk buffers,
taken while the op before it runs (so the first chunk loads under that op's compute) and freed after it.

The formation cuts a group whose recomputed halo rows cost more than the DDR traffic it saves, priced by
group_cost.unit_cycles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from npuc.backends.cv18xx.codegen import Codegen
from npuc.backends.cv18xx.kernels.group_cost import pipelined_cycles, tile_costs, unit_cycles
from npuc.backends.cv18xx.kernels.group_ops import (
    LOCAL_FMT,
    LOCAL_KERNELS,
    can_join,
    needs_exact_rows,
    resident_fits,
    serves,
)
from npuc.backends.cv18xx.kernels.group_stream import ConvStream, conv_stream, streamed_resident
from npuc.backends.cv18xx.kernels.tiling import largest_fit
from npuc.backends.cv18xx.lmem import Resident, local_bytes
from npuc.compiler.allocator import FreeList
from npuc.compiler.ir import Op
from npuc.passes.lowering.chain_order import chain_order
from npuc.passes.lowering.layer_group import LayerGroup, Read, Rows, Tile, form_groups


@dataclass
class Slot:
    """A place in every lane for one tensor the tile holds, from the op that fills it to its last reader."""

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
class Plan:
    """Where each resident, slot and temporary of a group sits in a lane, for tiles of one height."""

    tiles: list[Tile]
    resident: list[list[int]]  # per op: the lane address of each resident
    slots: list[Slot]
    slot_of: dict[tuple[int, int], Slot] = field(default_factory=dict)  # (op index, input index) -> slot
    out_slot: dict[int, Slot] = field(default_factory=dict)  # op index -> the slot its output fills
    scratch: dict[int, list[int]] = field(default_factory=dict)  # op index -> temporaries' addresses
    peak: int = 0  # bytes per lane the plan uses, from address 0
    double: bool = False  # group inputs and output have two copies (tiles alternate)
    streams: dict[int, tuple[ConvStream, int]] = field(default_factory=dict)  # op index -> its chunk buffers

    def shift(self, by: int) -> None:
        """Move every address up by `by` bytes."""
        self.resident = [[a + by for a in addrs] for addrs in self.resident]
        for s in self.slots:
            s.addr += by
        self.scratch = {k: [a + by for a in addrs] for k, addrs in self.scratch.items()}
        self.streams = {k: (stream, a + by) for k, (stream, a) in self.streams.items()}


def _slots(cg: Codegen, group: LayerGroup, tiles: list[Tile]) -> tuple[list[Slot], dict, dict] | None:
    """The group's slots; None when a tensor made inside cannot serve all its readers from one copy."""
    ops = group.ops
    slots: list[Slot] = []
    slot_of: dict[tuple[int, int], Slot] = {}
    out_slot: dict[int, Slot] = {}
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, op in enumerate(ops):
        for i, name in enumerate(op.inputs):
            if name and not cg.graph.tensors[name].is_const:
                readers.setdefault(name, []).append((k, i))

    def read(t: Tile, key: tuple[int, int]) -> Read:
        return t.reads[(ops[key[0]].name, key[1])]

    def all_served(keys: list[tuple[int, int]], held: Callable[[Tile], Rows]) -> bool:
        return all(serves(ops[key[0]], read(t, key), held(t)) for t in tiles for key in keys)

    for k, op in enumerate(ops):
        name = op.outputs[0]
        mine = readers.get(name, [])
        slot = Slot(name, mine, k, max([k, *(r[0] for r in mine)]), loaded=False)
        if not all_served(mine, lambda t, name=name: t.rows[name]):
            return None
        slot_of.update((key, slot) for key in mine)
        slots.append(slot)
        out_slot[k] = slot
    for name in group.inputs:
        mine: list[Slot] = []
        keys = readers[name]
        for key in sorted(keys, key=lambda kk: not needs_exact_rows(ops[kk[0]])):  # exact readers first
            exact = needs_exact_rows(ops[key[0]])
            home = None
            for cand in mine:
                if exact:  # the slot grows to hold both, if each exact reader still reads it
                    grown = lambda t, cand=cand, key=key: _union(cand.rows(group, t), read(t, key).rows)  # noqa: E731
                    fits = all_served([*cand.readers, key], grown)
                else:
                    fits = all_served([key], lambda t, cand=cand: cand.rows(group, t))
                if fits:
                    home = cand
                    break
            if home is None:
                home = Slot(name, [], key[0], key[0], loaded=True)
                mine.append(home)
                slots.append(home)
            home.readers.append(key)
            home.start, home.end = min(home.start, key[0]), max(home.end, key[0])
            slot_of[key] = home
    return slots, slot_of, out_slot


def _union(a: Rows, b: Rows) -> Rows:
    return min(a[0], b[0]), max(a[1], b[1])


def _slot_bytes(cg: Codegen, group: LayerGroup, slot: Slot, tiles: list[Tile]) -> int:
    _, c, _, w = cg.graph.shape(slot.tensor)
    fmt = LOCAL_FMT[cg.fmt[slot.tensor]]
    tallest = max(r[1] - r[0] for r in (slot.rows(group, t) for t in tiles))
    return local_bytes(cg.chip, (1, c, tallest, w), fmt)


def residents(cg: Codegen, op: Op, streamed: bool) -> list[Resident]:
    """The constants `op` keeps in local memory for the whole group (a streamed conv: its records only)."""
    return streamed_resident(cg, op) if streamed else LOCAL_KERNELS[op.kind].resident(cg, op)


def plan_group(cg: Codegen, group: LayerGroup, rows: int, double: bool = False, streamed: bool = False
               ) -> Plan | None:  # fmt: skip
    """Addresses of every resident, slot and temporary for tiles of `rows` output rows; None if they don't fit.

    With `double`, the slots the TDMA fills (group inputs) and drains (the group output) get two copies. With
    `streamed` (one tile only), convs stream their filters (module docstring). With cg.top_aligned the whole
    layout moves up against the top of the lane: consecutive units alternate, so a group's resident loads land
    where the unit before it is not working and run under its compute."""
    chip = cg.chip
    tiles = list(group.tiles(cg.graph, rows))
    if streamed and len(tiles) != 1:
        return None
    made = _slots(cg, group, tiles)
    if made is None:
        return None
    slots, slot_of, out_slot = made
    plan = Plan(tiles, [], slots, slot_of, out_slot, double=double)
    streams = {k: st for k, op in enumerate(group.ops) if streamed and (st := conv_stream(cg, op)) is not None}
    if not all(k in streams or resident_fits(cg, op) for k, op in enumerate(group.ops)):
        return None

    top = 0
    for k, op in enumerate(group.ops):
        addrs = []
        for r in residents(cg, op, k in streams):
            size = local_bytes(chip, r.shape, r.fmt, r.eu_align)
            addrs.append(top)
            top += size
        plan.resident.append(addrs)
    base = top
    free = FreeList()
    sizes = {id(s): _slot_bytes(cg, group, s, tiles) for s in slots}
    last = out_slot[len(group.ops) - 1]
    copies = {id(s): 2 if double and (s.loaded or s is last) else 1 for s in slots}

    def take(s: Slot) -> None:
        size = sizes[id(s)] * copies[id(s)]
        s.addr = base + free.alloc(size)
        s.copy_stride = sizes[id(s)] if copies[id(s)] == 2 else 0

    def give(s: Slot) -> None:
        size = sizes[id(s)] * copies[id(s)]
        free.release(s.addr - base, size)

    def stream_bytes(k: int) -> int:
        return streams[k].set_bytes(cg) * streams[k].copies()

    def take_stream(k: int) -> None:
        if k in streams:
            plan.streams[k] = (streams[k], base + free.alloc(stream_bytes(k)))

    # Double-buffered slots are placed before the tile's first op and live through it: the next tile's inputs
    # are prefetched into them while this tile runs, and the last tile's output drains from them.
    pinned = [s for s in slots if copies[id(s)] == 2]
    for s in pinned:
        take(s)
    take_stream(0)
    for k, op in enumerate(group.ops):
        for s in slots:
            if s.loaded and s.start == k and s not in pinned:
                take(s)
        out = out_slot[k]
        if out not in pinned:
            take(out)
        temps = [free.alloc(sizes[id(out)]) for _ in range(LOCAL_KERNELS[op.kind].scratch(op))]
        plan.scratch[k] = [base + t for t in temps]
        take_stream(k + 1)  # the next conv's first chunk loads while this op computes
        plan.peak = max(plan.peak, base + free.top)
        if plan.peak > chip.lmem_size:
            return None
        for t in temps:
            free.release(t, sizes[id(out)])
        for s in slots:
            if s.end == k and s not in pinned and not (s is out and k == len(group.ops) - 1):
                give(s)
        if k in streams:
            free.release(plan.streams[k][1] - base, stream_bytes(k))
    if cg.top_aligned:
        plan.shift(chip.lmem_size - plan.peak)
    return plan


def best_plan(cg: Codegen, group: LayerGroup) -> Plan | None:
    """Double-buffered when that costs no extra tiles, else single, else (one tile) streamed. (Shorter tiles to
    make room for two copies were measured on resnet18_224: the halo rows they recompute and reload cost more
    than the overlap gains, so the group keeps the tile height it was formed with.)"""
    return (
        plan_group(cg, group, group.rows, double=True)
        or plan_group(cg, group, group.rows)
        or plan_group(cg, group, group.rows, streamed=True)
    )


def rows_that_fit(cg: Codegen, group: LayerGroup, hint: int | None = None) -> int:
    """The tallest tile whose plan fits; all the rows at once if a streamed plan fits them (one tile: no halo
    recomputed, no filter loaded twice), even where resident constants would need shorter tiles. `hint`: where
    the search looks first (tiling.largest_fit)."""
    height = cg.graph.shape(group.output)[2]
    rows = largest_fit(height, lambda rows: plan_group(cg, group, rows) is not None, hint)
    if rows < height and plan_group(cg, group, height, streamed=True) is not None:  # None unless one tile
        return height
    return rows


def layer_groups(cg: Codegen, ops: list[Op], pinned: set[str], cut: bool = True) -> list[Op | LayerGroup]:
    """The groups of `ops` in their order or in chain order (passes/lowering/chain_order.py), whichever costs
    fewer cycles: each group as long as it fits, then (`cut`) cut where its pieces cost fewer cycles and tiled
    at the height that costs fewest (`tile_height`). Chain order lets the branches an exporter interleaved
    form groups: YOLOv8n cv183x 3.21 -> 2.96 M cycles, 21.7 -> 17.2 MB DDR; PicoDet 11.7 -> 9.0 M, 94 -> 51 MB."""
    chained = chain_order(ops)
    options = [ops] if chained == ops else [ops, chained]
    grouped = [_grouped(cg, order, pinned, cut) for order in options]
    # ops that cannot join a group stand alone in either order: the groupable units make the difference
    prices = [sum(unit_cycles(cg, u) for u in units if isinstance(u, LayerGroup) or joins(cg, u)) for units in grouped]
    return grouped[prices.index(min(prices))]


def _grouped(cg: Codegen, ops: list[Op], pinned: set[str], cut: bool) -> list[Op | LayerGroup]:
    cost = (lambda unit: unit_cycles(cg, unit)) if cut else None
    units = form_groups(
        cg.graph, ops, lambda op: joins(cg, op), lambda g, hint: rows_that_fit(cg, g, hint), pinned, cost=cost
    )
    for unit in units if cut else ():
        if isinstance(unit, LayerGroup):
            unit.rows = tile_height(cg, unit)
    return units


def tile_height(cg: Codegen, group: LayerGroup) -> int:
    """The group's tile height: the tallest that fits, or shorter tiles whose inputs and output have two copies
    when that is cheaper. One copy of a tile's input serialises its load with the compute (the slot is reused
    by the tile's own ops; a one-tile group waits for all of its input); two let the next tile's load run under
    this tile's compute, for more tiles and the halo rows they recompute (group_cost.pipelined_cycles against
    the tiles' plain sum). PP-LCNet (cv183x): its stem group 26 -> 11 rows, 422,595 -> 411,357 cycles."""
    rows = group.rows
    double_fits = lambda r: plan_group(cg, group, r, double=True) is not None  # noqa: E731
    if len(list(group.tiles(cg.graph, rows))) > 1 and double_fits(rows):
        return rows
    shorter = largest_fit(rows - 1, double_fits)
    single = sum(tiu + tdma for tiu, tdma in tile_costs(cg, group, rows))
    return shorter if shorter and pipelined_cycles(tile_costs(cg, group, shorter)) < single else rows


def joins(cg: Codegen, op: Op) -> bool:
    """May `op` join a group: its local kernel takes it, and its constants stay resident or (a conv) stream."""
    return can_join(cg, op) and (resident_fits(cg, op) or conv_stream(cg, op) is not None)
