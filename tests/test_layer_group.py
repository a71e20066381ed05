"""passes/lowering/layer_group.py: the rows each tensor of a group holds per tile (halos, padding) and group
formation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx

from npuc.frontends.onnx import import_onnx
from npuc.models.netbuilder import NetBuilder
from npuc.passes.lowering.layer_group import LayerGroup, RowWindow, form_groups, make_group
from npuc.passes.rewrite.canonicalize import canonicalize

GROUPABLE = {"conv2d", "pool2d", "eltwise", "activation"}


def _graph(tmp_path: Path, body, shape=(1, 4, 16, 12)):  # noqa: ANN001, ANN202
    b = NetBuilder("g", np.random.default_rng(0))
    path = tmp_path / "g.onnx"
    onnx.save(b.build({"input": shape}, {"output": body(b)}), path)
    graph = import_onnx(path, None, [])
    canonicalize(graph)
    return graph


def test_row_windows_read_the_halo_and_the_padding() -> None:
    conv3 = RowWindow(kernel=3, stride=1, dilation=1, pad_top=1)
    assert conv3.reads((0, 4)) == (-1, 5)  # one padding row above the first tile
    assert conv3.reads((4, 8)) == (3, 9)
    s2 = RowWindow(kernel=3, stride=2, dilation=1, pad_top=1)
    assert s2.reads((2, 5)) == (3, 10)
    dilated = RowWindow(kernel=3, stride=1, dilation=2, pad_top=2)
    assert dilated.reads((0, 1)) == (-2, 3)


def test_tiles_of_a_conv_chain_grow_the_halo(tmp_path: Path) -> None:
    graph = _graph(tmp_path, lambda b: b.conv(b.op("Relu", b.conv("input", 4, 8)), 8, 8))
    units = form_groups(graph, graph.ops, lambda op: op.kind in GROUPABLE, lambda g, hint: 4, set())
    (group,) = units
    assert isinstance(group, LayerGroup) and len(group.ops) == 2 and group.inputs == ["input"]
    assert group.output == "output" and len(group.internal) == 1
    mid = group.internal[0]
    tiles = list(group.tiles(graph))
    assert [t.rows["output"] for t in tiles] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    first, second, last = tiles[0], tiles[1], tiles[-1]
    assert second.rows[mid] == (3, 9) and second.rows["input"] == (2, 10)
    assert first.rows[mid] == (0, 5) and first.rows["input"] == (0, 6)
    first_conv, second_conv = group.ops
    assert first.reads[(second_conv.name, 0)].pads == (1, 0)
    assert first.reads[(first_conv.name, 0)].pads == (1, 0)
    assert last.reads[(second_conv.name, 0)].pads == (0, 1)
    assert second.reads[(first_conv.name, 0)].pads == (0, 0)


def test_a_residual_block_closes_only_at_the_add(tmp_path: Path) -> None:
    def block(b: NetBuilder) -> str:
        x = b.op("Relu", b.conv("input", 4, 4))
        return b.op("Add", x, b.conv(b.op("Relu", b.conv(x, 4, 4)), 4, 4))

    graph = _graph(tmp_path, block)
    units = form_groups(graph, graph.ops, lambda op: op.kind in GROUPABLE, lambda g, hint: 16, set())
    (group,) = units
    assert [op.kind for op in group.ops] == ["conv2d", "conv2d", "conv2d", "eltwise"]
    tile = next(iter(group.tiles(graph)))
    x = group.ops[0].outputs[0]
    assert tile.rows[x] == (0, 16)  # the add and the 3x3 conv read it; the union is kept
    # a pinned tensor (a model output, a CPU operand) must reach gmem: no group may hide it
    split = form_groups(graph, graph.ops, lambda op: op.kind in GROUPABLE, lambda g, hint: 16, {x})
    assert isinstance(split[0], type(graph.ops[0])) and split[0].outputs == [x]
    assert isinstance(split[1], LayerGroup) and split[1].inputs == [x]


def test_nothing_fits_leaves_plain_ops(tmp_path: Path) -> None:
    graph = _graph(tmp_path, lambda b: b.conv(b.conv("input", 4, 8), 8, 8))
    units = form_groups(graph, graph.ops, lambda op: op.kind in GROUPABLE, lambda g, hint: 0, set())
    assert units == graph.ops
    units = form_groups(graph, graph.ops, lambda op: False, lambda g, hint: 4, set())
    assert units == graph.ops


def test_a_cost_cuts_a_group_where_its_pieces_cost_less(tmp_path: Path) -> None:
    """With a price per unit the greedy group is cut where two pieces cost less than the whole, each piece
    again; every piece stays closed (a residual block's ops are never cut apart from their add) and a priced
    piece is evaluated once."""

    def chain(b: NetBuilder) -> str:
        x = b.conv("input", 4, 4)
        for _ in range(3):
            x = b.conv(b.op("Relu", x), 4, 4)
        return x

    graph = _graph(tmp_path, chain)
    recomputed = lambda unit: sum(t.rows[op.outputs[0]][1] - t.rows[op.outputs[0]][0]  # noqa: E731
                                  for t in unit.tiles(graph) for op in unit.ops)  # fmt: skip
    rows = lambda unit: graph.shape(unit.outputs[0])[2]  # noqa: E731
    priced: list[tuple[str, ...]] = []

    def cost(unit) -> float:  # noqa: ANN001 - an op or a group
        priced.append(tuple(op.name for op in getattr(unit, "ops", [unit])))
        # rows computed (halos included), plus 20 per tensor a unit moves through DDR (its output)
        return (recomputed(unit) if isinstance(unit, LayerGroup) else rows(unit)) + 20

    fitted: list[tuple[tuple[str, ...], int | None]] = []

    def two_rows(group: LayerGroup, hint: int | None) -> int:
        fitted.append((tuple(op.name for op in group.ops), hint))
        return 2

    (whole,) = form_groups(graph, graph.ops, lambda op: op.kind in GROUPABLE, lambda g, hint: 2, set())
    form_groups(graph, graph.ops, lambda op: op.kind in GROUPABLE, two_rows, set(), cost=cost)
    runs = [run for run, _ in fitted]
    assert len(runs) == len(set(runs)) > 1  # the greedy growth and the cuts share every run they fitted
    assert fitted[0][1] is None and {hint for _, hint in fitted[1:]} == {2}  # then the last height as tall got
    priced.clear()
    units = form_groups(graph, graph.ops, lambda op: op.kind in GROUPABLE, lambda g, hint: 2, set(), cost=cost)
    assert len(priced) == len(set(priced)) > 1  # every piece priced once
    assert len(units) > 1 and [op for u in units for op in getattr(u, "ops", [u])] == whole.ops
    assert sum(map(cost, units)) < cost(whole)
    # a cost that never pays for a cut keeps the greedy group
    assert form_groups(
        graph, graph.ops, lambda op: op.kind in GROUPABLE, lambda g, hint: 2, set(), cost=lambda u: 1.0
    ) == [whole]

    def block(b: NetBuilder) -> str:
        x = b.op("Relu", b.conv("input", 4, 4))
        return b.op("Add", x, b.conv(b.op("Relu", b.conv(x, 4, 4)), 4, 4))

    graph = _graph(tmp_path, block)
    # smaller groups are cheaper, a plain op costs 3: the cheapest pieces would be [conv, conv] + [conv, add] (8),
    # but the first pair hides x, which the add reads: not a piece. So [conv], then [conv, conv, add] cut again.
    squares = lambda unit: len(unit.ops) ** 2 if isinstance(unit, LayerGroup) else 3  # noqa: E731
    units = form_groups(graph, graph.ops, lambda op: op.kind in GROUPABLE, lambda g, hint: 16, set(), cost=squares)
    assert units[:2] == graph.ops[:2] and isinstance(units[2], LayerGroup)
    assert [op.kind for op in units[2].ops] == ["conv2d", "eltwise"] and units[2].inputs == [
        graph.ops[1].outputs[0],
        graph.ops[0].outputs[0],
    ]


def test_batch_steps_group_items_and_cover_the_batch(tmp_path: Path) -> None:
    graph = _graph(tmp_path, lambda b: b.conv(b.op("Relu", b.conv("input", 4, 8)), 8, 8), shape=(3, 4, 16, 12))
    (group,) = form_groups(graph, graph.ops, lambda op: op.kind in GROUPABLE, lambda g, hint: 8, set())
    assert [(t.batch, t.count, t.rows["output"]) for t in group.tiles(graph)] == [
        (b, 1, r) for b in range(3) for r in ((0, 8), (8, 16))
    ]
    group.batch_step = 2
    assert [(t.batch, t.count) for t in group.tiles(graph, 16)] == [(0, 2), (2, 1)]


@dataclass
class _Rec:
    """A target's own op record (not an IR op): what the pass reads is name, kind, inputs and outputs."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: list[str]
    kernel: int = 1
    stride: int = 1


@dataclass
class _View:
    shapes: dict[str, tuple[int, int, int, int]]
    tensors: dict = field(init=False)

    def __post_init__(self) -> None:
        self.tensors = {n: SimpleNamespace(is_const=False) for n in self.shapes}

    def shape(self, name: str) -> tuple[int, int, int, int]:
        return self.shapes[name]


def test_target_records_with_their_own_windows() -> None:
    view = _View({"x": (1, 8, 20, 20), "a": (1, 8, 9, 9), "b": (1, 8, 9, 9), "y": (1, 8, 9, 9)})
    recs = [
        _Rec("pool", "pool", ("x",), ["a"], kernel=3, stride=2),
        _Rec("act", "act", ("a",), ["b"]),
        _Rec("add", "add", ("a", "b"), ["y"]),
    ]

    def window(graph, rec):  # noqa: ANN001, ANN202
        return RowWindow(rec.kernel, rec.stride)

    (group,) = form_groups(view, recs, lambda r: True, lambda g, hint: 3, set(), window)
    assert group.inputs == ["x"] and group.internal == ["a", "b"] and group.output == "y"
    tile = list(group.tiles(view))[1]
    assert tile.rows == {"y": (3, 6), "a": (3, 6), "b": (3, 6), "x": (6, 13)}
    assert tile.reads[("pool", 0)].pads == (0, 0)
    lone = make_group(view, recs[:1], window)
    assert (lone.inputs, lone.output, lone.internal) == (["x"], "a", [])
    assert next(iter(lone.tiles(view, 9))).rows["x"] == (0, 19)


def test_largest_fit_gives_the_same_answer_whatever_the_hint() -> None:
    from npuc.backends.cv18xx.kernels.tiling import largest_fit

    for answer in range(0, 9):
        for hint in [None, *range(0, 10)]:
            calls: list[int] = []
            fits = lambda t: calls.append(t) or t <= answer  # noqa: B023, E731
            assert largest_fit(8, fits, hint) == answer, (answer, hint)
            if hint == answer and answer > 0:
                assert len(calls) <= 2  # a right hint: itself and the one above it
