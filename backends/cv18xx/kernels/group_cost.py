"""The price of a layer-group unit, before any code exists, in backends/cv18xx/timing.py's units.

form_groups (passes/lowering/layer_group.py) cuts a greedy group where two pieces cost less than the whole:
recomputed halo rows are TIU work, what a cut sends through gmem is TDMA time. With the longest groups,
resnet18_224 (cv183x) took 3.95 M TIU cycles against 3.55 M ungrouped, 4.14 M scheduled against 4.04 M; cut by
this price, 3.78 M. Units are plain ops and groups of ops that can join a group, so every tensor is int8 or bf16.
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


def unit_cycles(cg: Codegen, unit: Op | LayerGroup) -> float:
    """Nominal cycles of a layer group at its tile height, or of a plain op, before any code exists: every op's
    TIU work on the rows it computes (a group's recomputed halo rows included) plus the TDMA time of what the
    unit moves (its inputs as each tile reads them, its output, its constants once)."""
    graph, chip = cg.graph, cg.chip
    if isinstance(unit, LayerGroup):
        tiles = [(t.count, t.rows) for t in unit.tiles(graph)]
        ops, inputs, output = unit.ops, unit.inputs, unit.output
    else:
        ops, output = [unit], unit.outputs[0]
        inputs = [n for n in unit.inputs if n and not graph.tensors[n].is_const]
        tiles = [(graph.shape(output)[0], {n: (0, graph.shape(n)[2]) for n in [*inputs, output]})]

    def elements(name: str, count: int, rows: Rows) -> int:
        _, c, _, w = graph.shape(name)
        return count * c * (rows[1] - rows[0]) * w

    tiu = 0
    for op in ops:
        out = op.outputs[0]
        per_cycle = chip.eu_bytes // ESIZE[LOCAL_FMT[cg.fmt[out]]]
        channels = graph.shape(out)[1]
        steps = -(-channels // chip.lanes) / channels  # lane steps per channel: a partial step costs a whole one
        macs = _macs_per_output(cg, op)
        tiu += sum(TIU_SETUP_CYCLES + elements(out, n, rows[out]) * steps * macs / per_cycle for n, rows in tiles)
    moved = sum(elements(name, n, rows[name]) * ESIZE[LOCAL_FMT[cg.fmt[name]]] for n, rows in tiles
                for name in [*inputs, output])  # fmt: skip
    consts = [graph.tensors[n] for op in ops for n in op.inputs if n and graph.tensors[n].is_const]
    moved += sum(t.data.nbytes for t in consts)
    transfers = len(tiles) * (len(inputs) + 1) + len(consts)
    return tiu + transfers * TDMA_SETUP_CYCLES + moved / TDMA_BYTES_PER_CYCLE
