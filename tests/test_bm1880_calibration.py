"""BMNet calibration tables: the vendor's .prototxt, .pb2 and plain table hold the same numbers."""

from __future__ import annotations

import struct

import pytest
from golden import GOLDEN_ROOT

from npuc.backends.bm1880.calibration import (
    blob_thresholds,
    calibration_to_binary,
    calibration_to_text,
    layer_right_shifts,
    load_calibration,
    new_calibration,
    parse_calibration_binary,
    parse_calibration_text,
    parse_plain_table,
    save_calibration,
)
from npuc.compiler.errors import CorruptFileError

GOLDEN = GOLDEN_ROOT / "bm1880"
PB2 = GOLDEN / "bmnet_lenet_calibration.pb2"
TEXT = GOLDEN / "bmnet_lenet_calibration.prototxt"


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def test_text_and_binary_hold_the_same_table():
    binary = load_calibration(PB2)
    text = load_calibration(TEXT)
    assert binary == text
    assert binary.name == "lenet"
    assert [layer.name for layer in binary.layer] == [
        "data", "conv1", "pool1", "conv2", "pool2", "ip1", "customized1", "ip2", "customized2",
    ]  # fmt: skip
    assert layer_right_shifts(binary) == {
        "conv1": 8,
        "pool1": 8,
        "conv2": 10,
        "pool2": 7,
        "ip1": 11,
        "ip2": 10,
    }
    assert [list(layer.threshold_x_quantized) for layer in binary.layer if layer.threshold_x_quantized] == [
        [160], [135],
    ]  # fmt: skip
    thresholds = blob_thresholds(binary)
    assert thresholds["conv1"] == f32(1.3900346756) and thresholds["label"] == f32(7.0034198761)
    relu = binary.layer[6].relu_param
    assert (relu.gt_scale, relu.le_scale, relu.gt_right_shift_width, relu.le_right_shift_width) == (
        64,
        102,
        6,
        10,
    )


def test_binary_writes_back_identically(tmp_path):
    assert calibration_to_binary(load_calibration(PB2)) == PB2.read_bytes()
    assert calibration_to_binary(load_calibration(TEXT)) == PB2.read_bytes()
    out = tmp_path / "table.pb2"
    save_calibration(load_calibration(TEXT), out)
    assert out.read_bytes() == PB2.read_bytes()
    text_out = tmp_path / "table.prototxt"
    save_calibration(load_calibration(PB2), text_out)
    assert parse_calibration_text(text_out.read_text()) == load_calibration(PB2)


def test_optimizer_table_and_plain_table_agree():
    optimized = load_calibration(GOLDEN / "bmnet_lenet_ctable_opt.pb2")
    assert optimized == load_calibration(PB2)
    plain = parse_plain_table((GOLDEN / "bmnet_lenet_calibration").read_text())
    assert len(plain) == 9
    thresholds = blob_thresholds(optimized)
    assert {e.name: f32(e.threshold) for e in plain} == {k: v for k, v in thresholds.items() if k != "label"}
    assert {e.name: e.rshift for e in plain if e.rshift} == {
        "customized1": 10,
        "ip2": 10,
        "conv2": 10,
        "conv1": 8,
        "ip1": 11,
    }


def test_build_new_table():
    msg = new_calibration("net")
    layer = msg.layer.add(name="conv", right_shift_width=9)
    layer.threshold_y.append(2.5)
    layer.blob_param.add(name="conv", threshold_y=2.5)
    raw = calibration_to_binary(msg)
    assert raw == bytes.fromhex(
        "0a036e6574"
        + "a2061a"
        + "0a04636f6e76"
        + "150000"
        + "2040"
        + "1809"
        + "2a0b"
        + "0a04636f6e76"
        + "15000020"
        + "40"
    )
    assert parse_calibration_binary(raw) == msg
    assert 'name: "net"' in calibration_to_text(msg)


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: parse_calibration_binary(b"\xff\xff\xff"), "not a binary BMNet calibration table"),
        (lambda: parse_calibration_binary(b"\xa2\x06\x00"), "lacks required fields"),
        (lambda: parse_calibration_text("layer { nam: 1 }"), "1:9"),
        (lambda: parse_plain_table("conv1 1.0\n"), ":1: expected 'name threshold rshift'"),
    ],
)
def test_bad_tables(call, fragment):
    with pytest.raises(CorruptFileError, match=fragment):
        call()


