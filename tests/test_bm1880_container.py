"""BM1880 bmodel containers: the vendor's files open with the right values; the writer reproduces them."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from golden import GOLDEN_ROOT

from npuc.backends.bm1880.container import (
    MAGIC_PROTO,
    MAGIC_PROTO_WEIGHTS,
    BModel,
    Command,
    TensorInfo,
    bmodel_schema,
    load_bmodel,
    read_bmodel,
    save_bmodel,
    to_proto,
    write_bmodel,
)
from npuc.backends.bm1880.inspect import describe_bmodel
from npuc.compiler.errors import CorruptFileError, UnsupportedError, UserError

GOLDEN = GOLDEN_ROOT / "bm1880"
PNET = GOLDEN / "mtcnn_pnet_multishape.bmodel"
DET1 = GOLDEN / "mtcnn_det1_nchw.bmodel"
JSON_DET1 = GOLDEN / "mtcnn_det1_1_3_12_12_json.bmodel"


def test_pnet_multishape_values():
    model = load_bmodel(PNET)
    assert (model.net_name, model.chip, model.fmt, model.node_num) == ("PNet", 1880, 4, 1)
    assert (model.type, model.version, model.explicit, model.container) == (
        "A",
        "2.1",
        frozenset(),
        "proto+weights",
    )
    assert [len(w) for w in model.weights] == [6696]
    assert [c.inputs[0].shape[2:] for c in model.commands] == [
        (12, 12), (288, 384), (324, 576), (18, 24), (21, 36), (36, 48), (41, 72), (72, 96), (81, 144),
        (144, 192), (162, 288),
    ]  # fmt: skip
    assert [c.neuron_size for c in model.commands] == [
        438, 604906, 826458, 1464, 2736, 6666, 11832, 28734, 49464, 119526, 203352,
    ]  # fmt: skip
    assert [len(c.cmdbuf) for c in model.commands][:3] == [3792, 9144, 23784]
    assert {c.weight_index for c in model.commands} == {0}
    first = model.commands[0]
    assert first.inputs[0].threshold == pytest.approx(0.9965803623199463, abs=0)
    assert [(o.name, o.shape, o.offset) for o in first.outputs] == [
        ("conv4-2", (1, 4, 1, 1), 432),
        ("conv4-1", (1, 2, 1, 1), 436),
    ]
    assert [o.threshold for o in first.outputs] == [0.5816736221313477, 7.704418182373047]
    # the 288x384 command writes its first output over the (dead) input at offset 0
    assert model.commands[1].outputs[0].offset == 0 and model.commands[1].outputs[1].offset == 103972
    assert model.command_for_shape((1, 3, 41, 72)) is model.commands[6]


def test_det1_one_blob_per_command():
    model = load_bmodel(DET1)
    assert (model.net_name, model.version, model.type) == ("det1", "1.0", "A")
    assert model.explicit == frozenset({"type", "version"})
    assert [len(w) for w in model.weights] == [6696] * 5
    assert [c.weight_index for c in model.commands] == [0, 1, 2, 3, 4]
    assert [c.inputs[0].threshold for c in model.commands] == [0.0] * 5
    assert [c.outputs[1].threshold for c in model.commands][:2] == [10.334598541259766, 12.433381080627441]
    assert model.weight_for(model.commands[3]) == model.weights[3]


def test_legacy_json_container():
    model = load_bmodel(JSON_DET1)
    assert (model.net_name, model.chip, model.version, model.container) == ("det1", 1880, "0.1.1", "json")
    assert [len(w) for w in model.weights] == [6696]
    (command,) = model.commands
    assert (command.neuron_size, len(command.cmdbuf)) == (438, 3792)
    assert command.inputs == (TensorInfo("", (1, 3, 12, 12), 0, 255.12457275390625, None, frozenset({"threshold"})),)
    assert [(o.name, o.shape, o.offset, o.threshold) for o in command.outputs] == [
        ("conv4-2", (1, 4, 1, 1), 432, 16.644227981567383),
        ("conv4-1", (1, 2, 1, 1), 436, 206.83676147460938),
    ]
    data = JSON_DET1.read_bytes()
    assert command.cmdbuf == data[-3792:] and model.weights[0] == data[-10488:-3792]


@pytest.mark.parametrize("path", [PNET, DET1], ids=lambda p: p.name)
def test_writer_reproduces_vendor_bytes(path):
    assert write_bmodel(load_bmodel(path)) == path.read_bytes()


def test_json_converts_to_proto_container():
    model = load_bmodel(JSON_DET1)
    data = write_bmodel(model)
    assert struct.unpack_from("<I", data)[0] == MAGIC_PROTO_WEIGHTS
    assert data.endswith(model.weights[0])
    assert read_bmodel(data) == model


def test_embedded_weight_container_roundtrip():
    model = load_bmodel(DET1)
    data = write_bmodel(model, embed_weights=True)
    assert struct.unpack_from("<I", data)[0] == MAGIC_PROTO
    again = read_bmodel(data)
    assert again == model and again.container == "proto"
    assert write_bmodel(again) == DET1.read_bytes()


def _tiny(**changes) -> BModel:
    command = Command(
        inputs=(TensorInfo("", (1, 1, 2, 2), 0, 1.5),),
        outputs=(TensorInfo("out", (1, 2, 1, 1), 4, 3.0),),
        cmdbuf=b"",
        neuron_size=6,
    )
    return dataclasses.replace(BModel("tiny", 1880, 4, (command,), (b"\x01\x02\x03", b"\x04\x05")), **changes)


def test_writer_layout_for_new_model(tmp_path):
    model = _tiny()
    path = tmp_path / "tiny.bmodel"
    save_bmodel(model, path)
    data = path.read_bytes()
    magic, proto_len = struct.unpack_from("<II", data)
    assert magic == MAGIC_PROTO_WEIGHTS and len(data) == 8 + proto_len + 5
    assert data[-5:] == b"\x01\x02\x03\x04\x05"
    msg = bmodel_schema().Model.FromString(data[8 : 8 + proto_len])
    assert [(w.weight_offset, w.weight_length) for w in msg.weight_info] == [(0, 3), (3, 2)]
    assert not msg.HasField("version") and not msg.HasField("type") and not msg.weight
    assert not msg.command[0].HasField("weight_index") and not msg.command[0].input[0].HasField("offset")
    assert load_bmodel(path) == model
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.bmodel"]


def _dd(msg) -> bytes:
    payload = msg.SerializePartialToString()
    weights = b"".join(bytes(w) for w in msg.weight)
    return struct.pack("<II", MAGIC_PROTO_WEIGHTS, len(payload)) + payload + weights


def _corrupt_cases():
    base = to_proto(_tiny(), embed_weights=False)
    cases = {}
    msg = type(base)()
    msg.CopyFrom(base)
    msg.weight_info[1].weight_length = 3
    cases["weight_info past area"] = (_dd(msg) + b"\x01\x02\x03\x04\x05", "outside the 5-byte weight area")
    msg = type(base)()
    msg.CopyFrom(base)
    msg.command[0].weight_index = 2
    cases["weight_index"] = (_dd(msg) + b"\x01\x02\x03\x04\x05", "uses weight blob 2")
    msg = type(base)()
    msg.CopyFrom(base)
    msg.command[0].neuron_size = 5
    cases["output past neuron area"] = (_dd(msg) + b"\x01\x02\x03\x04\x05", "exceeds neuron_size 5")
    msg = type(base)()
    msg.CopyFrom(base)
    msg.ClearField("chip")
    cases["missing chip"] = (_dd(msg) + b"\x01\x02\x03\x04\x05", "lacks required fields \\(chip\\)")
    cases["proto_len"] = (struct.pack("<II", MAGIC_PROTO_WEIGHTS, 100) + b"\x0a", "exceeds the file size")
    cases["garbage protobuf"] = (struct.pack("<II", MAGIC_PROTO_WEIGHTS, 2) + b"\xff\xff", "does not decode")
    cases["empty"] = (b"", "too short")
    cases["unknown magic"] = (b"\xee\xaa\x55\xff" + b"\0" * 64, "unknown magic 0xFF55AAEE")
    json_data = JSON_DET1.read_bytes()
    cases["json magic"] = (json_data[:478] + b"\0\0\0\0" + json_data[482:], "expected magic 0x55AAAA55")
    cases["json bin_len"] = (json_data[:-1], "bin_len 10488 exceeds the file size")
    broken = json_data.replace(b'"neuron_size": "438"', b'"neuron_size": "4x8"')
    cases["json number"] = (broken, "neuron_size: expected a int")
    broken = json_data.replace(b'"cmdbuf": ["6696", "3792"]', b'"cmdbuf": ["6697", "3792"]')
    cases["json span"] = (broken, "outside the 10488-byte binary")
    broken = json_data.replace(b'"output_size": "6"', b'"output_size": "7"')
    cases["json output_size"] = (broken, "does not equal the sum")
    broken = json_data.replace(b'"name": "det1"', b'"nome": "det1"')
    cases["json key"] = (broken, "missing key 'name'")
    return cases


@pytest.mark.parametrize("name", list(_corrupt_cases()))
def test_corrupt_files_raise(name):
    data, fragment = _corrupt_cases()[name]
    with pytest.raises(CorruptFileError, match=fragment):
        read_bmodel(data, "x.bmodel")


def test_unsupported_shape_and_missing_file(tmp_path):
    with pytest.raises(UnsupportedError, match="1x3x12x12, 1x3x288x384"):
        load_bmodel(PNET).command_for_shape((1, 3, 10, 10))
    with pytest.raises(UserError, match="cannot read bmodel .*missing.bmodel: No such file"):  # a path, not damage
        load_bmodel(tmp_path / "missing.bmodel")


def test_describe_bmodel():
    text = describe_bmodel(load_bmodel(PNET))
    lines = text.splitlines()
    assert lines[0] == "net 'PNet'  chip 1880  fmt 4  node_num 1  type 'A'  version '2.1'"
    assert lines[1] == "container: protobuf + weight area (magic 0xFF55AADD)"
    assert lines[2:5] == ["weight blobs: 1", "    blob 0: 6696 B", "commands: 11"]
    assert lines[5] == ("  command 0: input 1x3x12x12  neuron_size 438  weight blob 0  cmdbuf 3792 B (22 BD, 16 GDMA)")
    assert lines[6] == "    input  #0: shape 1x3x12x12 offset 0 (432 B) threshold 0.99658"
    assert lines[7] == "    output conv4-2: shape 1x4x1x1 offset 432 (4 B) threshold 0.581674"
    assert len(lines) == 5 + 11 * 4
    with_disasm = describe_bmodel(load_bmodel(JSON_DET1), disasm=True).splitlines()
    assert len(with_disasm) == 5 + 4 + 38
    assert with_disasm[9].startswith("      000000  GDMA S2L        id=1 wait_bd=0 weight+0x10E 2x10x1x1 -> lmem:0x75")
