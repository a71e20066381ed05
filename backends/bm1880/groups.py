"""BM1880 layer groups on the shared pass (passes/lowering/layer_group.py), and each group's local-memory plan.

The shared pass forms the groups over the lowered layers (a target-neutral greedy: a run of joinable layers
whose only tensor leaving it is the last one's output; residual blocks close at their add); this module says
which layers may join and plans a group's 64 KiB lane for a tile size:

- weights at the bottom: with `layer-group-weight` every layer's weights stay resident for the whole group;
  with `layer-group` all layers share one region and each tile reloads them (less local memory, more DDR);
- slots above: one per tensor the tile holds, first-fit, alive from the layer that fills it (its producer, or
  a load from the neuron area before its first reader) to its last reader, sized for the tallest tile. Conv,
  depthwise and pooling BDs read their input with shape-derived strides, so they must read a slot holding
  exactly their rows; activations and eltwise read explicit strides and may read a sub-view. A group input
  read with different rows by two such exact readers gets a slot per distinct read;
- scratch: a layer's temporaries (eltwise 16-bit products, the two halves of a leaky/PReLU), freed after it.

A lone layer is a group of one; a conv whose weights do not fit even one row at a time is split by output
channels (multiples of 32 lanes). Concat is always a unit of its own (tile copies through local memory).
`opt`: "none" = every layer alone; "layer-group" = groups, weights per tile; "layer-group-weight" = groups,
weights resident (BMNet's BM_OPT_NONE / LAYER_GROUP / LAYER_GROUP_WITH_WEIGHT_OPT).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from npuc.compiler.allocator import FreeList
from npuc.compiler.errors import UnsupportedError, UserError
from npuc.passes.lowering.layer_group import SAME_ROWS, LayerGroup, Rows, RowWindow, Tile, form_groups, make_group

from . import isa
from .emit import align, lane_blocks, tile_bytes
from .kernels import lut_table, work_bytes
from .quantize import Layer, LoweredNet

OPT_LEVELS = ("none", "layer-group", "layer-group-weight")
JOIN_KINDS = frozenset({"conv", "dwconv", "pool", "act", "eltwise", "lut"})
WINDOW_KINDS = frozenset({"conv", "dwconv", "pool"})  # BDs that read shape-derived strides
LONE_KINDS = frozenset({"concat", "copy", "upsample", "interleave", "mul"})
RESIDENT_SHARE = 2  # a layer's weights may take at most 1/RESIDENT_SHARE of a lane to join a group


# ---------------------------------------------------------------------------------------------------------
# the lowered net as the shared pass sees it


@dataclass(frozen=True)
class _Activation:
    is_const: bool = False


class _Activations(Mapping):
    """Every tensor of a net as a non-constant activation, read through its shape table (views are made per
    layer: copying the table each time made deep nets quadratic, 54 s of a 5000-layer chain)."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self._shapes = shapes

    def __getitem__(self, name: str) -> _Activation:
        if name not in self._shapes:
            raise KeyError(name)
        return _ACTIVATION

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)


_ACTIVATION = _Activation()


@dataclass(frozen=True)
class NetView:
    """The graph interface of passes/lowering/layer_group.py over a LoweredNet: 4-D shapes, no constants."""

    net: LoweredNet
    tensors: Mapping[str, _Activation] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", _Activations(self.net.shapes))

    def shape(self, name: str) -> tuple[int, int, int, int]:
        return self.net.shapes[name]


def layer_window(view: NetView, layer: Layer) -> RowWindow:
    if layer.kind not in WINDOW_KINDS:
        return SAME_ROWS
    return RowWindow(layer.kernel[0], layer.strides[0], layer.dilations[0], layer.pads[0])


