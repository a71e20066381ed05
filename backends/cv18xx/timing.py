"""How much TDMA transfer time a cvimodel hides behind TIU work: a two-engine schedule of its cmdbufs.

Each engine runs its descriptors in stream order; a descriptor starts when its engine is free and the
other-engine descriptor it waits for (its sync id) has finished. Durations come from a nominal cost model,
not from a chip datasheet: a TDMA moves TDMA_BYTES_PER_CYCLE bytes of global memory per cycle after a fixed
setup, and a TIU op does one multiply-accumulate per EU byte per lane per cycle (int8; bf16 half that) after
a fixed setup. The interesting numbers are ratios: `overlap` is the share of the fully serial time (every
descriptor waiting for the previous one, as cvikernel's serial scheme runs) that the sync ids save.
The same schedule can price descriptors with the vendor compiler's own formulas instead (`CostModel`,
vendor_cost.VENDOR_COSTS), which the bench uses to check this model's rankings. A conv with paired input
channels (double_conv) does twice the multiply-accumulates a cycle, as the vendor's formulas price it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from npuc.backends.cv18xx import isa
from npuc.backends.cv18xx.chips import CHIPS, ChipSpec
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf, tiu_op_name
from npuc.backends.cv18xx.container import CviModel
from npuc.backends.cv18xx.sim_tiu import normalize_tiu_fields
from npuc.backends.cv18xx.sync import MAX_ID, sync_ids
from npuc.backends.cv18xx.traffic import descriptor_transfers

TDMA_BYTES_PER_CYCLE = 16
TDMA_SETUP_CYCLES = 60
TIU_SETUP_CYCLES = 20


def _macs_per_output(op: str, f: dict[str, int]) -> int:
    """Multiply-accumulates behind one output element."""
    if op == "conv":
        return f["opd1_n"] * f["opd1_h"] * f["opd1_w"]  # ic * kh * kw
    if op in ("depthwise", "max_pool", "avg_pool", "min_pool"):
        return f["opd1_h"] * f["opd1_w"]
    if op == "matmul":
        return f["opd1_n"]  # k
    return 1


class ZeroFields(dict):
    """Descriptor fields where an absent one is 0, as the encoder writes it (emitted records omit zeros)."""

    def __missing__(self, key: str) -> int:
        return 0


def tiu_cycles(fields: dict[str, int], chip: ChipSpec) -> int:
    f = ZeroFields(normalize_tiu_fields(fields))
    op = tiu_op_name(f)
    n, c, h, w = (f[f"res0_{d}"] for d in "nchw")
    per_lane = n * -(-c // chip.lanes) * h * w
    if op == "matmul":  # rows x (column groups spread over lanes) x group width
        per_lane = n * -(-c // chip.lanes) * w
    per_cycle = chip.eu_bytes // (2 if f["opd_typ"] else 1)
    per_cycle *= 2 if op == "conv" and f["double_conv"] else 1  # two input channels a cycle
    return TIU_SETUP_CYCLES + -(-per_lane * _macs_per_output(op, f) // per_cycle)


def tdma_cycles(fields: dict[str, int], chip: ChipSpec, weight: bytes, section: str, offset: int) -> int:
    moved = sum(t.nbytes for t in descriptor_transfers(fields, chip, weight, section, offset))
    if not moved:  # local-to-local: both sides in lmem, counted by elements
        moved = fields["src_n"] * fields["src_c"] * fields["src_h"] * fields["src_w"]
    return TDMA_SETUP_CYCLES + -(-moved // TDMA_BYTES_PER_CYCLE)


@dataclass(frozen=True)
class CostModel:
    """Cycles of one TIU descriptor (fields, chip) and of one TDMA descriptor (fields, chip, weight section,
    cmdbuf name, offset): this module's nominal model, or the vendor's formulas (vendor_cost.py)."""

    name: str
    tiu: Callable[[dict[str, int], ChipSpec], int]
    tdma: Callable[[dict[str, int], ChipSpec, bytes, str, int], int]


NOMINAL = CostModel("nominal", tiu_cycles, tdma_cycles)


@dataclass
class Schedule:
    """Cycles of one model's cmdbufs: run fully serially, and as their sync ids allow."""

    serial: int = 0
    scheduled: int = 0
    tiu_busy: int = 0
    tdma_busy: int = 0

    @property
    def overlap(self) -> float:
        return 1.0 - self.scheduled / self.serial if self.serial else 0.0


def schedule_cmdbuf(data: bytes, chip: ChipSpec, weight: bytes, section: str, costs: CostModel = NOMINAL
                    ) -> Schedule:  # fmt: skip
    tiu, tdma = isa.ENGINE_TIU, isa.ENGINE_TDMA
    finish: dict[int, list[int]] = {tiu: [0], tdma: [0]}  # finish time per engine by absolute sequence
    base = {tiu: 0, tdma: 0}  # absolute sequence number before the current id segment
    sched = Schedule()
    for ins in split_cmdbuf(data, chip, f"section {section!r}"):
        if ins.engine == tiu:
            other = tdma
            cost = costs.tiu(ins.fields, chip)
            sched.tiu_busy += cost
        elif ins.engine == tdma:
            other = tiu
            cost = costs.tdma(ins.fields, chip, weight, section, ins.offset)
            sched.tdma_busy += cost
        else:
            continue
        own_id, wait_id = sync_ids(ins.engine, ins.fields)
        awaited = base[other] + wait_id if wait_id else 0
        ready = finish[other][min(awaited, len(finish[other]) - 1)]
        start = max(finish[ins.engine][-1], ready)
        finish[ins.engine].append(start + cost)
        sched.serial += cost
        if own_id == MAX_ID:  # the runtime's barrier: both engines drain
            end = max(finish[tiu][-1], finish[tdma][-1])
            finish[tiu][-1] = finish[tdma][-1] = end
            base = {e: len(finish[e]) - 1 for e in finish}
    sched.scheduled = max(finish[tiu][-1], finish[tdma][-1])
    return sched


def schedule_model(model: CviModel, costs: CostModel = NOMINAL) -> Schedule:
    """The schedule summed over every cmdbuf (routines run one after another), priced by `costs`."""
    chip = CHIPS[model.chip]
    total = Schedule()
    for section, data in model.cmdbufs().items():
        s = schedule_cmdbuf(data, chip, model.weight, section, costs)
        total.serial += s.serial
        total.scheduled += s.scheduled
        total.tiu_busy += s.tiu_busy
        total.tdma_busy += s.tdma_busy
    return total
