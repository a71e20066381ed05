"""Seeded mutation fuzzing of the BM1880 bmodel readers and cmdbuf decoder.

Every mutated file must either parse or raise CorruptFileError (UnsupportedError for well-formed but
unsupported content) — never another exception or a hang.
"""

from __future__ import annotations

import random

import pytest
from golden import GOLDEN_ROOT
from mutation import mutate

from npuc.backends.bm1880.cmdbuf import decode_cmdbuf, gmem_refs
from npuc.backends.bm1880.container import load_bmodel, read_bmodel, write_bmodel
from npuc.backends.bm1880.inspect import describe_bmodel
from npuc.compiler.errors import CorruptFileError, UnsupportedError

GOLDEN = GOLDEN_ROOT / "bm1880"
MUTATIONS = 1000  # per container


def _containers() -> dict[str, bytes]:
    det1 = GOLDEN / "mtcnn_det1_nchw.bmodel"
    return {
        "0xFF55AADD shared weight": (GOLDEN / "mtcnn_pnet_multishape.bmodel").read_bytes(),
        "0xFF55AADD blob per command": det1.read_bytes(),
        "0xFF55AAFF": write_bmodel(load_bmodel(det1), embed_weights=True),
        "json": (GOLDEN / "mtcnn_det1_1_3_12_12_json.bmodel").read_bytes(),
    }


def _exercise(data: bytes, original, deep: bool) -> str:
    """Read, then decode every cmdbuf that differs from the unmutated file's; return the outcome."""
    try:
        model = read_bmodel(data, "fuzz.bmodel")
        known = {c.cmdbuf for c in original.commands}
        for command in model.commands:
            if command.cmdbuf not in known:
                for instruction in decode_cmdbuf(command.cmdbuf):
                    gmem_refs(instruction)
        if deep:
            describe_bmodel(model, disasm=True)
    except (CorruptFileError, UnsupportedError):
        return "rejected"
    return "parsed"


@pytest.mark.parametrize("name", list(_containers()))
def test_mutations_parse_or_raise_corrupt(name):
    data = _containers()[name]
    original = read_bmodel(data)
    rng = random.Random(f"bm1880-fuzz-{name}")
    outcomes = {"parsed": 0, "rejected": 0}
    for _ in range(MUTATIONS):
        outcomes[_exercise(mutate(data, rng, 600, 0.5), original, deep=name == "json")] += 1
    assert outcomes["parsed"] + outcomes["rejected"] == MUTATIONS
    assert outcomes["rejected"] > MUTATIONS // 10  # the header-aimed half must trip the validators


def test_truncation_at_every_header_byte():
    # 0xFF55AAFF has no length field, so a cut at a protobuf field boundary can still parse: only the
    # length-prefixed containers must reject every truncation
    for name, data in _containers().items():
        original = read_bmodel(data)
        outcomes = [_exercise(data[:size], original, deep=False) for size in range(700)]
        if name == "0xFF55AAFF":
            assert outcomes.count("rejected") >= 690
        else:
            assert outcomes == ["rejected"] * 700, name
