"""TIU/TDMA sync ids (specs/cv18xx.md §3.2): which local-memory bytes each descriptor touches, and the ids.

The two engines run side by side; a descriptor waits for an id of the other engine, and each engine runs its
own descriptors in order. cvikernel's *serial* scheme makes every descriptor wait for the latest descriptor
of the other engine, so nothing overlaps. The *parallel* scheme (the default here) waits only for true
dependencies: a TIU op waits for the TDMA transfers that wrote what it reads or that still read or write
what it overwrites, and a TDMA transfer likewise for TIU ops. Global memory needs no ids: only the TDMA
touches it, in order.

Footprints come from the descriptor fields alone, with the simulator's operand semantics (sim_tiu.py,
sim.py), as per-lane byte intervals [lo, hi) that ignore which lanes are used: conservative, never short.
`races.py` checks the result against the bytes the simulator really touches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from npuc.backends.cv18xx import isa
from npuc.backends.cv18xx.chips import ChipSpec
from npuc.backends.cv18xx.cmdbuf import tiu_op_name
from npuc.backends.cv18xx.sim_mem import default_strides
from npuc.backends.cv18xx.sim_tiu import normalize_tiu_fields

MAX_ID = 0xFFFF  # ids are 16 bits; numbering restarts at 1 and the runtime puts a barrier there
GRANULE = 16  # dependency tracking resolution in bytes (conservative: spans are widened to granules)
SYNC_MODES = ("parallel", "serial")

Span = tuple[int, int]
# Per engine: the field holding a descriptor's own id and the field holding the other engine's id it waits for.
ID_FIELDS = {isa.ENGINE_TIU: ("cmd_id_tpu", "cmd_id_gdma"), isa.ENGINE_TDMA: ("cmd_id", "wait_id_tpu")}


def sync_ids(engine: int, fields: Mapping[str, int]) -> tuple[int, int]:
    """(own id, awaited id of the other engine) of a TIU or TDMA descriptor."""
    own, wait = ID_FIELDS[engine]
    return fields[own], fields[wait]


@dataclass
class Footprint:
    """Per-lane byte intervals a descriptor reads and writes."""

    reads: list[Span] = field(default_factory=list)
    writes: list[Span] = field(default_factory=list)


class _Fields:
    """Read access to a descriptor's fields where an absent field is 0 (as the encoder writes it)."""

    def __init__(self, fields: Mapping[str, int]) -> None:
        self.f = fields

    def __getitem__(self, key: str) -> int:
        return int(self.f.get(key, 0))

    def shape(self, p: str) -> tuple[int, int, int, int]:
        return tuple(self[f"{p}_{d}"] for d in "nchw")  # type: ignore[return-value]


def span(chip: ChipSpec, addr: int, shape: tuple[int, ...], strides: tuple[int, ...], esz: int) -> Span:
    """The per-lane bytes of a local operand starting at `addr` (lane * lmem_size + offset)."""
    start_lane, local = divmod(int(addr), chip.lmem_size)
    n, c, h, w = (int(d) for d in shape)
    if min(n, c, h, w) <= 0:
        return (local, local)
    last_channel_row = (start_lane + c - 1) // chip.lanes
    reach = (n - 1) * strides[0] + last_channel_row * strides[1] + (h - 1) * strides[2] + (w - 1) * strides[3]
    low = local + min(0, (n - 1) * strides[0], (h - 1) * strides[2], (w - 1) * strides[3])
    return (low, local + max(reach, 0) + esz)


# ---- TIU -------------------------------------------------------------------------------------------------


def _tiu_strides(f: _Fields, chip: ChipSpec, p: str, shape: tuple[int, ...], esz: int) -> tuple[int, ...]:
    if f[f"short_{p}_str"] == 3:
        return tuple(f[f"{p}_{d}_str"] for d in "nchw")
    return default_strides(shape, esz, chip.lanes, chip.eu_bytes)


def _operand(f: _Fields, chip: ChipSpec, p: str, esz: int, shape: tuple[int, ...] | None = None) -> Span:
    shape = shape or f.shape(p)
    return span(chip, f[f"{p}_addr"], shape, _tiu_strides(f, chip, p, shape, esz), esz)


def _conv_weights(f: _Fields, chip: ChipSpec, esz: int) -> list[Span]:
    ic, oc, kh, kw = f.shape("opd1")  # packed per output channel as [kh][kw][ic]
    return [span(chip, f["opd1_addr"], (1, oc, kh * kw, ic), (0, kh * kw * ic * esz, ic * esz, esz), esz)]


