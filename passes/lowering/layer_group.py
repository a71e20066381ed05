"""Layer groups: runs of ops whose intermediate tensors stay in on-chip memory, computed tile by tile.

A group is a contiguous run of the schedule with one tensor leaving it (its last op's output). The output is
produced in tiles of rows, one batch item at a time; walking the group backwards from a tile gives the rows
every tensor of the group must hold for it, halos included (a 3x3 conv reads one row more on each side).
Rows an earlier tile also needed are computed again: the price of never spilling to DDR.

Recomputed rows are not free: a deep group of 3x3 convs tiled into a few rows redoes much of its work. A target
that can price a unit (`cost`: a group at its tile height, or a plain op) has each greedy group cut where the
pieces cost less than the whole (`_cheapest_pieces`).

This module is target-neutral: the geometry (which input rows an op reads), the greedy formation and the cuts.
A target says which ops may join (`can_join`) and how many output rows per tile fit its local memory
(`rows_that_fit(group, hint)`, 0 when none do; `hint`, the rows the last group with an output as tall got, is
where its search may look first: the answer must not depend on it). A target whose op records are not IR ops
passes its own `window` (op -> RowWindow) and a graph view with `shape(name)` and `tensors[name].is_const`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from npuc.compiler.ir import Graph, Op

MAX_GROUP_OPS = 32  # longer runs buy little and make every tile's halo (and the search) grow

Rows = tuple[int, int]  # [start, stop) of the H axis


@dataclass(frozen=True)
class RowWindow:
    """How an op's output rows map to input rows: kernel, stride, dilation and top pad along H."""

    kernel: int = 1
    stride: int = 1
    dilation: int = 1
    pad_top: int = 0

    def reads(self, rows: Rows) -> Rows:
        """Input rows (unclamped: negative or past the end means padding) the output rows `rows` read."""
        start = rows[0] * self.stride - self.pad_top
        return start, (rows[1] - 1) * self.stride - self.pad_top + (self.kernel - 1) * self.dilation + 1


def _conv_window(graph: Graph, op: Op) -> RowWindow:
    kh = graph.tensors[op.inputs[1]].shape[2]
    return RowWindow(kh, op.attrs.strides[0], op.attrs.dilations[0], op.attrs.pads[0])


def _pool_window(graph: Graph, op: Op) -> RowWindow:
    return RowWindow(op.attrs.kernel[0], op.attrs.strides[0], op.attrs.dilations[0], op.attrs.pads[0])


# op kind -> its row window; kinds not listed read the same rows they write (element-wise ops)
ROW_WINDOWS: dict[str, Callable[[Graph, Op], RowWindow]] = {"conv2d": _conv_window, "pool2d": _pool_window}
SAME_ROWS = RowWindow()


def row_window(graph: Graph, op: Op) -> RowWindow:
    fn = ROW_WINDOWS.get(op.kind)
    return fn(graph, op) if fn is not None else SAME_ROWS


WindowOf = Callable[[Graph, Op], RowWindow]
UnitCost = Callable[["Op | LayerGroup"], float]


@dataclass(frozen=True)
class Read:
    """What one op input reads in one tile: the rows it needs (unclamped) and those that exist."""

    wanted: Rows
    rows: Rows

    @property
    def pads(self) -> tuple[int, int]:
        """(top, bottom) padding rows the window needs beyond the tensor in this tile."""
        return self.rows[0] - self.wanted[0], self.wanted[1] - self.rows[1]


@dataclass(frozen=True)
class Tile:
    batch: int
    rows: dict[str, Rows]  # tensor -> rows the tile holds (union over its readers)
    reads: dict[tuple[str, int], Read]  # (op name, input index) -> what that input reads
    count: int = 1  # batch items [batch, batch + count) computed together


@dataclass
class LayerGroup:
    """A run of ops computed in local memory; `inputs` come from gmem, only `output` goes back."""

    ops: list[Op]
    inputs: list[str]
    output: str
    internal: list[str]
    rows: int = 0  # output rows per tile (set by the target once it fits)
    window: WindowOf = field(default=row_window, repr=False, compare=False)
    batch_step: int = 1  # batch items per tile (a target may raise it when whole items fit)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"group[{self.ops[0].name}..{self.ops[-1].name}]"

    @property
    def outputs(self) -> list[str]:
        return [self.output]

    @property
    def kind(self) -> str:
        return "layer_group"

    def tile(self, graph: Graph, batch: int, out_rows: Rows, count: int = 1) -> Tile:
        rows: dict[str, Rows] = {self.output: out_rows}
        reads: dict[tuple[str, int], Read] = {}
        for op in reversed(self.ops):
            produced = rows[op.outputs[0]]
            window = self.window(graph, op)
            for index, name in enumerate(op.inputs):
                if not name or graph.tensors[name].is_const:
                    continue
                height = _height(graph, name)
                wanted = (0, 1) if height == 1 else window.reads(produced)
                have = (max(0, wanted[0]), min(height, wanted[1]))
                reads[(op.name, index)] = Read(wanted, have)
                old = rows.get(name)
                rows[name] = have if old is None else (min(old[0], have[0]), max(old[1], have[1]))
        return Tile(batch, rows, reads, count)

    def tiles(self, graph: Graph, rows: int | None = None, batch_step: int | None = None) -> Iterator[Tile]:
        rows = rows or self.rows
        step = batch_step or self.batch_step
        batch, _, height, _ = graph.shape(self.output)
        for b in range(0, batch, step):
            for start in range(0, height, rows):
                yield self.tile(graph, b, (start, min(height, start + rows)), min(step, batch - b))


