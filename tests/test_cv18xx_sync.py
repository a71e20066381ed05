"""Sync ids (sync.py) and the race check (races.py): the checker accepts tpu-mlir's own parallel streams,
catches a missing wait, and the ids npuc assigns wait for exactly the true dependencies."""

from __future__ import annotations

import numpy as np
import pytest
from golden import GOLDEN_ROOT

from npuc.backends.cv18xx import dma, isa, sync, tiu
from npuc.backends.cv18xx.chips import CHIPS
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.emit import CmdStream
from npuc.backends.cv18xx.lmem import GTensor, LocalAllocator
from npuc.backends.cv18xx.races import _RecordingMemory, check_cmdbuf, find_races
from npuc.backends.cv18xx.sim import Machine
from npuc.backends.cv18xx.sim_mem import GlobalMemory
from npuc.backends.cv18xx.timing import schedule_model

GOLDEN = GOLDEN_ROOT / "cv18xx"
CHIP = CHIPS["cv183x"]


def _waits(records: list) -> list[tuple[str, int, int]]:
    return [("TIU" if e == isa.ENGINE_TIU else "TDMA", *sync.sync_ids(e, f)) for e, f in records]


def _two_tiles(sync_mode: str = "parallel") -> CmdStream:
    """Load A, copy A->B, store B; then load C (elsewhere), copy C->D, store D; then load into A again."""
    s = CmdStream(CHIP, sync=sync_mode)
    local = LocalAllocator(CHIP, "test")
    a, b, c, d = (local.tensor((1, 32, 4, 16), "i8") for _ in range(4))
    g = GTensor.contiguous(0, 0, (1, 32, 4, 16), "i8")
    out = GTensor.contiguous(0, 4096, (1, 32, 4, 16), "i8")
    for src, dst in ((a, b), (c, d)):
        dma.load(s, g, src)
        s.tiu(tiu.copy(dst, src))
        dma.store(s, dst, out)
    dma.load(s, g, a)  # overwrites what the first copy read
    return s


def _machine() -> Machine:
    return Machine(CHIP, GlobalMemory({0: np.zeros(8192, np.uint8)}))


def _recording(machine: Machine) -> Machine:
    lmem = machine.lmem
    machine.lmem = _RecordingMemory(lmem.lanes, lmem.size, lmem.data)
    return machine


def test_parallel_ids_wait_for_true_dependencies_only() -> None:
    s = _two_tiles()
    sync.assign_sync(s.records, CHIP, "parallel")
    assert _waits(s.records) == [
        ("TDMA", 1, 0),
        ("TIU", 1, 1),  # reads what TDMA 1 loaded
        ("TDMA", 2, 1),  # stores what TIU 1 wrote
        ("TDMA", 3, 1),  # loads C: depends on nothing, keeps its predecessor's wait
        ("TIU", 2, 3),
        ("TDMA", 4, 2),
        ("TDMA", 5, 2),  # reloads A after TIU 1 read it (monotone: already past TIU 2)
    ]


def test_serial_ids_wait_for_the_latest_of_the_other_engine() -> None:
    s = _two_tiles("serial")
    sync.assign_sync(s.records, CHIP, "serial")
    assert [w[2] for w in _waits(s.records)] == [0, 1, 1, 1, 3, 2, 2]


def test_ids_restart_after_0xffff_with_a_barrier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync, "MAX_ID", 3)
    s = _two_tiles()
    sync.assign_sync(s.records, CHIP, "parallel")
    # TDMA 3 closes a segment: the TDMA numbering restarts and a wait on anything before the barrier is 0
    assert _waits(s.records) == [
        ("TDMA", 1, 0),
        ("TIU", 1, 1),
        ("TDMA", 2, 1),
        ("TDMA", 3, 1),
        ("TIU", 2, 0),  # TDMA 3 (before the barrier) is complete
        ("TDMA", 1, 2),  # TIU 2 is after it
        ("TDMA", 2, 2),
    ]


def test_race_check_accepts_our_ids_and_catches_a_missing_wait() -> None:
    stream = _two_tiles()
    data = stream.to_bytes()
    assert check_cmdbuf(_recording(_machine()), data, 0) == []
    # drop the first TIU's wait: it may now read A before TDMA 1 has filled it
    first_tiu = next(f for engine, f in stream.records if engine == isa.ENGINE_TIU)  # loads may have moved up
    first_tiu["cmd_id_gdma"] = 0
    broken = stream.encode()
    (race,) = check_cmdbuf(_recording(_machine()), broken, 0)
    assert (race.engine, race.seq, race.other, race.other_seq, race.kind) == ("TIU", 1, "TDMA", 1, "read after write")


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.cvimodel")), ids=lambda p: p.stem)
def test_tpu_mlir_streams_overlap_and_have_no_race(path) -> None:
    """tpu-mlir's cvimodels use cvikernel's parallel mode (some descriptors wait for less than the latest
    of the other engine), and the checker finds them race-free: its ordering rules match the vendor's."""
    model = read_cvimodel(path)
    chip = CHIPS[model.chip]
    relaxed = 0
    for data in model.cmdbufs().values():
        latest = {isa.ENGINE_TIU: 0, isa.ENGINE_TDMA: 0}
        for ins in split_cmdbuf(data, chip, path.name):
            tiu_op = ins.engine == isa.ENGINE_TIU
            own, wait = sync.sync_ids(ins.engine, ins.fields)
            relaxed += wait < latest[isa.ENGINE_TDMA if tiu_op else isa.ENGINE_TIU]
            latest[ins.engine] = own
    assert relaxed >= 10
    prog = model.body.programs[0]
    shapes = {t.name: tuple(t.shape.dim[:4]) for t in prog.tensor_map}
    rng = np.random.default_rng(7)
    feeds = {name: rng.uniform(-1.0, 1.0, shapes[name]).astype(np.float32) for name in prog.input_tensors}
    assert find_races(model, feeds) == []
    timing = schedule_model(model)
    assert timing.scheduled < timing.serial


def test_an_int8_mac_adding_a_16_bit_sum_reads_its_high_plane() -> None:
    """mac with opt_res_add reads the 16-bit accumulator (both byte planes) even when it writes an int8
    result: a load into the high plane must wait for it."""
    lo = (1, 32, 4, 16)
    fields = {"tsk_typ": 3, "tsk_eu_typ": 1, "opt_res_add": 1, "opt_res0_seg": 1, "opt_opd1_const": 1,
              "res0_addr": 0, "opd0_addr": 4096, "res0_b_str": 2048,
              **{f"{p}_{d}": v for p in ("res0", "opd0", "opd1") for d, v in zip("nchw", lo)}}  # fmt: skip
    fp = sync.tiu_footprint(fields, CHIP)
    assert any(a <= 2048 < b for a, b in fp.reads)
