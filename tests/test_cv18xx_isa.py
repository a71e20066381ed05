"""CV18xx instruction codec: field tables, cmdbuf split, exact re-encoding, disassembly of golden cmdbufs."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden import GOLDEN_ROOT

from npuc.backends.cv18xx import isa
from npuc.backends.cv18xx.chips import CHIPS, ChipSpec
from npuc.backends.cv18xx.cmdbuf import Instruction, decode_summary, disassemble, join_cmdbuf, split_cmdbuf
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.compiler.errors import CorruptFileError

GOLDEN = GOLDEN_ROOT / "cv18xx"
FILES = sorted(GOLDEN.glob("*.cvimodel"))

# stem -> (TIU count, TDMA count)
COUNTS = {
    "smallcnn_cv180x_int8": (18, 30),
    "smallcnn_cv181x_bf16": (15, 22),
    "smallcnn_cv181x_int8": (14, 20),
    "smallcnn_cv182x_int8": (14, 20),
    "smallcnn_cv183x_bf16": (14, 20),
    "smallcnn_cv183x_int8": (13, 18),
    "onet_tpumlir_cv183x_bf16": (57, 58),
    "onet_tpumlir_cv183x_int8": (61, 58),
    "pplcnet_tpumlir_cv183x_int8": (98, 150),
}


def _instructions(stem: str) -> tuple[list[Instruction], bytes, ChipSpec]:
    model = read_cvimodel(GOLDEN / f"{stem}.cvimodel")
    chip = CHIPS[model.chip]
    (data,) = model.cmdbufs().values()
    return split_cmdbuf(data, chip), data, chip


def test_tables_cover_every_bit_once() -> None:
    for table in (isa.tiu_table("cv183x"), isa.tiu_table("cv182x"), isa.tdma_table(), isa.cmd_hdr_table()):
        pos = 0
        for f in table.fields:
            assert f.bit == pos, (table.name, f.name)
            pos += f.width
        assert pos == table.size * 8
    assert (isa.tiu_table("cv183x").size, isa.tdma_table().size) == (112, 64)


@pytest.mark.parametrize(
    ("layout", "name", "bit", "width"),
    [
        ("cv182x", "tsk_typ", 5, 4),
        ("cv182x", "res0_h", 6 * 32 + 24, 12),
        ("cv182x", "opd0_addr", 8 * 32 + 24, 24),
        ("cv182x", "opd2_b_str", 27 * 32, 16),
        ("cv183x", "cmd_id_gdma", 19, 16),
        ("cv183x", "tsk_typ", 32 + 5, 4),
        ("cv183x", "quan_m", 14 * 32 + 20, 32),
        ("cv183x", "layer_info", 27 * 32, 28),
    ],
)
def test_tiu_field_positions(layout: str, name: str, bit: int, width: int) -> None:
    f = isa.tiu_table(layout).field(name)
    assert (f.bit, f.width) == (bit, width)


def test_encode_decode_single_fields() -> None:
    table = isa.tdma_table()
    raw = isa.encode(table, {"vld": 1, "cmd_id": 0xBEEF, "src_base_addr_high": 0xA5, "dst_c_stride_high": 3})
    assert raw[0] == 1 and raw[2:4] == b"\xef\xbe" and raw[55] == 0xA5 and raw[58:60] == b"\x03\x00"
    assert {k: v for k, v in isa.decode(table, raw).items() if v} == {
        "vld": 1,
        "cmd_id": 0xBEEF,
        "src_base_addr_high": 0xA5,
        "dst_c_stride_high": 3,
    }
    with pytest.raises(ValueError, match="does not fit in 1 bits"):
        isa.encode(table, {"vld": 2})


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_golden_cmdbuf_decodes_and_reencodes_exactly(path: Path) -> None:
    ins, data, chip = _instructions(path.stem)
    tiu = [i for i in ins if i.engine == isa.ENGINE_TIU]
    tdma = [i for i in ins if i.engine == isa.ENGINE_TDMA]
    assert (len(tiu), len(tdma)) == COUNTS[path.stem]
    assert len(tiu) + len(tdma) == len(ins)
    assert all(i.header["magic"] == chip.cmd_magic for i in ins)
    assert all(len(i.body) == {0: 112, 2: 64}[i.engine] for i in ins)
    for i in ins:  # each descriptor alone, then the whole stream
        table = isa.tiu_table(chip.tiu_layout) if i.engine == isa.ENGINE_TIU else isa.tdma_table()
        assert isa.encode(table, i.fields) == i.body
    assert join_cmdbuf(ins, chip) == data
    # sync ids: each engine counts 1, 2, 3, ...
    assert [i.fields["cmd_id_tpu"] for i in tiu] == list(range(1, len(tiu) + 1))
    assert [i.fields["cmd_id"] for i in tdma] == list(range(1, len(tdma) + 1))


def test_first_conv_fields_cv183x_and_cv182x() -> None:
    for stem, opd0_addr in [("smallcnn_cv183x_int8", 0), ("smallcnn_cv182x_int8", 0)]:
        ins, _, chip = _instructions(stem)
        conv = next(i.fields for i in ins if i.engine == isa.ENGINE_TIU)
        assert (conv["tsk_typ"], conv["cmd_id_tpu"], conv["cmd_id_gdma"]) == (0, 1, 3)
        assert [conv[f"res0_{d}"] for d in "nchw"] == [1, 16, 64, 64]
        assert [conv[f"opd0_{d}"] for d in "nchw"] == [1, 4, 64, 64]  # ic 3 padded to 4
        assert (conv["opd1_h"], conv["opd1_w"], conv["opt_chl_quan"], conv["opd0_addr"]) == (
            3,
            3,
            1,
            opd0_addr,
        )
        assert (conv["short_opd1_str"], conv["short_opd2_str"], conv["tsk_opd_num"]) == (1, 2, 3)


def test_tdma_global_address_base_per_chip() -> None:
    for stem, high in [("smallcnn_cv183x_int8", 1), ("smallcnn_cv182x_int8", 0), ("smallcnn_cv180x_int8", 0)]:
        ins, _, chip = _instructions(stem)
        load = ins[0].fields
        assert (load["trans_dir"], load["src_base_reg_sel"], load["src_base_addr_high"]) == (0, 2, high)
        assert chip.gmem_base == high << 32


def test_summary_and_disassembly() -> None:
    ins, _, chip = _instructions("smallcnn_cv183x_int8")
    assert decode_summary(ins) == {
        "TDMA.load": 15,
        "TDMA.store": 3,
        "TIU.avg_pool": 1,
        "TIU.conv": 4,
        "TIU.depthwise": 1,
        "TIU.mac": 1,
        "TIU.matmul": 1,
        "TIU.max_pool": 1,
        "TIU.mul": 2,
        "TIU.xor": 2,
    }
    lines = [" ".join(line.split()) for line in disassemble(ins, chip)]
    assert len(lines) == 31
    assert lines[3] == (
        "0000d8 TIU#1 wait TDMA#3 conv.i8 res0=L0x1000[1x16x64x64] opd0=L0x0[1x4x64x64] opd1=L0x2000"
        " k=3x3 s=1x1 pad=1,1,1,1 opd2=L0x4000 relu"
    )
    assert lines[12] == (
        "000450 TIU#6 wait TDMA#0 mac.i8 res0=L0x1000[1x16x32x32] opd0=L0x3000[1x16x32x32] opd1=#79 rshift=7 relu acc"
    )
    assert lines[-1] == "000ae0 TDMA#18 wait TIU#13 store.bf16 G4+0x0[1x10x1x2] <- L0x20[1x10x1x2]"


def test_split_rejects_bad_streams() -> None:
    ins, data, chip = _instructions("smallcnn_cv182x_int8")
    with pytest.raises(CorruptFileError, match="magic 0xa6, expected 0xa5 for cv183x"):
        split_cmdbuf(data, CHIPS["cv183x"])
    with pytest.raises(CorruptFileError, match="truncated cmd_hdr at byte 72"):
        split_cmdbuf(data[:76], chip)
    with pytest.raises(CorruptFileError, match="runs past the end"):
        split_cmdbuf(data[:100], chip)
    bad = bytearray(data)
    bad[2] = 5
    with pytest.raises(CorruptFileError, match="unknown engine id 5"):
        split_cmdbuf(bytes(bad), chip)
    bad[2], bad[1] = 2, 63
    with pytest.raises(CorruptFileError, match="TDMA descriptor at byte 0 is 63 bytes, expected 64"):
        split_cmdbuf(bytes(bad), chip)