def _opd1_unless_const(f: _Fields, chip: ChipSpec, esz: int) -> list[Span]:
    return [] if f["opt_opd1_const"] else [_operand(f, chip, "opd1", esz)]


def _matmul_right(f: _Fields, chip: ChipSpec, esz: int) -> list[Span]:
    k, c1, _, w1 = f.shape("opd1")
    return [_operand(f, chip, "opd1", esz, (k, c1, 1, w1))]


def _channel_params(f: _Fields, chip: ChipSpec, esz: int) -> list[Span]:
    """The bias / requantization operand of conv, depthwise and pooling (sim_tiu._finish)."""
    oc = f["res0_c"]
    if esz == 2:
        if f["tsk_opd_num"] != 3:
            return []
        strides = default_strides((1, oc, 1, 1), 2, chip.lanes, chip.eu_bytes, eu_align=False)
        return [span(chip, f["opd2_addr"] + off, (1, oc, 1, 1), strides, 2) for off in (0, f["opd2_b_str"])]
    if not f["opt_chl_quan"]:
        return []
    rec = 9 if f["tsk_opd_num"] == 3 else 5
    return [span(chip, f["opd2_addr"], (1, oc, 1, rec), (0, rec, 0, 1), 1)]


def _matmul_bias(f: _Fields, chip: ChipSpec, esz: int) -> list[Span]:
    if f["tsk_opd_num"] != 3:
        return []
    _, c1, _, w1 = f.shape("opd1")
    planes = 2 if esz == 2 else (4 if f["opt_chl_quan"] else 2)
    return [_operand(f, chip, "opd2", esz if esz == 2 else 1, (planes, c1, 1, w1))]


OperandRule = Callable[[_Fields, ChipSpec, int], list[Span]]
# Per TIU operation: the operands it reads besides opd0 (every operation reads opd0 and writes res0).
TIU_EXTRA_READS: dict[str, tuple[OperandRule, ...]] = {
    "conv": (_conv_weights, _channel_params),
    "depthwise": (_opd1_unless_const, _channel_params),
    "max_pool": (),
    "avg_pool": (_channel_params,),
    "matmul": (_matmul_right, _matmul_bias),
    "mul": (_opd1_unless_const,),
    "mac": (_opd1_unless_const,),
    "and": (_opd1_unless_const,),
    "or": (_opd1_unless_const,),
    "xor": (_opd1_unless_const,),
    "copy": (),
    "max": (_opd1_unless_const,),
    "min": (_opd1_unless_const,),
    "lookup": (lambda f, chip, esz: [_operand(f, chip, "opd1", esz)],),
}


def _high_plane(f: _Fields, chip: ChipSpec) -> Span:
    shape = f.shape("res0")
    return span(chip, f["res0_addr"] + f["res0_b_str"], shape, _tiu_strides(f, chip, "res0", shape, 1), 1)


def _result(f: _Fields, chip: ChipSpec, esz: int) -> list[Span]:
    """res0, and its high byte plane when an int8 operation keeps a 16-bit result."""
    spans = [_operand(f, chip, "res0", esz)]
    if esz == 1 and f["opt_res0_seg"] == 0:
        spans.append(_high_plane(f, chip))
    return spans


def tiu_footprint(fields: Mapping[str, int], chip: ChipSpec) -> Footprint:
    f = _Fields(normalize_tiu_fields(dict(fields)))
    op = tiu_op_name({"tsk_typ": f["tsk_typ"], "tsk_eu_typ": f["tsk_eu_typ"], "tens_lookup": f["tens_lookup"]})
    esz = 2 if f["opd_typ"] else 1
    reads = [_operand(f, chip, "opd0", esz)]
    for rule in TIU_EXTRA_READS.get(op, (_opd1_unless_const, _channel_params)):
        reads += rule(f, chip, esz)
    writes = _result(f, chip, esz)
    if op == "mac":  # accumulates into res0
        reads += writes
        if esz == 1 and f["opt_res_add"] and f["opt_res0_seg"]:  # a 16-bit sum in, an int8 result out
            reads.append(_high_plane(f, chip))
    return Footprint(reads, writes)


# ---- TDMA ------------------------------------------------------------------------------------------------

_TDMA_ESZ = {1: 1, 2: 2}
_LOCAL_SIDES = {0: ("dst",), 1: ("src",), 2: (), 3: ("src", "dst")}  # by trans_dir


