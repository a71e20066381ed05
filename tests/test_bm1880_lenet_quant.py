"""BM1880 int8 rules vs the vendor: recompute LeNet's int8 weights/biases from the float ONNX model and the
BMNet calibration thresholds, and compare with the SDK's int8 caffemodel (bm1880.md §3.2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from golden import GOLDEN_ROOT
from onnx import numpy_helper

from npuc.backends.bm1880.calibration import load_calibration
from npuc.compiler.numformats.bm1880_int8 import bm1880_quantize_layer, bm1880_requant_multiplier, bm1880_scale_shift
from npuc.compiler.protoschema import load_proto

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = GOLDEN_ROOT / "bm1880"

# conv / fc layer -> the layer whose output feeds it (LeNet: data, conv1, pool1, conv2, pool2, ip1, relu, ip2)
WEIGHT_LAYERS = {"conv1": "data", "conv2": "pool1", "ip1": "pool2", "ip2": "customized1"}


@pytest.fixture(scope="module")
def calibration():
    msg = load_calibration(GOLDEN / "bmnet_lenet_calibration.prototxt")
    assert load_calibration(GOLDEN / "bmnet_lenet_calibration.pb2") == msg  # the text and binary tables agree
    return {layer.name: layer for layer in msg.layer}


@pytest.fixture(scope="module")
def float_weights():
    model = onnx.load(str(GOLDEN / "lenet_float.onnx"))
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


@pytest.fixture(scope="module")
def vendor_int8():
    caffe = load_proto(ROOT / "frontends" / "caffe.proto")
    net = caffe.NetParameter()
    net.ParseFromString((GOLDEN / "lenet_int8_vendor.caffemodel").read_bytes())
    return {layer.name: [np.asarray(blob.data, dtype=np.float32) for blob in layer.blobs] for layer in net.layer}


def _threshold(calibration, name: str) -> np.float32:
    return np.float32(calibration[name].threshold_y[0])


@pytest.mark.parametrize("layer, rshift", [("conv1", 8), ("conv2", 10), ("ip1", 11), ("ip2", 10)])
def test_weights_and_biases_match_vendor(calibration, float_weights, vendor_int8, layer, rshift):
    w = float_weights[f"{layer}_w_0"]
    b = float_weights[f"{layer}_b_0"]
    q = bm1880_quantize_layer(w, b, _threshold(calibration, WEIGHT_LAYERS[layer]), _threshold(calibration, layer))
    vendor_w, vendor_b = vendor_int8[layer]
    assert q.rshift == rshift == calibration[layer].right_shift_width
    assert vendor_w.size == w.size and vendor_b.size == b.size
    assert int(np.count_nonzero(q.weight.ravel().astype(np.float32) != vendor_w)) == 0
    assert int(np.count_nonzero(q.bias.astype(np.float32) != vendor_b)) == 0
    assert q.weight.dtype == np.int8 and q.bias.dtype == np.int16
    # the rule puts the largest weight in [64, 128)
    assert 64 <= np.abs(q.weight.astype(np.int32)).max() <= 127


def test_total_counts(calibration, float_weights, vendor_int8):
    n_w = n_b = mismatches = 0
    for layer, src in WEIGHT_LAYERS.items():
        q = bm1880_quantize_layer(
            float_weights[f"{layer}_w_0"],
            float_weights[f"{layer}_b_0"],
            _threshold(calibration, src),
            _threshold(calibration, layer),
        )
        vw, vb = vendor_int8[layer]
        mismatches += np.count_nonzero(q.weight.ravel() != vw) + np.count_nonzero(q.bias != vb)
        n_w, n_b = n_w + vw.size, n_b + vb.size
    assert (n_w, n_b, int(mismatches)) == (430_500, 580, 0)


@pytest.mark.parametrize("pool, src, multiplier, rshift", [("pool1", "conv1", 160, 8), ("pool2", "conv2", 135, 7)])
def test_pool_multipliers_match_table(calibration, pool, src, multiplier, rshift):
    got = bm1880_requant_multiplier(_threshold(calibration, src), _threshold(calibration, pool))
    assert got == (multiplier, rshift)
    assert (calibration[pool].threshold_x_quantized[0], calibration[pool].right_shift_width) == got


def test_leaky_relu_scales_match_table(calibration):
    relu = calibration["customized1"].relu_param
    ratio = _threshold(calibration, "ip1") / _threshold(calibration, "customized1")
    gt_scale, gt_shift = bm1880_scale_shift(ratio)
    le_scale, le_shift = bm1880_scale_shift(np.float32(0.1) * ratio)
    assert (int(gt_scale), int(gt_shift)) == (relu.gt_scale, relu.gt_right_shift_width) == (64, 6)
    assert (int(le_scale), int(le_shift)) == (relu.le_scale, relu.le_right_shift_width) == (102, 10)


def test_plain_text_table_agrees(calibration):
    rows = [line.split() for line in (GOLDEN / "bmnet_lenet_calibration").read_text().splitlines() if line.strip()]
    assert len(rows) == 9
    for name, threshold, rshift in rows:
        assert np.float32(threshold) == _threshold(calibration, name)
        if name in WEIGHT_LAYERS:  # the text table's shift column only matches for conv / fc layers
            assert int(rshift) == calibration[name].right_shift_width