def edge_pads(net: LoweredNet, layer: Layer, out_rows: Rows) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) padding of a window layer computing `out_rows`: rows only at the edges."""
    if layer.kind not in WINDOW_KINDS:
        return (0, 0, 0, 0)
    start, end = layer_window(NetView(net), layer).reads(out_rows)
    h_in = net.shapes[layer.inputs[0]][2]
    return (max(0, -start), max(0, end - h_in), layer.pads[2], layer.pads[3])


# ---------------------------------------------------------------------------------------------------------
# weights in local memory


def weight_lane_bytes(layer: Layer, oc: int) -> int:
    """Local bytes per lane of a layer's weights and bias (for `oc` output channels)."""
    if layer.weight is None:
        return 0
    bias = 2 * lane_blocks(oc) if layer.bias is not None else 0
    gains = lane_blocks(oc) * isa.EU_NUM if layer.gains is not None else 0
    if layer.kind == "conv":
        _, ic, kh, kw = layer.weight.shape
        return align(lane_blocks(oc) * kh * kw * ic) + align(bias) + gains
    if layer.kind == "dwconv":
        return align(lane_blocks(oc) * align(layer.kernel[0] * layer.kernel[1])) + align(bias) + gains
    if layer.kind == "lut":
        return lut_table(0).lane_bytes  # the table, whole in every lane
    return lane_blocks(oc) * isa.EU_NUM  # prelu slopes, EU-aligned (1, c, 1, 1)


# ---------------------------------------------------------------------------------------------------------
# the local plan of one group


@dataclass
class Slot:
    """Local room for one tensor of a tile: a layer's output, a load of a group input, or a copy of some rows
    of another slot (`source`) for a reader that needs shape-derived strides."""

    tensor: str
    readers: list[tuple[int, int]]  # (layer index, input index)
    start: int  # layer index that fills it
    end: int  # layer index of its last reader
    loaded: bool
    addr: int = 0
    source: Slot | None = None

    @property
    def early(self) -> bool:
        """Filled just before its first reader runs (a load or a copy), not by a producer."""
        return self.loaded or self.source is not None

    def rows(self, group: LayerGroup, tile: Tile) -> Rows:
        if not self.early:
            return tile.rows[self.tensor]
        spans = [tile.reads[(group.ops[k].name, i)].rows for k, i in self.readers]
        return min(s[0] for s in spans), max(s[1] for s in spans)


@dataclass
class Unit:
    """What the program runs in one go: a group (maybe of one layer) with its plan, or a lone concat."""

    group: LayerGroup
    oc_range: tuple[int, int] | None = None  # output-channel chunk of a lone conv
    resident: bool = True
    tiles: list[Tile] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)  # per layer: lane address of its weights
    slots: list[Slot] = field(default_factory=list)
    slot_of: dict[tuple[int, int], Slot] = field(default_factory=dict)
    out_slot: dict[int, Slot] = field(default_factory=dict)
    scratch: dict[int, int] = field(default_factory=dict)  # layer index -> lane address of its temporaries

    @property
    def layers(self) -> list[Layer]:
        return self.group.ops

    def channels(self, net: LoweredNet, k: int) -> int:
        """Output channels layer k computes (the chunk, for the last layer of a split conv)."""
        if self.oc_range is not None and k == len(self.layers) - 1:
            return self.oc_range[1] - self.oc_range[0]
        return net.shapes[self.layers[k].output][1]


def _exact(layer: Layer) -> bool:
    return layer.kind in WINDOW_KINDS


def _slots(unit: Unit) -> None:
    """Slots and who reads which. A tensor made inside holds the union of its readers' rows; a conv or pool
    that reads fewer of them (a 3x3 s2 conv beside a 1x1 s2 conv) gets a copy of just its rows."""
    ops, tiles = unit.layers, unit.tiles
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, layer in enumerate(ops):
        for i, name in enumerate(layer.inputs):
            readers.setdefault(name, []).append((k, i))

    def read(t: Tile, key: tuple[int, int]) -> Rows:
        return t.reads[(ops[key[0]].name, key[1])].rows

    for k, layer in enumerate(ops):
        mine = readers.get(layer.output, []) if k < len(ops) - 1 else []
        slot = Slot(layer.output, mine, k, max([k, *(r[0] for r in mine)]), loaded=False)
        for key in mine:
            unit.slot_of[key] = slot
            if _exact(ops[key[0]]) and any(read(t, key) != t.rows[layer.output] for t in tiles):
                copy = Slot(layer.output, [key], key[0], key[0], loaded=False, source=slot)
                unit.slots.append(copy)
                unit.slot_of[key] = copy
        unit.slots.append(slot)
        unit.out_slot[k] = slot
    for name in unit.group.inputs:
        homes: list[Slot] = []
        for key in sorted(readers[name], key=lambda kk: not _exact(ops[kk[0]])):  # exact readers first
            home = next((cand for cand in homes if _serves(unit, cand, key)), None)
            if home is None:
                home = Slot(name, [], key[0], key[0], loaded=True)
                homes.append(home)
                unit.slots.append(home)
            home.readers.append(key)
            home.start, home.end = min(home.start, key[0]), max(home.end, key[0])
            unit.slot_of[key] = home