def _tdma_local(f: _Fields, chip: ChipSpec, side: str) -> Span:
    esz = _TDMA_ESZ.get(f[f"{side}_fmt"], 1)
    c = f["dst_c"] if side == "dst" else f["src_c"]
    h, w = (1, f[f"{side}_w"]) if f["sys_dtype"] else (f[f"{side}_h"], f[f"{side}_w"])
    strides = (
        f[f"{side}_n_stride"],
        f[f"{side}_c_stride_low"] | (f[f"{side}_c_stride_high"] << 16),
        f[f"{side}_h_stride"],
        esz,
    )
    addr = (f[f"{side}_base_addr_high"] << 32) | f[f"{side}_base_addr_low"]
    return span(chip, addr, (f["src_n"], c, h, w), strides, esz)


def tdma_footprint(fields: Mapping[str, int], chip: ChipSpec) -> Footprint:
    f = _Fields(fields)
    sides = _LOCAL_SIDES.get(f["trans_dir"], ())
    fp = Footprint()
    if "src" in sides:
        fp.reads.append(_tdma_local(f, chip, "src"))
    if "dst" in sides:
        dst = _tdma_local(f, chip, "dst")
        fp.writes.append(dst)
        if f["sys_dtype"]:  # a matrix load merges its rows into the destination (read-modify-write)
            fp.reads.append(dst)
    return fp


def footprint(engine: int, fields: Mapping[str, int], chip: ChipSpec) -> Footprint:
    return (tiu_footprint if engine == isa.ENGINE_TIU else tdma_footprint)(fields, chip)


# ---- id assignment ---------------------------------------------------------------------------------------


def _granules(spans: Iterable[Span]) -> list[slice]:
    return [slice(lo // GRANULE, -(-hi // GRANULE)) for lo, hi in spans if hi > lo]


class _Tracker:
    """Per local-memory granule: the last descriptor (absolute sequence number) of each engine that read it
    and that wrote it."""

    def __init__(self, chip: ChipSpec) -> None:
        size = -(-chip.lmem_size // GRANULE)
        self.read = {e: np.zeros(size, np.int64) for e in (isa.ENGINE_TIU, isa.ENGINE_TDMA)}
        self.wrote = {e: np.zeros(size, np.int64) for e in (isa.ENGINE_TIU, isa.ENGINE_TDMA)}

    def needs(self, other: int, fp: Footprint) -> int:
        """The latest descriptor of `other` that this footprint must wait for."""
        need = 0
        for s in _granules(fp.reads):
            if s.stop > s.start:
                need = max(need, int(self.wrote[other][s].max()))
        for s in _granules(fp.writes):
            if s.stop > s.start:
                need = max(need, int(self.wrote[other][s].max()), int(self.read[other][s].max()))
        return need

    def record(self, engine: int, seq: int, fp: Footprint) -> None:
        for s in _granules(fp.reads):
            self.read[engine][s] = seq
        for s in _granules(fp.writes):
            self.wrote[engine][s] = seq


def assign_sync(records: list[tuple[int, dict[str, int]]], chip: ChipSpec, mode: str = "parallel") -> None:
    """Write each descriptor's own id and wait id into its fields (in place), in `mode`.

    Waits only grow along each engine's stream (a descriptor runs after its predecessor anyway), so a TDMA
    without a dependency of its own keeps its predecessor's wait, as cvikernel does. Ids restart at 1 after
    0xFFFF, where the runtime inserts a barrier: a wait on a descriptor before the barrier is met and is 0."""
    if mode not in SYNC_MODES:
        raise ValueError(f"unknown sync mode {mode!r}")
    tracker = _Tracker(chip)
    seq = {isa.ENGINE_TIU: 0, isa.ENGINE_TDMA: 0}  # absolute sequence numbers
    wait = {isa.ENGINE_TIU: 0, isa.ENGINE_TDMA: 0}  # latest absolute wait of each engine (monotone)
    barrier = {isa.ENGINE_TIU: 0, isa.ENGINE_TDMA: 0}  # sequence numbers complete at the latest barrier
    for engine, f in records:
        other = isa.ENGINE_TDMA if engine == isa.ENGINE_TIU else isa.ENGINE_TIU
        seq[engine] += 1
        if mode == "serial":
            need = seq[other]
        else:
            fp = footprint(engine, f, chip)
            need = tracker.needs(other, fp)
            tracker.record(engine, seq[engine], fp)
        wait[engine] = max(wait[engine], need)
        own_id = (seq[engine] - 1) % MAX_ID + 1
        wait_id = 0 if wait[engine] <= barrier[other] else (wait[engine] - 1) % MAX_ID + 1
        own_field, wait_field = ID_FIELDS[engine]
        f[own_field], f[wait_field] = own_id, wait_id
        if own_id == MAX_ID:  # the runtime's segment barrier: everything issued so far completes
            barrier = dict(seq)