def test_npuc_exports_the_bmnet_table_of_the_lenet(tmp_path):
    """From the Caffe LeNet and BMNet's thresholds, npuc's lowering writes BMNet's own table: the same right
    shifts (8/10/11/10), pool multipliers (160, 135) and leaky-ReLU scales for every layer it runs."""
    from npuc.backends.bm1880.export_table import export_bmnet_table
    from npuc.backends.bm1880.quantize import load_thresholds
    from npuc.frontends.caffe import import_caffe
    from npuc.passes.rewrite.canonicalize import canonicalize

    golden = GOLDEN_ROOT / "bm1880"
    graph = import_caffe(golden / "lenet_deploy.prototxt", golden / "lenet_float.caffemodel", {"data": (1, 1, 28, 28)})
    canonicalize(graph)
    for path in (tmp_path / "lenet.pb2", tmp_path / "lenet.prototxt"):
        export_bmnet_table(graph, load_thresholds(golden / "bmnet_lenet_calibration.prototxt"), path)
        ours = {layer.name: layer for layer in load_calibration(path).layer}
        vendor = {layer.name: layer for layer in load_calibration(golden / "bmnet_lenet_calibration.prototxt").layer}
        # customized2 is the final ELU, which runs on the host (it has no integer parameters)
        assert list(ours) == ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "customized1", "ip2"]
        for name, layer in ours.items():
            theirs = vendor[name]
            assert list(layer.threshold_y) == list(theirs.threshold_y)[:1]
            assert layer.right_shift_width == theirs.right_shift_width
            assert list(layer.threshold_x_quantized) == list(theirs.threshold_x_quantized)
            assert layer.relu_param == theirs.relu_param
            assert [(b.name, b.threshold_y) for b in layer.blob_param] == [(name, theirs.threshold_y[0])]
        assert [ours[n].right_shift_width for n in ("conv1", "conv2", "ip1", "ip2")] == [8, 10, 11, 10]


def test_calibrate_writes_a_bmnet_table_a_bm1880_build_reads(tmp_path):
    """`npuc calibrate run --bmnet T.pb2 -o T.txt`: the same thresholds in both tables; `build --calib T.pb2`."""
    import numpy as np
    from test_cli import npuc

    from npuc.backends.bm1880.container import load_bmodel
    from npuc.passes.calibration.calitable import read_table

    golden = GOLDEN_ROOT / "bm1880"
    x = np.fromfile(golden / "lenet_input_1_1_28_28.bin", np.float32).reshape(1, 1, 28, 28)
    for i in range(3):
        np.savez(tmp_path / f"s{i}.npz", data_0=x * (1 + 0.25 * i))
    model = golden / "lenet_float.onnx"
    done = npuc("calibrate", "run", model, "--data", tmp_path, "--bmnet", tmp_path / "t.pb2", "-o", tmp_path / "t.txt")
    assert done.returncode == 0, done.stderr
    tpu_mlir = read_table(tmp_path / "t.txt").thresholds()
    bmnet = {layer.name: layer for layer in load_calibration(tmp_path / "t.pb2").layer}
    assert bmnet["data_0"].threshold_y[0] == np.float32(tpu_mlir["data_0"])
    assert bmnet["conv1_1"].threshold_y[0] == np.float32(tpu_mlir["conv1_1_Conv"])  # tpu-mlir's row name
    assert bmnet["conv1_1"].right_shift_width > 0 and bmnet["ip2_1"].right_shift_width > 0
    out = tmp_path / "lenet.bmodel"
    built = npuc("build", model, "--target", "bm1880", "--calib", tmp_path / "t.pb2", "-o", out)
    assert built.returncode == 0, built.stderr
    assert load_bmodel(out).commands[0].inputs[0].threshold == np.float32(tpu_mlir["data_0"])