def _inside(rows: Rows, held: Rows) -> bool:
    return held[0] <= rows[0] and rows[1] <= held[1]


def _serves(unit: Unit, slot: Slot, key: tuple[int, int]) -> bool:
    """Can a loaded slot serve reader `key` in every tile: the same rows (exact reader) or a superset."""
    ops = unit.layers

    def read(t: Tile, k: tuple[int, int]) -> Rows:
        return t.reads[(ops[k[0]].name, k[1])].rows

    if _exact(ops[key[0]]):
        return all(read(t, slot.readers[0]) == read(t, key) for t in unit.tiles)
    return all(_inside(read(t, key), slot.rows(unit.group, t)) for t in unit.tiles)


def plan_unit(net: LoweredNet, unit: Unit, rows: int, batch_step: int) -> bool:
    """Fill in the unit's tiles, weight bases, slots and scratch for tiles of `rows` output rows and
    `batch_step` items; False if they do not fit a lane."""
    view = NetView(net)
    unit.tiles = list(unit.group.tiles(view, rows, batch_step))
    unit.slots, unit.slot_of, unit.out_slot, unit.scratch = [], {}, {}, {}
    _slots(unit)
    layers = unit.layers
    sizes = [align(weight_lane_bytes(layer, unit.channels(net, k))) for k, layer in enumerate(layers)]
    if unit.resident:
        unit.weights = [sum(sizes[:k]) for k in range(len(sizes))]
        base = sum(sizes)
    else:
        unit.weights, base = [0] * len(sizes), max(sizes)
    if base > isa.LMEM_SIZE:
        return False

    def slot_bytes(slot: Slot, c: int) -> int:
        _, _, _, w = net.shapes[slot.tensor]
        tallest = max(r[1] - r[0] for r in (slot.rows(unit.group, t) for t in unit.tiles))
        return tile_bytes((batch_step, c, tallest, w))

    size = {id(s): slot_bytes(s, net.shapes[s.tensor][1]) for s in unit.slots}
    for k in range(len(layers)):
        size[id(unit.out_slot[k])] = slot_bytes(unit.out_slot[k], unit.channels(net, k))
    free = FreeList(base, isa.EU_NUM)
    for k, layer in enumerate(layers):
        for s in unit.slots:
            if s.early and s.start == k:
                s.addr = free.alloc(size[id(s)])
        out = unit.out_slot[k]
        out.addr = free.alloc(size[id(out)])
        work = work_bytes(layer, size[id(out)])
        unit.scratch[k] = free.alloc(work) if work else 0
        if free.top > isa.LMEM_SIZE:
            return False
        if work:
            free.release(unit.scratch[k], work)
        for s in unit.slots:
            if s.end == k and not (s is out and k == len(layers) - 1):
                free.release(s.addr, size[id(s)])
    return True


def fit_unit(net: LoweredNet, unit: Unit) -> int:
    """Plan the unit with the fewest tiles that fit: whole items (as many per tile as fit), else the most
    rows per tile; returns the rows (0 if even one row does not fit). The unit keeps the chosen plan."""
    n, _, h, _ = net.shapes[unit.group.output]
    for step in range(n, 0, -1):
        if plan_unit(net, unit, h, step):
            unit.group.rows, unit.group.batch_step = h, step
            return h
    lo, hi = 0, h - 1
    while lo < hi:  # largest rows that fit (local memory grows with the rows)
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if plan_unit(net, unit, mid, 1) else (lo, mid - 1)
    if lo == 0 or not plan_unit(net, unit, lo, 1):
        return 0
    unit.group.rows, unit.group.batch_step = lo, 1
    return lo


# ---------------------------------------------------------------------------------------------------------
# forming the units


def _pinned(net: LoweredNet) -> set[str]:
    """Tensors that must reach the neuron area: outputs, and those read under another name (reshapes)."""
    pinned = {net.storage[t] for t in net.outputs}
    for layer in net.layers:
        pinned |= {net.storage[n] for n in layer.inputs if net.storage[n] != n}
    return pinned


