"""BMKernel cmdbuf codec: every vendor command decodes, re-encodes byte for byte, and is relocatable."""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
from golden import GOLDEN_ROOT

from npuc.backends.bm1880 import isa
from npuc.backends.bm1880.cmdbuf import (
    decode_cmdbuf,
    disassemble,
    encode_cmdbuf,
    gdma_direction,
    gmem_refs,
    make_instruction,
    relocate,
)
from npuc.backends.bm1880.container import load_bmodel
from npuc.compiler.errors import CorruptFileError

GOLDEN = GOLDEN_ROOT / "bm1880"
FILES = ["mtcnn_pnet_multishape.bmodel", "mtcnn_det1_nchw.bmodel", "mtcnn_det1_1_3_12_12_json.bmodel"]
# (BD, GDMA) instruction counts over all commands, and GDMA (direction, flags) counts
EXPECTED = {
    "mtcnn_pnet_multishape.bmodel": (456, 211, {("S2L", 2): 143, ("S2L", 1): 24, ("L2S", 1): 44}),
    "mtcnn_det1_nchw.bmodel": (286, 104, {("S2L", 2): 65, ("S2L", 1): 13, ("L2S", 1): 26}),
    "mtcnn_det1_1_3_12_12_json.bmodel": (22, 16, {("S2L", 2): 13, ("S2L", 1): 1, ("L2S", 1): 2}),
}


@cache
def decoded(name: str):
    model = load_bmodel(GOLDEN / name)
    return model, [decode_cmdbuf(c.cmdbuf, f"{name} command {i}") for i, c in enumerate(model.commands)]


def test_field_tables_cover_descriptors():
    assert (isa.BD.size, isa.GDMA.size, isa.CMD_HDR.size) == (112, 64, 8)
    assert sum(w for _, _, w in isa.BD.fields) == 896 and sum(w for _, _, w in isa.GDMA.fields) == 512
    assert isa.GDMA.width("src_addr") == 40 and isa.GDMA.width("dst_c_stride") == 32
    with pytest.raises(ValueError, match="overlap"):
        isa.FieldTable("t", 1, (("a", 0, 5), ("b", 4, 4)))
    with pytest.raises(ValueError, match="do not cover"):
        isa.FieldTable("t", 1, (("a", 0, 7),))


def test_split_field_codec():
    raw = isa.GDMA.encode({"src_addr": 0x1_2345_6789, "dst_c_stride": 0xABCD_0123})
    words = [int.from_bytes(raw[i : i + 4], "little") for i in range(0, 64, 4)]
    assert words[12] == 0x2345_6789 and words[13] == 0x0100_0000  # src addr low32, high8 at 0x34[31:24]
    assert words[4] == 0x0123_0000 and words[14] == 0xABCD_0000  # dst c-stride low16 / high16
    assert isa.GDMA.decode(raw)["src_addr"] == 0x1_2345_6789
    with pytest.raises(ValueError, match="does not fit 40 bits"):
        isa.GDMA.encode({"src_addr": 1 << 40})
    with pytest.raises(ValueError, match="no field"):
        isa.BD.encode({"nope": 1})


@pytest.mark.parametrize("name", FILES)
def test_every_command_decodes_and_reencodes(name):
    model, programs = decoded(name)
    counts = Counter()
    for command, program in zip(model.commands, programs, strict=True):
        assert encode_cmdbuf(program) == command.cmdbuf
        for instruction in program:
            counts[instruction.mnemonic] += 1
            table = isa.ENGINES[instruction.engine].table
            assert table.encode(table.decode(instruction.payload)) == instruction.payload
            assert instruction.header["magic"] == 0xA5 and instruction.header["len"] == table.size
    bd, gdma, _ = EXPECTED[name]
    assert counts == {"BD": bd, "GDMA": gdma}


@pytest.mark.parametrize("name", FILES)
def test_gdma_addresses_follow_relocation_convention(name):
    model, programs = decoded(name)
    seen = Counter()
    for command, program in zip(model.commands, programs, strict=True):
        areas = {"neuron": command.neuron_size, "weight": len(model.weight_for(command))}
        for instruction in (i for i in program if i.engine == isa.ENGINE_GDMA):
            fields = instruction.fields
            seen[(gdma_direction(instruction), instruction.flags)] += 1
            assert fields["valid"] == 1 and fields["special_func"] == 0
            (ref,) = gmem_refs(instruction)
            assert fields[ref.operand] >> 32 == 1  # 0x1_0000_0000 + offset
            # the other side is lmem in NPU 0's window
            lmem = fields["dst_addr" if ref.operand == "src_addr" else "src_addr"]
            assert isa.LMEM_BASE <= lmem < isa.LMEM_BASE + isa.LMEM_SIZE
            side = ref.operand[:3]
            last = (
                (fields["src_n"] - 1) * fields[f"{side}_n_stride"]
                + (fields[f"{side}_c"] - 1) * fields[f"{side}_c_stride"]
                + (fields[f"{side}_h"] - 1) * fields[f"{side}_h_stride"]
                + fields[f"{side}_w"]
            )
            assert ref.offset + last <= areas[ref.area]  # the whole tensor lies inside its area
    assert seen == EXPECTED[name][2]


