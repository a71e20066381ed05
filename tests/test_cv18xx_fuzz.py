"""Seeded mutations of a tpu-mlir cvimodel: each must parse or raise CorruptFileError, nothing else."""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Callable

from golden import GOLDEN_ROOT

from npuc.backends.cv18xx.chips import CHIPS
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.inspect import describe_cvimodel
from npuc.compiler.errors import CorruptFileError

GOLDEN = GOLDEN_ROOT / "cv18xx"
SOURCE = GOLDEN / "smallcnn_cv181x_int8.cvimodel"  # has a CPU routine with nested arguments
ROUNDS_PER_KIND = 500


def _fix_md5(data: bytearray) -> bytearray:
    data[14:30] = hashlib.md5(data[48:]).digest()
    return data


def _mutators(data: bytes) -> dict[str, Callable[[random.Random], bytes]]:
    body_size = struct.unpack_from("<I", data, 8)[0]
    body_end = 48 + body_size
    # Where the Section tables keep their offset/size: u32 fields holding the known values.
    model = read_cvimodel(data)
    wanted = ({s.offset for s in model.body.sections} | {s.size for s in model.body.sections}) - {0}
    section_slots = [
        p for p in range(48, body_end - 3) if struct.unpack_from("<I", data, p)[0] in wanted and p % 4 == 0
    ]

    def truncate(rng: random.Random) -> bytes:
        cut = bytearray(data[: rng.randrange(len(data))])
        return bytes(_fix_md5(cut) if rng.random() < 0.7 and len(cut) >= 48 else cut)

    def bit_flips(rng: random.Random) -> bytes:
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(_fix_md5(out) if rng.random() < 0.9 else out)

    def header_bytes(rng: random.Random) -> bytes:
        out = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            out[rng.randrange(48)] = rng.randrange(256)
        return bytes(out)

    def body_offsets(rng: random.Random) -> bytes:
        out = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            pos = 48 + 4 * rng.randrange(body_size // 4)
            old = struct.unpack_from("<I", out, pos)[0]
            new = rng.choice(
                [0, 0xFFFFFFFF, 0x7FFFFFFF, rng.randrange(1 << 32), (old + rng.randint(-64, 64)) % (1 << 32)]
            )
            struct.pack_into("<I", out, pos, new)
        return bytes(_fix_md5(out))

    def section_table(rng: random.Random) -> bytes:
        out = bytearray(data)
        pos = rng.choice(section_slots)
        new = rng.choice([0, 1, 0xFFFFFFFF, rng.randrange(1 << 32), rng.randrange(len(data))])
        struct.pack_into("<I", out, pos, new)
        return bytes(_fix_md5(out))

    def cmdbuf_bytes(rng: random.Random) -> bytes:
        out = bytearray(data)
        cmd = model.section_record("subfunc_1")
        start = body_end + cmd.offset
        for _ in range(rng.randint(1, 4)):
            out[start + rng.randrange(cmd.size)] = rng.randrange(256)
        return bytes(_fix_md5(out))

    return {
        "truncate": truncate,
        "bit_flips": bit_flips,
        "header_bytes": header_bytes,
        "body_offsets": body_offsets,
        "section_table": section_table,
        "cmdbuf_bytes": cmdbuf_bytes,
    }


def _exercise(blob: bytes) -> str:
    """Read, decode every cmdbuf and describe; returns how far it got."""
    try:
        model = read_cvimodel(blob)
    except CorruptFileError:
        return "rejected"
    try:
        chip = CHIPS[model.chip]
        for name, data in model.cmdbufs().items():
            split_cmdbuf(data, chip, name)
        describe_cvimodel(model, disasm=True)
    except CorruptFileError:
        return "cmdbuf rejected"
    return "parsed"


def test_fuzz_never_crashes() -> None:
    data = SOURCE.read_bytes()
    mutators = _mutators(data)
    assert len(mutators) == 6
    outcomes: dict[str, int] = {}
    failures = []
    for kind_index, (kind, mutate) in enumerate(mutators.items()):
        for i in range(ROUNDS_PER_KIND):
            rng = random.Random(kind_index * 100_000 + i)
            blob = mutate(rng)
            try:
                outcome = _exercise(blob)
            except Exception as exc:  # noqa: BLE001 - the point is to catch anything unexpected
                failures.append(f"{kind} seed {i}: {type(exc).__name__}: {exc}")
                continue
            outcomes[f"{kind}:{outcome}"] = outcomes.get(f"{kind}:{outcome}", 0) + 1
    assert failures == [], failures[:5]
    assert sum(outcomes.values()) == 6 * ROUNDS_PER_KIND
    # every kind of damage is caught at least sometimes, and some mutations still parse
    for kind in mutators:
        assert outcomes.get(f"{kind}:rejected", 0) + outcomes.get(f"{kind}:cmdbuf rejected", 0) > 0, kind
    assert outcomes.get("truncate:parsed", 0) == 0


def _run_damaged(data: bytes, section: str, damage, rounds: int, seed: int) -> dict[str, int]:  # noqa: ANN001
    """Simulate `data` `rounds` times, each with `damage(rng, round, bytes)` applied to one section; counts of
    "ran" and of each UserError kind raised (anything else propagates and fails the test)."""
    import numpy as np

    from npuc.backends.cv18xx.sim import run_cvimodel
    from npuc.compiler.errors import UserError

    with np.load(GOLDEN / "smallcnn_in.npz") as d:
        inputs = {"input": d["input"]}
    outcomes: dict[str, int] = {}
    for i in range(rounds):
        model = read_cvimodel(data)
        raw = bytearray(model.sections[section])
        damage(random.Random(seed + i), i, raw)
        model.sections[section] = bytes(raw)
        try:
            run_cvimodel(model, inputs)
            outcome = "ran"
        except UserError as exc:
            outcome = type(exc).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


def test_simulator_on_damaged_cmdbufs_raises_only_user_errors() -> None:
    def damage(rng: random.Random, _round: int, cmdbuf: bytearray) -> None:
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(cmdbuf))
            if pos % 72 >= 8:  # TIU and TDMA records are 72 bytes apart here; keep their headers valid
                cmdbuf[pos] = rng.randrange(256)

    data = (GOLDEN / "smallcnn_cv182x_int8.cvimodel").read_bytes()
    outcomes = _run_damaged(data, "subfunc_1", damage, 80, 10_000)
    assert set(outcomes) <= {"ran", "CorruptFileError", "UnsupportedError"}
    assert outcomes.get("ran", 0) > 0 and outcomes.get("CorruptFileError", 0) > 0


def test_simulator_on_damaged_compressed_filters_raises_only_corrupt_file_errors() -> None:
    """npuc's bf16 smallcnn stores its filters as VLC buffers: bytes flipped in them (headers, k-maps,
    streams) either still decode or are rejected with CorruptFileError."""
    from cv18xx_smallcnn import build_smallcnn

    data, summary = build_smallcnn("cv181x", "bf16")
    assert summary["tdma_decompressing"] >= 3
    buffers = [e for e in read_cvimodel(data).body.weight_map if e.name.endswith("_vlc")]
    assert buffers

    def damage(rng: random.Random, i: int, weight: bytearray) -> None:
        entry = buffers[i % len(buffers)]
        start = entry.offset & (1 << 40) - 1
        for _ in range(rng.randint(1, 4)):  # odd rounds hit the header and k-map, even ones anywhere
            weight[start + rng.randrange(min(entry.size, 64) if i % 2 else entry.size)] = rng.randrange(256)

    outcomes = _run_damaged(data, "weight", damage, 60, 20_000)
    assert set(outcomes) <= {"ran", "CorruptFileError"}, outcomes
    assert outcomes.get("ran", 0) > 0 and outcomes.get("CorruptFileError", 0) > 0, outcomes
