"""The price of a layer-group unit, before any code exists, in backends/cv18xx/timing.py's units.

form_groups (passes/lowering/layer_group.py) cuts a greedy group where two pieces cost less than the whole:
recomputed halo rows are TIU work, what a cut sends through gmem is TDMA time. With the longest groups,
resnet18_224 (cv183x) took 3.95 M TIU cycles against 3.55 M ungrouped, 4.14 M scheduled against 4.04 M; cut by
this price, 3.78 M. Units are plain ops and groups of ops that can join a group, so every tensor is int8 or bf16.
The same per-tile terms price a group's tile height (group_plan.tile_height): one copy of each tile's data adds
its transfers to its compute (`unit_cycles`), two overlap them (`pipelined_cycles`).
"""

from __future__ import annotations

import numpy as np

from npuc.backends.cv18xx.codegen import Codegen
from npuc.backends.cv18xx.kernels.group_ops import LOCAL_FMT
from npuc.backends.cv18xx.lmem import ESIZE
from npuc.backends.cv18xx.timing import TDMA_BYTES_PER_CYCLE, TDMA_SETUP_CYCLES, TIU_SETUP_CYCLES
from npuc.compiler.ir import Op
from npuc.passes.lowering.layer_group import LayerGroup, Rows


def _macs_per_output(cg: Codegen, op: Op) -> int:
    """Multiply-accumulates behind one output element (a conv's ic/group * kh * kw, a pool's window)."""
    if op.kind == "conv2d":
        return int(np.prod(cg.graph.shape(op.inputs[1])[1:]))
    if op.kind == "pool2d":
        return int(np.prod(op.attrs.kernel))
    return 1


def tile_costs(cg: Codegen, unit: Op | LayerGroup, rows: int | None = None) -> list[tuple[float, float]]:
    """(TIU, TDMA) nominal cycles of each tile of a layer group at `rows` output rows a tile (default its own),
    or of a plain op as one tile, before any code exists: every op's TIU work on the rows it computes (a group's
    recomputed halo rows included), and the TDMA time of what the tile moves (its inputs as it reads them, its
    output; the constants once, in the first tile)."""
    graph, chip = cg.graph, cg.chip
    if isinstance(unit, LayerGroup):
        tiles = [(t.count, t.rows) for t in unit.tiles(graph, rows)]
        ops, inputs, output = unit.ops, unit.inputs, unit.output
    else:
        ops, output = [unit], unit.outputs[0]
        inputs = [n for n in unit.inputs if n and not graph.tensors[n].is_const]
        tiles = [(graph.shape(output)[0], {n: (0, graph.shape(n)[2]) for n in [*inputs, output]})]

    def elements(name: str, count: int, rows: Rows) -> int:
        _, c, _, w = graph.shape(name)
        return count * c * (rows[1] - rows[0]) * w

    def per_element(op: Op) -> float:
        """TIU cycles per output element: lane steps per channel (a partial step costs a whole one) times the
        multiply-accumulates behind it, over the EU's elements per cycle."""
        out = op.outputs[0]
        channels = graph.shape(out)[1]
        per_cycle = chip.eu_bytes // ESIZE[LOCAL_FMT[cg.fmt[out]]]
        return -(-channels // chip.lanes) / channels * _macs_per_output(cg, op) / per_cycle

    rates = [(op.outputs[0], per_element(op)) for op in ops]
    costs = []
    for n, held in tiles:
        tiu = sum(TIU_SETUP_CYCLES + elements(out, n, held[out]) * rate for out, rate in rates)
        moved = sum(elements(name, n, held[name]) * ESIZE[LOCAL_FMT[cg.fmt[name]]] for name in [*inputs, output])
        costs.append((tiu, (len(inputs) + 1) * TDMA_SETUP_CYCLES + moved / TDMA_BYTES_PER_CYCLE))
    consts = [graph.tensors[n] for op in ops for n in op.inputs if n and graph.tensors[n].is_const]
    first_tiu, first_tdma = costs[0]
    loads = len(consts) * TDMA_SETUP_CYCLES + sum(t.data.nbytes for t in consts) / TDMA_BYTES_PER_CYCLE
    costs[0] = (first_tiu, first_tdma + loads)
    return costs


def unit_cycles(cg: Codegen, unit: Op | LayerGroup) -> float:
    """The unit's nominal cycles with no transfer hidden: its tiles' TIU and TDMA time added up."""
    return sum(tiu + tdma for tiu, tdma in tile_costs(cg, unit))


def pipelined_cycles(costs: list[tuple[float, float]]) -> float:
    """The cycles of tiles whose transfers run under the previous tile's compute (double-buffered): the first
    tile's transfers, then each tile's compute or the next tile's transfers, whichever is longer."""
    tdma = [d for _, d in costs[1:]] + [0.0]
    return costs[0][1] + sum(max(tiu, after) for (tiu, _), after in zip(costs, tdma))