def test_known_descriptor_values():
    model, programs = decoded("mtcnn_det1_1_3_12_12_json.bmodel")
    bias, weight, data, conv = programs[0][:4]
    assert bias.flags == isa.FLAG_WEIGHT and bias.fields["src_addr"] == 0x1_0000_010E
    assert (bias.fields["dst_addr"], bias.fields["src_n"], bias.fields["src_c"]) == (0x0800_0075, 2, 10)
    assert weight.fields["src_c_stride"] == 27 and (weight.fields["src_h"], weight.fields["src_w"]) == (9, 3)
    assert data.flags == isa.FLAG_NEURON and data.fields["src_addr"] == 0x1_0000_0000
    assert [g.fields["cmd_id"] for g in (bias, weight, data)] == [1, 2, 3]
    assert conv.engine == isa.ENGINE_BD
    f = conv.fields
    assert (f["tsk_typ"], f["tsk_opd_num"], f["opt_right_shift"], f["cmd_id_tpu"], f["cmd_id_gdma"]) == (
        0,
        3,
        7,
        1,
        3,
    )
    assert (f["opt_opd2_int8"], f["opt_res0_int8"], f["res0_addr"], f["opd0_addr"]) == (0, 1, 0x110, 0x80)
    assert [i.fields["tsk_eu_typ"] for i in programs[0][6:8]] == [4, 0]  # PReLU: MAX then MUL


def test_relocate_adds_area_bases():
    model, programs = decoded("mtcnn_det1_1_3_12_12_json.bmodel")
    cmdbuf = model.commands[0].cmdbuf
    moved = decode_cmdbuf(relocate(cmdbuf, neuron_base=0x4000_0000, weight_base=0x2000))
    assert moved[0].fields["src_addr"] == 0x2000 + 0x10E and moved[0].fields["dst_addr"] == 0x0800_0075
    assert moved[2].fields["src_addr"] == 0x4000_0000
    stores = [i for i in moved if i.engine == isa.ENGINE_GDMA and i.fields["direction"] == 1]
    assert [s.fields["dst_addr"] for s in stores] == [0x4000_0000 + 436, 0x4000_0000 + 432]
    # only the gmem address fields changed
    for before, after in zip(programs[0], moved, strict=True):
        changed = {k for k in before.fields if before.fields[k] != after.fields[k]}
        assert changed <= {"src_addr", "dst_addr"}


def test_disassemble_lines():
    model, programs = decoded("mtcnn_det1_1_3_12_12_json.bmodel")
    lines = disassemble(model.commands[0].cmdbuf).splitlines()
    assert len(lines) == 38
    assert lines[0].startswith("000000  GDMA S2L        id=1 wait_bd=0 weight+0x10E 2x10x1x1 -> lmem:0x75 10x1x1 |")
    assert lines[3].startswith("0000D8  BD   conv       id=1 wait_gdma=3 res0=1x10x10x10@0x110 opd0=1x3x12x12@0x80")
    assert lines[-1].startswith("000E88  GDMA L2S        id=16 wait_bd=22 lmem:0x0 1x4x1x1 -> neuron+0x1B0 4x1x1")


def test_make_instruction_and_cpu_payload():
    load = make_instruction(
        isa.ENGINE_GDMA,
        {"valid": 1, "cmd_id": 7, "src_addr": isa.gmem_address(0x10), "dst_addr": isa.lmem_address(0x20)},
        flags=isa.FLAG_WEIGHT,
    )
    raw = load.encode()
    assert raw[:8] == bytes([0xA5, 64, 2, 2, 0, 0, 0, 0]) and len(raw) == 72
    cpu = bytes([0xA5, 224, 1, 0, 0, 0, 0, 0]) + b"\x07" * 224
    program = decode_cmdbuf(raw + cpu)
    assert [i.mnemonic for i in program] == ["GDMA", "CPU"] and program[1].fields is None
    assert gmem_refs(program[0])[0].offset == 0x10 and encode_cmdbuf(program) == raw + cpu
    long_form = bytes([0xA5, 0, 1, 0]) + (4).to_bytes(4, "little") + b"abcd"  # len 0: length in mask
    assert decode_cmdbuf(long_form)[0].payload == b"abcd"


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (bytes([0xA4, 112, 0, 0, 0, 0, 0, 0]) + bytes(112), "magic 0xA4"),
        (bytes([0xA5, 64, 3, 0, 0, 0, 0, 0]) + bytes(64), "unknown engine id 3"),
        (bytes([0xA5, 64, 0, 0, 0, 0, 0, 0]) + bytes(64), "BD command of 64 bytes, expected 112"),
        (bytes([0xA5, 64, 2, 1, 0, 0, 0, 0]) + bytes(10), "runs past the end"),
        (bytes([0xA5, 64, 2]), "truncated command header"),
    ],
)
def test_corrupt_cmdbuf(raw, fragment):
    with pytest.raises(CorruptFileError, match=fragment):
        decode_cmdbuf(raw)


def test_gdma_without_area_flag_is_rejected():
    bad = make_instruction(isa.ENGINE_GDMA, {"src_addr": isa.gmem_address(0)}, flags=0)
    with pytest.raises(CorruptFileError, match="expected 1 \\(neuron\\) or 2 \\(weight\\)"):
        gmem_refs(bad)
    low = make_instruction(isa.ENGINE_GDMA, {"src_addr": 0x10}, flags=isa.FLAG_NEURON)
    with pytest.raises(CorruptFileError, match="not a relocatable gmem address"):
        gmem_refs(low)
