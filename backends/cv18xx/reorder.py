"""Early TDMA loads: each load moves up the instruction stream, before the TIU ops and TDMA stores it does not
depend on, so the TDMA fetches it while the TIU still computes what came before (prefetch).

Kernels emit a load right before the code that reads it, and the TDMA runs its stream in order: a load that
follows a store waits behind it, and the store waits for the TIU op that made its data, so the load ends up
serialised with that compute even when its local memory is free. This pass, run before the sync ids are
assigned (sync.py), moves every gmem -> lmem load up past each preceding descriptor that

- touches none of the local bytes it writes (per-lane spans, widened to sync.GRANULE as the ids are), and
- writes no global memory it reads (weights and constant fills are never written; an activation load only
  passes a store to the same region at provably disjoint addresses),

and stops at the first descriptor it depends on or at an earlier load: loads keep their relative order, so
what the TIU needs first still arrives first. A constant load (weights, fills) that has passed some TIU work
may also pass earlier activation loads while that work (timing.py's cost model) is shorter than its own
transfer: it goes up past small layers to run under the last long compute, delaying the loads it passes by
at most its own time. Constant loads keep their order among themselves.
Every pair of descriptors touching the same bytes keeps its order, so the program computes exactly what it
computed before; only the sync ids (which follow the new order) let the load run earlier.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from npuc.backends.cv18xx import isa
from npuc.backends.cv18xx.chips import ChipSpec
from npuc.backends.cv18xx.sync import GRANULE, Footprint, Span, footprint
from npuc.backends.cv18xx.timing import TDMA_BYTES_PER_CYCLE, TDMA_SETUP_CYCLES, tiu_cycles

_WEIGHT_REGION = 1
_FILL = 4  # spec_func of a constant fill: no global read
_GENERAL_COPY = 1  # trans_fmt of a plain byte copy of src_n_stride bytes
_GLOBAL_SIDES = {0: (True, False), 1: (False, True), 2: (True, True), 3: (False, False)}  # trans_dir -> src, dst

GlobalSpan = tuple[int, int, int]  # (region, first byte, end byte)


@dataclass
class _Item:
    engine: int
    fields: dict[str, int]
    local: list[Span]  # granule-widened local spans it reads or writes
    local_writes: list[Span]
    global_read: GlobalSpan | None = None
    global_write: GlobalSpan | None = None
    load: bool = False
    constant: bool = False  # a load of never-written global memory (weights) or a fill
    cycles: int = 0  # the cost model's duration (TIU ops and constant loads)


def _widen(spans: list[Span]) -> list[Span]:
    return [(lo // GRANULE * GRANULE, -(-hi // GRANULE) * GRANULE) for lo, hi in spans if hi > lo]


def _global_span(f: dict[str, int], side: str) -> GlobalSpan:
    """The global bytes one side of a transfer may touch (a conservative bounding range)."""
    g = lambda k: int(f.get(k, 0))  # noqa: E731
    addr = (g(f"{side}_base_addr_high") << 32) | g(f"{side}_base_addr_low")
    if g("trans_fmt") == _GENERAL_COPY:
        return g(f"{side}_base_reg_sel"), addr, addr + g("src_n_stride")
    esz = 2 if g(f"{side}_fmt") == 2 else 1
    c, h, w = (g(f"{side}_c"), g(f"{side}_h"), g(f"{side}_w")) if side == "dst" else (
        g("src_c"), g("src_h"), g("src_w"))  # fmt: skip
    n = g("src_n")
    strides = (g(f"{side}_n_stride"), g(f"{side}_c_stride_low") | (g(f"{side}_c_stride_high") << 16),
               g(f"{side}_h_stride"))  # fmt: skip
    if side == "src" and g("compress_en"):  # a VLC buffer: its size is in its header, not in the fields
        return g(f"{side}_base_reg_sel"), addr, 1 << 62
    if g("sys_dtype"):  # matrix mode: rows of w elements, row pitch in the c stride
        reach = max(n, c, 1) * max(strides) + w * esz
    else:
        reach = sum(max(d - 1, 0) * s for d, s in zip((n, c, h), strides)) + w * esz
    return g(f"{side}_base_reg_sel"), addr, addr + max(reach, 0)


def _item(engine: int, f: dict[str, int], chip: ChipSpec) -> _Item:
    fp = footprint(engine, f, chip)
    writes = _widen(fp.writes)
    it = _Item(engine, f, _widen(fp.reads) + writes, writes)
    if engine == isa.ENGINE_TDMA:
        src_global, dst_global = _GLOBAL_SIDES.get(int(f.get("trans_dir", 0)), (True, True))
        if src_global and int(f.get("spec_func", 0)) != _FILL:
            it.global_read = _global_span(f, "src")
        if dst_global:
            it.global_write = _global_span(f, "dst")
        it.load = src_global and not dst_global
        it.constant = it.load and (it.global_read is None or it.global_read[0] == _WEIGHT_REGION)
        if it.constant:
            esz = 2 if int(f.get("dst_fmt", 1)) == 2 else 1
            elements = int(f.get("src_n", 0)) * int(f.get("dst_c", 0)) * int(f.get("dst_h", 0)) * int(f.get("dst_w", 0))
            it.cycles = TDMA_SETUP_CYCLES + -(-elements * esz // TDMA_BYTES_PER_CYCLE)
    else:
        it.cycles = tiu_cycles(f, chip)
    return it


def _overlap(a: list[Span], b: list[Span]) -> bool:
    return any(lo < hi2 and lo2 < hi for lo, hi in a for lo2, hi2 in b)


def _global_conflict(read: GlobalSpan | None, write: GlobalSpan | None) -> bool:
    if read is None or write is None or read[0] == _WEIGHT_REGION:
        return False
    if read[0] != write[0]:  # io regions may alias the shared one: only a same-region range is provably apart
        return True
    return read[1] < write[2] and write[1] < read[2]


def _depends(load: _Item, prev: _Item) -> bool:
    return _overlap(load.local_writes, prev.local) or _global_conflict(load.global_read, prev.global_write)


def hoist_loads(records: list[tuple[int, dict[str, int]]], chip: ChipSpec) -> list[tuple[int, dict[str, int]]]:
    """The records with every TDMA load moved up as far as its dependencies and the loads before it allow."""
    out: list[_Item] = []
    for engine, f in records:
        it = _item(engine, f, chip)
        pos = len(out)
        if it.load:
            covered = 0  # TIU cycles passed so far
            while pos > 0:
                prev = out[pos - 1]
                if prev.load and not (it.constant and not prev.constant and 0 < covered < it.cycles):
                    break
                if _depends(it, prev):
                    break
                if prev.engine == isa.ENGINE_TIU:
                    covered += prev.cycles
                pos -= 1
        out.insert(pos, it)
    return [(it.engine, it.fields) for it in out]


# ---- where a unit sits in local memory ---------------------------------------------------------------------

_TIU_ADDRESSES = ("res0_addr", "opd0_addr", "opd1_addr", "opd2_addr")
_TDMA_ADDRESSES = {0: ("dst",), 1: ("src",), 3: ("src", "dst")}  # trans_dir -> its local sides


class LastTouch:
    """Per local-memory granule: the index of the last record of a stream that read or wrote it (-1: none)."""

    def __init__(self, chip: ChipSpec) -> None:
        self.chip = chip
        self.index = np.full(-(-chip.lmem_size // GRANULE), -1, np.int64)
        self.seen = 0  # records consumed

    def update(self, records: list[tuple[int, dict[str, int]]], upto: int) -> None:
        for i in range(self.seen, upto):
            engine, f = records[i]
            fp = footprint(engine, f, self.chip)
            for lo, hi in fp.reads + fp.writes:
                if hi > lo:
                    self.index[max(lo, 0) // GRANULE : -(-hi // GRANULE)] = i
        self.seen = max(self.seen, upto)

    def best_shift(self, spans: list[Span], peak: int, prefer_top: bool) -> int:
        """The shift (bytes per lane, a multiple of GRANULE, 0 .. lmem - peak) that puts `spans` (a unit's
        first constant loads, as laid out from 0) where the stream touched them longest ago, so the loads can
        move up furthest (hoist_loads); among equals the top or the bottom as `prefer_top` says."""
        room = (self.chip.lmem_size - peak) // GRANULE
        if room <= 0:
            return 0
        spans = [(lo // GRANULE, -(-hi // GRANULE)) for lo, hi in spans if hi > lo]
        if not spans or min(lo for lo, _ in spans) < 0:
            return (room * GRANULE) if prefer_top else 0
        last = np.full(room + 1, -1, np.int64)
        for lo, hi in spans:
            window = sliding_window_view(self.index, hi - lo).max(axis=1)  # window[k]: granules k .. k+width
            last = np.maximum(last, window[lo : lo + room + 1])
        best = np.flatnonzero(last == last.min())
        return int(best[-1] if prefer_top else best[0]) * GRANULE


def _shifted(fp: Footprint, by: int) -> Footprint:
    return Footprint([(lo + by, hi + by) for lo, hi in fp.reads], [(lo + by, hi + by) for lo, hi in fp.writes])


def _moved(engine: int, f: dict[str, int], chip: ChipSpec, by: int) -> dict[str, int] | None:
    """The descriptor with its local operands `by` bytes higher in every lane; None when a field's role is
    unclear (moving it does not move exactly the bytes the descriptor touches)."""
    fp = footprint(engine, f, chip)
    out = dict(f)
    if engine == isa.ENGINE_TIU:
        for name in _TIU_ADDRESSES:
            if name in f:
                trial = {**f, name: f[name] + by}
                if footprint(engine, trial, chip) != fp:  # an operand the op reads or writes
                    out[name] = f[name] + by
    else:
        for side in _TDMA_ADDRESSES.get(int(f.get("trans_dir", 0)), ()):
            out[f"{side}_base_addr_low"] = int(f.get(f"{side}_base_addr_low", 0)) + by
    return out if footprint(engine, out, chip) == _shifted(fp, by) else None


def first_constant_loads(records: list[tuple[int, dict[str, int]]], chip: ChipSpec) -> list[Span]:
    """The local bytes the constant loads before a unit's first TIU op write (what hoist_loads can move up)."""
    spans: list[Span] = []
    for engine, f in records:
        if engine == isa.ENGINE_TIU:
            break
        it = _item(engine, f, chip)
        if it.constant:
            spans += it.local_writes
    return spans


def place_unit(records: list[tuple[int, dict[str, int]]], chip: ChipSpec, touched: LastTouch,
               prefer_top: bool) -> list[tuple[int, dict[str, int]]]:  # fmt: skip
    """A stand-alone kernel's records (laid out from address 0) moved up in local memory to the shift
    LastTouch.best_shift picks; unchanged when an operand cannot be moved."""
    spans = [s for engine, f in records for fp in [footprint(engine, f, chip)] for s in fp.reads + fp.writes]
    if not spans or min(lo for lo, _ in spans) < 0:
        return records
    by = touched.best_shift(first_constant_loads(records, chip), max(hi for _, hi in spans), prefer_top)
    if by == 0:
        return records
    moved = []
    for engine, f in records:
        m = _moved(engine, f, chip, by)
        if m is None:
            return records
        moved.append((engine, m))
    return moved
