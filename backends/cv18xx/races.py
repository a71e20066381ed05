"""A race check for cvimodel command buffers: does every TIU/TDMA pair that touches the same local-memory
byte (at least one of them writing) have its order enforced by the sync ids?

It runs the model on the simulator from the file's bytes, recording the exact lane bytes each descriptor
reads and writes, and holds each access against the other engine's last accesses of those bytes: the
descriptor must be known to start after them. A TIU op is known to run after TDMA #k when some TIU op up to
it waits for an id >= k (each engine runs its stream in order), and likewise for TDMA. Global memory is
touched only by the TDMA, in order, so it cannot race. A 0xFFFF id is a barrier (the runtime's segment end).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuc.backends.cv18xx import isa
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf
from npuc.backends.cv18xx.container import CviModel
from npuc.backends.cv18xx.sim import Machine, load_program, run_routines
from npuc.backends.cv18xx.sim_mem import FORMATS, LocalMemory
from npuc.backends.cv18xx.sync import MAX_ID, sync_ids

_OTHER = {isa.ENGINE_TIU: isa.ENGINE_TDMA, isa.ENGINE_TDMA: isa.ENGINE_TIU}
_NAME = {isa.ENGINE_TIU: "TIU", isa.ENGINE_TDMA: "TDMA"}


@dataclass(frozen=True)
class Race:
    """`engine` #`seq` touches bytes `other` #`other_seq` touched, without waiting for it."""

    routine: int
    offset: int  # byte offset of the descriptor in its cmdbuf
    engine: str
    seq: int
    other: str
    other_seq: int
    kind: str  # "read after write", "write after read", "write after write"

    def __str__(self) -> str:
        return (
            f"routine {self.routine}, byte {self.offset}: {self.engine} #{self.seq} {self.kind} of "
            f"{self.other} #{self.other_seq} without waiting for it"
        )


class _RecordingMemory(LocalMemory):
    """Local memory that also notes the flat (lane * size + offset) bytes of every access."""

    def start(self) -> None:
        self.reads: list[np.ndarray] = []
        self.writes: list[np.ndarray] = []

    def _flat(self, addr: int, shape: tuple, strides: tuple, fmt: str) -> np.ndarray:
        lane, off = self._index(addr, shape, strides, FORMATS[fmt][0])
        return (lane.astype(np.int64) * self.size + off).ravel()

    def read(self, addr: int, shape: tuple, strides: tuple, fmt: str) -> np.ndarray:
        self.reads.append(self._flat(addr, shape, strides, fmt))
        return super().read(addr, shape, strides, fmt)

    def write(self, addr: int, shape: tuple, strides: tuple, fmt: str, values: np.ndarray) -> None:
        self.writes.append(self._flat(addr, shape, strides, fmt))
        super().write(addr, shape, strides, fmt, values)


class _Ledger:
    """Per local byte and engine: the last descriptor (absolute sequence number) that read / wrote it."""

    def __init__(self, size: int) -> None:
        self.read = {e: np.zeros(size, np.int64) for e in _OTHER}
        self.wrote = {e: np.zeros(size, np.int64) for e in _OTHER}

    def violations(self, engine: int, known: int, reads: np.ndarray, writes: np.ndarray) -> list[tuple[int, str]]:
        other = _OTHER[engine]
        found = []
        for kind, idx, table in (
            ("read after write", reads, self.wrote[other]),
            ("write after write", writes, self.wrote[other]),
            ("write after read", writes, self.read[other]),
        ):
            last = int(table[idx].max()) if idx.size else 0
            if last > known:
                found.append((last, kind))
        return found

    def record(self, engine: int, seq: int, reads: np.ndarray, writes: np.ndarray) -> None:
        self.read[engine][reads] = seq
        self.wrote[engine][writes] = seq


def check_cmdbuf(machine: Machine, data: bytes, routine: int) -> list[Race]:
    """Run one cmdbuf on `machine` (whose local memory records accesses) and list its races."""
    lmem = machine.lmem
    assert isinstance(lmem, _RecordingMemory)
    ledger = _Ledger(lmem.lanes * lmem.size)
    seq = dict.fromkeys(_OTHER, 0)
    known = dict.fromkeys(_OTHER, 0)  # per engine: the other engine's descriptors known complete (absolute)
    base = dict.fromkeys(_OTHER, 0)  # absolute sequence number before the current id segment
    races: list[Race] = []
    for ins in split_cmdbuf(data, machine.chip, f"routine {routine}"):
        if ins.engine not in _OTHER:
            continue
        engine, other = ins.engine, _OTHER[ins.engine]
        seq[engine] += 1
        own_id, wait_id = sync_ids(engine, ins.fields)
        if wait_id:
            known[engine] = max(known[engine], base[other] + wait_id)
        lmem.start()
        (machine.tiu if engine == isa.ENGINE_TIU else machine.tdma)(ins.fields)
        reads = np.concatenate(lmem.reads) if lmem.reads else np.zeros(0, np.int64)
        writes = np.concatenate(lmem.writes) if lmem.writes else np.zeros(0, np.int64)
        for other_seq, kind in ledger.violations(engine, known[engine], reads, writes):
            races.append(Race(routine, ins.offset, _NAME[engine], seq[engine], _NAME[other], other_seq, kind))
        ledger.record(engine, seq[engine], reads, writes)
        if own_id == MAX_ID:  # a segment barrier: all issued descriptors complete, ids restart
            base = dict(seq)
            known = {e: seq[_OTHER[e]] for e in _OTHER}
    return races


def find_races(model: CviModel, inputs: dict[str, np.ndarray], program: int = 0) -> list[Race]:
    """Every race in the program's TPU routines, found while running it on `inputs` (CPU routines run too, so
    later routines see real data)."""
    machine = load_program(model, inputs, program)
    machine.lmem = _RecordingMemory(machine.lmem.lanes, machine.lmem.size, machine.lmem.data)
    races: list[Race] = []

    def run_tpu(m: Machine, cmdbuf: bytes, index: int, where: str) -> None:
        races.extend(check_cmdbuf(m, cmdbuf, index))

    run_routines(model, machine, program, run_tpu)
    return races
