"""Tests for passes/calibration/calitable.py: tpu-mlir cali_table read/write, byte-exact against tpu-mlir's own
table."""

from __future__ import annotations

import pytest
from golden import GOLDEN_ROOT

from npuc.compiler.errors import UserError
from npuc.passes.calibration import calitable as ct

GOLDEN = GOLDEN_ROOT
SMALLCNN_TABLE = GOLDEN / "cv18xx" / "smallcnn_cali_table.txt"


def test_golden_table_fields():
    t = ct.read_table(SMALLCNN_TABLE)
    assert (t.histogram_bins, t.sample_number, t.tune_number) == (2048, 20, 5)
    assert t.method == "['kl']"
    assert t.mlir_version == "v1.30.2-20260831 cali version 1.0" and t.mlir_file == "smallcnn.mlir"
    assert t.generated_time == "2026-11-21 08:58:55.013361"
    assert len(t.entries) == 11
    assert list(t.entries)[:3] == ["input", "relu_8_Relu", "maxpool_9_MaxPool"]
    assert t.entries["input"] == ct.Threshold(4.7247663, -4.7247663, 4.4531603)
    assert t.entries["relu_34_Relu"] == ct.Threshold(7.8981221, -0.0, 8.6383963)
    assert str(t.entries["relu_8_Relu"].min) == "-0.0"  # the sign of zero survives
    assert t.thresholds()["gap_39_GlobalAveragePool"] == 2.124094


def test_golden_table_roundtrip_is_byte_identical(tmp_path):
    golden = SMALLCNN_TABLE.read_bytes()
    t = ct.read_table(SMALLCNN_TABLE)
    assert ct.format_table(t).encode() == golden
    out = tmp_path / "copy.txt"
    ct.write_table(t, out)
    assert out.read_bytes() == golden
    assert not (tmp_path / "copy.txt.tmp").exists()


def test_changed_header_value_rewrites_only_its_line():
    t = ct.read_table(SMALLCNN_TABLE)
    t.sample_number = 7
    t.entries["input"] = ct.Threshold(1.5, -1.5, 1.25)
    old = SMALLCNN_TABLE.read_text().splitlines()
    new = ct.format_table(t).splitlines()
    diff = [(a, b) for a, b in zip(old, new, strict=True) if a != b]
    assert diff == [
        ("# sample number: 20", "# sample number: 7"),
        ("input 4.7247663 -4.7247663 4.4531603", "input 1.5000000 -1.5000000 1.2500000"),
    ]
    t.tune_number = None
    assert "# tune number" not in ct.format_table(t)


def test_new_table_standard_header(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    t = ct.table_from_rows(
        {"a": (1.0, -1.0, 0.5), "b/c": (2.25, 0.0, 2.25)},
        method="kl",
        sample_number=3,
        tune_number=0,
        mlir_file="m.onnx",
    )
    assert ct.format_table(t) == (
        "# mlir version: npuc cali version 1.0\n"
        "# mlir: m.onnx\n"
        "# genetated time: 1970-01-01 00:00:00\n"
        "# quantization threshold calculation method: kl\n"
        "# histogram number: 2048\n"
        "# sample number: 3\n"
        "###\n"
        "# tune number: 0\n"
        "###\n"
        "# op_name    threshold    min    max\n"
        "a 1.0000000 -1.0000000 0.5000000\n"
        "b/c 2.2500000 0.0000000 2.2500000\n"
    )
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert "# genetated time: 2023-11-14 22:13:20\n" in ct.format_table(t)
    again = ct.parse_table(ct.format_table(t))
    assert ct.format_table(again) == ct.format_table(t)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "soon")
    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH"):
        ct.format_table(t)


OPTIONAL_BLOCKS = """\
# mlir version: x
# histogram number: 2048
# sample number: 2
###
# op_name    threshold    min    max
conv1 1.0000000 -1.0000000 1.0000000
gelu1 2.0000000 -0.1700000 2.0000000

#int4_th
conv1 0.5000000 -0.5714286 0.5000000

#weight_scale
conv1_weight 2 0.01 0.02
fc_weight 1 0.5 1 3.0

#asym_op
gelu1
conv2

#int4_op
conv1
"""


def test_optional_blocks_parse_and_roundtrip():
    t = ct.parse_table(OPTIONAL_BLOCKS, "blocks.txt")
    assert list(t.entries) == ["conv1", "gelu1"]
    assert t.int4_entries == {"conv1": ct.Threshold(0.5, -0.5714286, 0.5)}
    assert t.weight_scales == {
        "conv1_weight": ct.WeightScale((0.01, 0.02)),
        "fc_weight": ct.WeightScale((0.5,), (3.0,)),
    }
    assert t.asym_ops == ["gelu1", "conv2"] and t.int4_ops == ["conv1"]
    assert ct.format_table(t) == OPTIONAL_BLOCKS


def test_fp8_and_crlf_tables():
    text = "# mlir version: x\r\n#tpu-mlir-fp8 caliration table\r\n###\r\n"
    text += "t 448.0000000 -448.0000000 448.0000000\r\n"
    t = ct.parse_table(text)
    assert t.fp8 and t.histogram_bins is None
    assert t.entries["t"].threshold == 448.0
    fresh = ct.table_from_rows({"t": (448.0, -448.0, 448.0)})
    fresh.fp8 = True
    assert "#tpu-mlir-fp8 caliration table\n" in ct.format_table(fresh)
    assert "histogram number" not in ct.format_table(fresh)


def test_foreign_formats_are_user_errors(tmp_path):
    bmnet_text = GOLDEN / "bm1880" / "bmnet_lenet_calibration"  # 'name threshold rshift'
    with pytest.raises(UserError, match=r"bmnet_lenet_calibration:1: expected 'name threshold min max'"):
        ct.read_table(bmnet_text)
    with pytest.raises(UserError, match="not UTF-8"):
        ct.read_table(GOLDEN / "bm1880" / "bmnet_lenet_calibration.pb2")
    with pytest.raises(UserError, match=r"lenet_deploy.prototxt:1:"):
        ct.read_table(GOLDEN / "bm1880" / "lenet_deploy.prototxt")
    bad = tmp_path / "bad.txt"
    bad.write_text("# op_name    threshold    min    max\na 1 2 3\nb 1 nan 3\n")
    with pytest.raises(UserError, match=r"bad.txt:3:"):
        ct.read_table(bad)
    bad.write_text("# header only\n# histogram number: many\n")
    with pytest.raises(UserError, match=r"bad.txt:2: header 'histogram number'"):
        ct.read_table(bad)
    bad.write_text("#weight_scale\nw 3 0.1\n")
    with pytest.raises(UserError, match="bad #weight_scale row"):
        ct.read_table(bad)
    bad.write_text("")
    with pytest.raises(UserError, match="no calibration rows"):
        ct.read_table(bad)
    with pytest.raises(UserError, match="cannot read calibration table"):
        ct.read_table(tmp_path / "missing.txt")
