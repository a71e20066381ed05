"""Layer groups on the CV18xx: the `layer_group` kernel, a run of conv / pool / eltwise / activation / PReLU ops
computed in local memory.

passes/lowering/layer_group.py forms the groups and gives each tile's rows, group_plan.py lays out their local
memory and group_ops.py gives each op its local kernel; here a group becomes TDMA and TIU ops: its plan placed
where the first loads can run under the units before it, the residents loaded once, then per tile the inputs
loaded, every op's local kernel emitted, and the output stored (tiles pipelined when the plan is
double-buffered; a streamed conv loads its filters chunk by chunk). Only the group's output goes back to gmem,
a tile at a time.
"""

from __future__ import annotations

from npuc.backends.cv18xx import dma
from npuc.backends.cv18xx.codegen import Codegen, kernel
from npuc.backends.cv18xx.kernels.group_ops import LOCAL_FMT, LOCAL_KERNELS, needs_exact_rows
from npuc.backends.cv18xx.kernels.group_plan import Plan, best_plan, residents
from npuc.backends.cv18xx.kernels.group_stream import emit_streamed_conv
from npuc.backends.cv18xx.kernels.tiling import pipeline
from npuc.backends.cv18xx.lmem import GTensor, LTensor, local_bytes, local_strides
from npuc.compiler.errors import UserError
from npuc.passes.lowering.layer_group import LayerGroup, Rows


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


def _place(cg: Codegen, group: LayerGroup, plan: Plan) -> None:
    """Shift the plan to where its first op's constants meet the oldest local data of the units before it
    (reorder.LastTouch), so their loads can run under that compute."""
    at = cg.chip.lmem_size - plan.peak if cg.top_aligned else 0  # where plan_group put it
    first = [
        (addr - at, addr - at + local_bytes(cg.chip, r.shape, r.fmt, r.eu_align))
        for r, addr in zip(residents(cg, group.ops[0], 0 in plan.streams), plan.resident[0])
    ]
    if 0 in plan.streams:  # its first chunk's filters
        stream, addr = plan.streams[0]
        first.append((addr - at, addr - at + stream.set_bytes(cg)))
    touched = cg.stream.touched
    touched.update(cg.stream.records, len(cg.stream.records))
    plan.shift(touched.best_shift(first, plan.peak, cg.top_aligned) - at)


@kernel("layer_group")
def emit_group(cg: Codegen, group: LayerGroup) -> None:
    plan = best_plan(cg, group)
    if plan is None:
        raise UserError(f"{group.name}: its tiles no longer fit {cg.chip.name} local memory")
    s = cg.stream
    _place(cg, group, plan)
    resident: list[list[LTensor]] = []
    sources: list[list[GTensor]] = []  # placed in the weight area in op order, loaded in load() below
    for k, (op, addrs) in enumerate(zip(group.ops, plan.resident)):
        constants = residents(cg, op, k in plan.streams)
        mine = []
        for r, addr in zip(constants, addrs):
            mine.append(LTensor(addr, r.shape, r.fmt, local_strides(cg.chip, r.shape, r.fmt, r.eu_align)))
        resident.append(mine)
        sources.append([r.source() for r in constants])

    def load_residents(ops: range) -> None:
        for k in ops:
            for src, lt in zip(sources[k], resident[k]):
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
                ins.append(lt if needs_exact_rows(op) else _view(cg, lt, rows, read.rows))  # group_ops.serves
                reads.append(read)
            out_slot = plan.out_slot[k]
            rows = tile.rows[op.outputs[0]]
            out = _local_tensor(cg, op.outputs[0], rows, out_slot.at(j))
            held[id(out_slot)] = (out, rows)
            temps = iter(plan.scratch[k])

            def new_tile(out: LTensor = out, temps=temps) -> LTensor:
                return LTensor(next(temps), out.shape, out.fmt, out.strides)

            if k in plan.streams:
                emit_streamed_conv(cg, op, out, ins, reads, resident[k], *plan.streams[k])
            else:
                LOCAL_KERNELS[op.kind].emit(cg, op, out, ins, reads, resident[k], new_tile)
        last = held[id(plan.out_slot[len(group.ops) - 1])][0]
        b = tile.batch
        dma.store(s, last, cg.gtensor(group.output).slice(n=(b, b + 1), h=tile.rows[group.output]))

    if plan.double:
        pipeline(len(plan.tiles), 2, load, work)
    else:
        for j in range(len(plan.tiles)):
            work(j)