def _height(graph: Graph, name: str) -> int:
    return graph.shape(name)[2]


def make_group(graph: Graph, ops: list[Op], window: WindowOf = row_window) -> LayerGroup:
    """The group of a run of ops (also a run of one, for a target that plans lone ops the same way)."""
    produced = [op.outputs[0] for op in ops]
    inside = set(produced)
    inputs = [
        n
        for n in dict.fromkeys(n for op in ops for n in op.inputs)
        if n and n not in inside and not graph.tensors[n].is_const
    ]
    return LayerGroup(list(ops), inputs, produced[-1], produced[:-1], window=window)


def _closed(ops: list[Op], readers: dict[str, set[int]], start: int, pinned: set[str]) -> bool:
    """Only the last op's output leaves the run: every other output is read inside it and nowhere else."""
    stop = start + len(ops)
    for op in ops[:-1]:
        out = op.outputs[0]
        if out in pinned or any(not start <= r < stop for r in readers.get(out, ())):
            return False
    return True


def form_groups(
    graph: Graph,
    ops: list[Op],
    can_join: Callable[[Op], bool],
    rows_that_fit: Callable[[LayerGroup, int | None], int],
    pinned: set[str],
    window: WindowOf = row_window,
    cost: UnitCost | None = None,
) -> list[Op | LayerGroup]:
    """The schedule with runs of joinable ops replaced by layer groups (greedy: each group as long as it fits;
    with `cost`, then cut where its pieces cost less).

    `pinned`: tensors that must reach gmem (model outputs, CPU routine operands). A run of one op stays a
    plain op: its kernel tiles it on its own. `window`: op -> RowWindow for op records that are not IR ops.
    Every run is fitted once: the greedy growth and the cuts share what they fitted.
    """
    readers: dict[str, set[int]] = {}
    for i, op in enumerate(ops):
        for name in op.inputs:
            readers.setdefault(name, set()).add(i)
    fitted_runs: dict[tuple[int, int], LayerGroup | None] = {}
    last_rows: dict[int, int] = {}  # output height -> rows the last group that tall got (the search's hint)

    def fitted(start: int, stop: int) -> LayerGroup | None:
        if (start, stop) not in fitted_runs:
            group = make_group(graph, ops[start:stop], window)
            height = _height(graph, group.output)
            group.rows = rows_that_fit(group, last_rows.get(height))
            if group.rows:
                last_rows[height] = group.rows
            fitted_runs[start, stop] = group if group.rows else None
        return fitted_runs[start, stop]

    def piece(start: int, stop: int) -> Op | LayerGroup | None:
        """ops[start:stop] as one unit: a plain op, or a closed group that fits (None: neither)."""
        if stop - start == 1:
            return ops[start]
        return fitted(start, stop) if _closed(ops[start:stop], readers, start, pinned) else None

    units: list[Op | LayerGroup] = []
    i = 0
    while i < len(ops):
        best: LayerGroup | None = None
        j = i
        while j < len(ops) and j - i < MAX_GROUP_OPS and can_join(ops[j]) and len(ops[j].outputs) == 1:
            j += 1
            if j - i < 2 or not _closed(ops[i:j], readers, i, pinned):
                continue
            group = fitted(i, j)
            if group is None:
                break  # a longer run only needs more local memory
            best = group
        if best is None:
            units.append(ops[i])
            i += 1
        else:
            units += [best] if cost is None else _cheapest_pieces(best, i, i + len(best.ops), piece, cost)
            i += len(best.ops)
    return units


def _cheapest_pieces(
    whole: Op | LayerGroup, start: int, stop: int, piece: Callable[[int, int], Op | LayerGroup | None],
    cost: UnitCost,
) -> list[Op | LayerGroup]:  # fmt: skip
    """ops[start:stop] (`whole`) kept whole, or cut once where the two pieces cost least if that is less than
    the whole, each piece then cut the same way. A piece is a plain op or a closed group that fits; every
    piece is priced once."""
    memo: dict[tuple[int, int], tuple[Op | LayerGroup | None, float]] = {(start, stop): (whole, cost(whole))}

    def priced(a: int, b: int) -> tuple[Op | LayerGroup | None, float]:
        if (a, b) not in memo:
            unit = piece(a, b)
            memo[a, b] = (unit, cost(unit) if unit is not None else float("inf"))
        return memo[a, b]

    def cut(a: int, b: int) -> list[Op | LayerGroup]:
        unit, best = priced(a, b)
        at = None
        for k in range(a + 1, b):
            total = priced(a, k)[1] + priced(k, b)[1]
            if total < best:
                best, at = total, k
        return [unit] if at is None else cut(a, at) + cut(at, b)

    return cut(start, stop)
