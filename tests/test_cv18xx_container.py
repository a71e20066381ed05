"""CV18xx .cvimodel container: schema parser, FlatBuffer codec, byte-exact round trips of tpu-mlir files."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from golden import GOLDEN_ROOT

from npuc.backends.cv18xx import fbcodec
from npuc.backends.cv18xx.container import (
    decode_cpu_args,
    model_schema,
    read_cvimodel,
    write_cvimodel,
)
from npuc.backends.cv18xx.fbs import SchemaError, parse_schema
from npuc.backends.cv18xx.inspect import describe_cvimodel
from npuc.compiler.errors import CorruptFileError

GOLDEN = GOLDEN_ROOT / "cv18xx"
FILES = sorted(GOLDEN.glob("*.cvimodel"))

# file stem -> (chip, body size, weight section bytes, cmdbuf section name, cmdbuf bytes)
EXPECTED = {
    "smallcnn_cv180x_int8": ("cv180x", 3360, 7072, "subfunc_1", 4320),
    "smallcnn_cv181x_bf16": ("cv181x", 2712, 12464, "subfunc_0", 3384),
    "smallcnn_cv181x_int8": ("cv181x", 3032, 7072, "subfunc_1", 3120),
    "smallcnn_cv182x_int8": ("cv182x", 3032, 7072, "subfunc_1", 3120),
    "smallcnn_cv183x_bf16": ("cv183x", 2712, 12464, "subfunc_0", 3120),
    "smallcnn_cv183x_int8": ("cv183x", 3032, 7072, "subfunc_1", 2856),
    "onet_tpumlir_cv183x_bf16": ("cv183x", 5448, 781264, "subfunc_0", 11016),
    "onet_tpumlir_cv183x_int8": ("cv183x", 6024, 394512, "subfunc_1", 11496),
    "pplcnet_tpumlir_cv183x_int8": ("cv183x", 16528, 1739168, "subfunc_1", 22560),
}


def test_all_golden_files_present() -> None:
    assert sorted(f.stem for f in FILES) == sorted(EXPECTED)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_golden_read_write_is_byte_identical(path: Path) -> None:
    data = path.read_bytes()
    model = read_cvimodel(path)
    chip, body_size, weight_size, cmd_name, cmd_size = EXPECTED[path.stem]
    assert model.chip == chip and model.body.target == chip
    assert struct.unpack_from("<I", data, 8)[0] == body_size
    assert (model.body.version.major_, model.body.version.minor_, model.body.version.sub_minor) == (1, 4, 0)
    assert len(model.weight) == weight_size
    assert {k: len(v) for k, v in model.cmdbufs().items()} == {cmd_name: cmd_size}
    assert len(data) == 48 + body_size + weight_size + cmd_size
    assert write_cvimodel(model) == data


def test_golden_int8_fields() -> None:
    model = read_cvimodel(GOLDEN / "smallcnn_cv183x_int8.cvimodel")
    body = model.body
    assert body.name == "smallcnn" and body.mlir_version == "v1.30.2-20260831"
    assert len(body.weight_map) == 12
    w0 = body.weight_map[0]
    assert (w0.name, w0.offset, w0.size, w0.shape.dim, w0.type) == (
        "relu_8_Relu_filter_reordered",
        (1 << 40) + 0x1960,
        576,
        [1, 16, 9, 4],
        6,
    )
    prog = body.programs[0]
    assert (prog.input_tensors, prog.output_tensors) == (["input"], ["output_Gemm_f32"])
    assert (prog.shared_gmem, prog.private_gmem, prog.neuron_size) == (48, 12288, 0)
    names = [t.name for t in prog.tensor_map]
    assert names == [
        "input",
        "inputrelu_8_Relu_si8",
        "gap_39_GlobalAveragePool",
        "flatten_40_Flatten",
        "output_Gemm",
        "output_Gemm_f32",
    ]
    t_in, t_q = prog.tensor_map[0], prog.tensor_map[1]
    assert (t_in.offset, t_in.dtype, t_in.shape.dim, t_in.size) == (3 << 40, 0, [1, 3, 64, 64], 49152)
    assert (t_q.offset, t_q.dtype) == (2 << 40, 6)
    assert t_q.quant.qscale == pytest.approx(0.03720288351178169, rel=1e-7)
    assert prog.tensor_map[2].overwrote is True
    cpu, tpu = prog.routines
    assert cpu.type == 1 and cpu.cpu_routine.function_section == "quant"
    args = decode_cpu_args(cpu.cpu_routine.function_args)
    assert list(args) == ["from", "scale", "to"]
    assert args["from"] == "FP32" and args["to"] == "INT8"
    # scale = 127 / threshold and qscale of the quantized input is its inverse
    assert args["scale"] * t_q.quant.qscale == pytest.approx(1.0, rel=1e-6)
    assert tpu.type == 0 and tpu.tpu_routine.cmdbuf_section == "subfunc_1"
    assert [(s.type, s.name, s.offset, s.size) for s in body.sections] == [
        (0, "weight", 0, 7072),
        (1, "subfunc_1", 7072, 2856),
    ]


def test_cpu_args_nested_buffer_round_trips() -> None:
    from npuc.backends.cv18xx.container import cpu_param_schema

    model = read_cvimodel(GOLDEN / "smallcnn_cv182x_int8.cvimodel")
    raw = model.body.programs[0].routines[0].cpu_routine.function_args
    assert len(raw) == 172
    assert fbcodec.encode(cpu_param_schema(), fbcodec.decode(cpu_param_schema(), raw)) == raw


def test_writer_recomputes_section_layout_and_md5() -> None:
    model = read_cvimodel(GOLDEN / "smallcnn_cv181x_int8.cvimodel")
    model.sections["weight"] = model.sections["weight"] + bytes(16)
    data = write_cvimodel(model)
    again = read_cvimodel(data)
    assert [(s.offset, s.size) for s in again.body.sections] == [(0, 7088), (7088, 3120)]
    assert again.sections == model.sections
    assert data[14:30] == hashlib.md5(data[48:]).digest()
    assert data[30:46] == b"cv181x" + bytes(10) and data[46:48] == b"Cv"
    # everything but the section table is unchanged field by field
    assert replace(again.body, sections=None) == replace(model.body, sections=None)


def _patched(data: bytes, offset: int, new: bytes, fix_md5: bool = True) -> bytes:
    out = bytearray(data)
    out[offset : offset + len(new)] = new
    if fix_md5:
        out[14:30] = hashlib.md5(out[48:]).digest()
    return bytes(out)


@pytest.mark.parametrize(
    ("offset", "new", "fix", "message"),
    [
        (0, b"CviModeX", True, "bad magic"),
        (12, b"\x02", True, "header version 2.4"),
        (13, b"\x05", True, "header version 1.5"),
        (30, b"cv999x", True, "unknown chip"),
        (8, b"\xff\xff\x00\x00", True, "body size 65535"),
        (100, b"\x00", False, "MD5 at offset 14"),
    ],
)
def test_header_validation(offset: int, new: bytes, fix: bool, message: str) -> None:
    data = (GOLDEN / "smallcnn_cv182x_int8.cvimodel").read_bytes()
    with pytest.raises(CorruptFileError, match=message):
        read_cvimodel(_patched(data, offset, new, fix))


def test_section_past_end_and_truncation_are_rejected() -> None:
    data = (GOLDEN / "smallcnn_cv182x_int8.cvimodel").read_bytes()
    with pytest.raises(CorruptFileError, match="shorter than the 48-byte header"):
        read_cvimodel(data[:40])
    cut = bytearray(data[:-1])
    cut[14:30] = hashlib.md5(cut[48:]).digest()
    with pytest.raises(CorruptFileError, match=r"section 1 \('subfunc_1'\) spans file bytes"):
        read_cvimodel(bytes(cut))


def test_schema_parser_fields_and_errors() -> None:
    schema = model_schema()
    tensor = schema.objects["Tensor"]
    assert [f.name for f in tensor.fields][:5] == ["tensor_id", "name", "offset", "dtype", "shape"]
    assert [f.slot for f in tensor.fields] == list(range(13))
    assert [f.name for f in tensor.fields if f.required] == ["name", "shape"]
    assert schema.objects["Version"].size == 3
    assert schema.enums["SectionType"].values == {
        "WEIGHT": 0,
        "CMDBUF": 1,
        "FUNC_X86": 2,
        "FUNC_AARCH64": 3,
        "DMABUF": 4,
    }
    s = parse_schema("namespace t; struct P { a: ubyte; b: int; } table T { p: P; x: short = 7; v: [P]; } root_type T;")
    assert (s.objects["P"].size, [f.offset for f in s.objects["P"].fields]) == (8, [0, 4])
    rec = s.new("T", p=s.new("P", a=1, b=-2), v=[s.new("P", a=3, b=4)])
    assert rec.x == 7
    assert fbcodec.decode(s, fbcodec.encode(s, rec)) == rec
    with pytest.raises(SchemaError, match="unsupported schema declaration 'union'"):
        parse_schema("union U { A }")
    with pytest.raises(SchemaError, match="unknown type 'Nope'"):
        parse_schema("table T { a: Nope; } root_type T;")


def test_flatbuffer_missing_required_field_is_corrupt() -> None:
    schema = model_schema()
    model = read_cvimodel(GOLDEN / "smallcnn_cv182x_int8.cvimodel").body
    bad_schema = parse_schema(
        (Path(__file__).resolve().parents[1] / "backends" / "cv18xx" / "cvimodel.fbs")
        .read_text()
        .replace("name: string (required);\n  size: uint;", "name: string;\n  size: uint;")
    )
    sections = [replace(s, name=None) for s in model.sections]
    body = fbcodec.encode(bad_schema, bad_schema.new("Model", **{**vars(model), "sections": sections}))
    with pytest.raises(CorruptFileError, match="required field Section.name is missing"):
        fbcodec.decode(schema, body)


def _lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines()]


def test_describe_lists_everything() -> None:
    model = read_cvimodel(GOLDEN / "smallcnn_cv181x_int8.cvimodel")
    text = describe_cvimodel(model)
    lines = _lines(text)
    md5 = hashlib.md5(model.sections["subfunc_1"]).hexdigest()
    for expected in [
        "Cvimodel 'smallcnn' for chip cv181x",
        f"1 CMDBUF subfunc_1 7072 3120 - {md5}",
        "0 weight+0x1960 576 INT8 1x16x9x4 relu_8_Relu_filter_reordered",
        "#0 CPU quant(from='FP32', scale=26.879636764526367, to='INT8') in=input out=inputrelu_8_Relu_si8",
        "#1 TPU subfunc_1 in=inputrelu_8_Relu_si8 out=output_Gemm_f32",
        "0 io0+0x0 49152 FP32 1x3x64x64 1 - input",
        "1 private+0x0 12288 INT8 1x3x64x64 0.0372028835 - inputrelu_8_Relu_si8",
        "2 shared+0x0 32 INT8 1x32x1x1 0.016725149 overwrote gap_39_GlobalAveragePool",
        "Program #0: batch 0, neuron 0, shared gmem 48, private gmem 12288",
    ]:
        assert expected in lines
    listing = _lines(describe_cvimodel(model, disasm=True))
    assert len(listing) == len(lines) + 34
    assert "000000 TDMA#1 wait TIU#0 load.i8 L0x2000[1x3x64x64] <- G2+0x0[1x3x64x64]" in listing