def _can_join(net: LoweredNet, layer: Layer) -> bool:
    if layer.kind not in JOIN_KINDS:
        return False
    oc = net.shapes[layer.output][1]
    return oc <= isa.BD_MAX_CHANNELS and weight_lane_bytes(layer, oc) <= isa.LMEM_SIZE // RESIDENT_SHARE


def _lone(net: LoweredNet, layer: Layer) -> list[Unit]:
    """A one-layer unit (its weights loaded once), split by output channels when a conv's weights do not fit."""
    view = NetView(net)
    group = make_group(view, [layer], layer_window)
    if layer.kind in LONE_KINDS:  # emitted whole by codegen (concat) or moves.py, tiled there
        return [Unit(group)]
    unit = Unit(group)
    oc = net.shapes[layer.output][1]
    if oc <= isa.BD_MAX_CHANNELS and fit_unit(net, unit):
        return [unit]
    if layer.kind == "conv":  # the chunk that reads the input the fewest times over all chunks (one BD's width)
        best: tuple[int, int, Unit] | None = None
        widest = min((oc - 1) // isa.NPU_NUM, isa.BD_MAX_CHANNELS // isa.NPU_NUM) * isa.NPU_NUM
        for chunk in range(widest, 0, -isa.NPU_NUM):
            trial = Unit(make_group(view, [layer], layer_window), (0, chunk))
            if fit_unit(net, trial):
                cost = -(-oc // chunk) * loaded_bytes(net, trial)
                best = best if best is not None and best[0] <= cost else (cost, chunk, trial)
        if best is not None:
            _, chunk, trial = best
            units = []
            for c0 in range(0, oc, chunk):
                part = Unit(make_group(view, [layer], layer_window), (c0, min(c0 + chunk, oc)))
                plan_unit(net, part, trial.group.rows, trial.group.batch_step)  # a smaller last chunk fits too
                part.group.rows, part.group.batch_step = trial.group.rows, trial.group.batch_step
                units.append(part)
            return units
    if oc > isa.BD_MAX_CHANNELS:
        raise UnsupportedError(f"layer '{layer.name}' ({layer.kind}) has {oc} channels; a BM1880 BD takes at most "
                               f"{isa.BD_MAX_CHANNELS} (split the tensor along its channels in the model)")  # fmt: skip
    raise UnsupportedError(
        f"layer '{layer.name}' ({layer.kind}) does not fit the BM1880 local memory even one row at a time"
    )


def loaded_bytes(net: LoweredNet, unit: Unit) -> int:
    """Bytes a planned unit loads from the neuron area over all its tiles (halos counted every time)."""
    total = 0
    for tile in unit.tiles:
        for slot in (s for s in unit.slots if s.loaded):
            r0, r1 = slot.rows(unit.group, tile)
            _, c, _, w = net.shapes[slot.tensor]
            total += tile.count * c * (r1 - r0) * w
    return total


def _reloads_pay(net: LoweredNet, unit: Unit) -> bool:
    """Weights reloaded every tile (layer-group) cost less DDR than the activation round trips saved."""
    weights = sum(layer.weight.size + (2 * layer.bias.size if layer.bias is not None else 0)
                  for layer in unit.layers if layer.weight is not None)  # fmt: skip
    saved = 2 * sum(int(np.prod(net.shapes[name])) for name in unit.group.internal)
    return (len(unit.tiles) - 1) * weights <= saved


def form_units(net: LoweredNet, opt: str) -> list[Unit]:
    """The program's units in order: shared-pass layer groups (opt != none) and lone layers."""
    if opt not in OPT_LEVELS:
        raise UserError(f"--opt {opt!r} is not one of {', '.join(OPT_LEVELS)}")
    resident = opt != "layer-group"
    view = NetView(net)

    def rows_that_fit(group: LayerGroup, hint: int | None) -> int:  # fit_unit's search is its own: no hint
        unit = Unit(group, resident=resident)
        rows = fit_unit(net, unit)
        return rows if resident or _reloads_pay(net, unit) else 0

    if opt == "none":
        parts = list(net.layers)
    else:
        parts = form_groups(
            view, net.layers, lambda layer: _can_join(net, layer), rows_that_fit, _pinned(net), layer_window
        )
    units: list[Unit] = []
    for part in parts:
        if isinstance(part, LayerGroup):
            unit = Unit(part, resident=resident)
            plan_unit(net, unit, part.rows, part.batch_step)
            units.append(unit)
        else:
            units.extend(_lone(net, part))
    return units
