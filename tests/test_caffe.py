"""Caffe frontend: the SDK LeNet against its reference output and against the ONNX frontend, every supported
layer type against onnxruntime (or Caffe's own formulas where ONNX differs), and the error paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from onnx import TensorProto, helper, numpy_helper

from npuc.compiler.errors import CorruptFileError, UnsupportedError, UserError
from npuc.compiler.interp import run
from npuc.frontends.caffe import caffe_schema, import_caffe
from npuc.frontends.onnx import import_onnx

GOLDEN = GOLDEN_ROOT / "bm1880"


def _lenet_input() -> np.ndarray:
    return np.fromfile(GOLDEN / "lenet_input_1_1_28_28.bin", np.float32).reshape(1, 1, 28, 28)


def _only(outputs: dict[str, np.ndarray]) -> np.ndarray:
    assert len(outputs) == 1
    return next(iter(outputs.values()))


def test_lenet_float_prototxt_gives_the_reference_output():
    graph = import_caffe(GOLDEN / "lenet_deploy_float.prototxt", GOLDEN / "lenet_float.caffemodel")
    assert [op.kind for op in graph.ops] == [
        "conv2d", "pool2d", "conv2d", "activation", "activation", "pool2d", "reshape", "gemm", "activation",
        "gemm", "activation",
    ]  # fmt: skip
    assert graph.inputs == ["data"] and graph.outputs == ["elu3"]
    y = _only(run(graph, {"data": _lenet_input()}))
    ref = np.fromfile(GOLDEN / "lenet_output_ref.bin", np.float32)
    assert y.shape == (1, 10)
    np.testing.assert_allclose(y.ravel(), ref, rtol=1e-5, atol=2e-6)
    assert int(np.argmax(y)) == int(np.argmax(ref)) == 5


def test_lenet_deploy_prototxt_equals_the_onnx_frontend():
    # lenet_float.onnx is the optimizer's net (LeakyReLU on ip1, no ELUs after conv2): the same layers as
    # lenet_deploy.prototxt, whose Data layer is fed as the input
    notes: list[str] = []
    graph = import_caffe(
        GOLDEN / "lenet_deploy.prototxt", GOLDEN / "lenet_float.caffemodel", {"data": (1, 1, 28, 28)}, notes
    )
    assert any("Data" in n for n in notes)
    onnx_graph = import_onnx(GOLDEN / "lenet_float.onnx")
    y = _only(run(graph, {"data": _lenet_input()}))
    y_onnx = _only(run(onnx_graph, {onnx_graph.inputs[0]: _lenet_input()}))
    np.testing.assert_allclose(y, y_onnx, rtol=1e-6, atol=1e-6)
    assert [op.kind for op in graph.ops] == [op.kind for op in onnx_graph.ops]


# ---- every layer type against onnxruntime -------------------------------------------------------------------

NET = """
name: "all"
input: "x"
input_shape { dim: 1 dim: 4 dim: 9 dim: 9 }
layer { name: "conv" type: "Convolution" bottom: "x" top: "conv"
  convolution_param { num_output: 6 group: 2 kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 2 stride: 2 dilation: 2 } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" batch_norm_param { eps: 0.001 } }
layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "prelu" type: "PReLU" bottom: "conv" top: "pr" }
layer { name: "leaky" type: "ReLU" bottom: "pr" top: "lk" relu_param { negative_slope: 0.2 } }
layer { name: "sig" type: "Sigmoid" bottom: "pr" top: "sig" }
layer { name: "tanh" type: "TanH" bottom: "pr" top: "tanh" }
layer { name: "sum" type: "Eltwise" bottom: "lk" bottom: "sig" top: "sum"
  eltwise_param { operation: SUM coeff: 1 coeff: -0.5 } }
layer { name: "prod" type: "Eltwise" bottom: "sum" bottom: "tanh" top: "prod" eltwise_param { operation: PROD } }
layer { name: "max" type: "Eltwise" bottom: "prod" bottom: "sig" top: "max" eltwise_param { operation: MAX } }
layer { name: "cat" type: "Concat" bottom: "max" bottom: "pr" top: "cat" }
layer { name: "pool" type: "Pooling" bottom: "cat" top: "pool" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "drop" type: "Dropout" bottom: "pool" top: "pool" }
layer { name: "gap" type: "Pooling" bottom: "cat" top: "gap" pooling_param { pool: AVE global_pooling: true } }
layer { name: "flat" type: "Flatten" bottom: "pool" top: "flat" }
layer { name: "fc" type: "InnerProduct" bottom: "flat" top: "fc" inner_product_param { num_output: 5 } }
layer { name: "elu" type: "ELU" bottom: "fc" top: "elu" elu_param { alpha: 0.5 } }
layer { name: "prob" type: "Softmax" bottom: "elu" top: "prob" }
layer { name: "shape" type: "Reshape" bottom: "gap" top: "shape" reshape_param { shape { dim: 0 dim: -1 } } }
"""


def _weights(rng: np.random.Generator) -> dict[str, list[np.ndarray]]:
    bn = [rng.normal(0, 1, 6), rng.uniform(0.5, 2, 6), np.array([2.0])]  # Caffe stores mean/var times the factor
    return {
        "conv": [rng.normal(0, 0.3, (6, 2, 3, 2)), rng.normal(0, 0.1, 6)],
        "bn": bn,
        "sc": [rng.uniform(0.5, 1.5, 6), rng.normal(0, 0.2, 6)],
        "prelu": [rng.uniform(0, 0.3, 6)],
        "fc": [rng.normal(0, 0.2, (5, 12 * 2 * 3)), rng.normal(0, 0.1, 5)],
    }


def _caffemodel(path: Path, weights: dict[str, list[np.ndarray]]) -> Path:
    net = caffe_schema().NetParameter(name="all")
    for name, blobs in weights.items():
        layer = net.layer.add(name=name)
        for value in blobs:
            blob = layer.blobs.add()
            blob.shape.dim.extend(value.shape)
            blob.data.extend(np.asarray(value, np.float32).ravel().tolist())
    path.write_bytes(net.SerializeToString())
    return path


def _onnx_reference(w: dict[str, list[np.ndarray]]) -> onnx.ModelProto:
    mean, var = w["bn"][0] / 2.0, w["bn"][1] / 2.0
    f32 = {
        "cw": w["conv"][0], "cb": w["conv"][1], "bn_s": w["sc"][0], "bn_b": w["sc"][1], "bn_m": mean,
        "bn_v": var, "slope": w["prelu"][0].reshape(6, 1, 1), "half": np.array(-0.5), "fw": w["fc"][0],
        "fb": w["fc"][1], "shape": None,
    }  # fmt: skip
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in f32.items() if v is not None]
    inits.append(numpy_helper.from_array(np.array([1, 12], np.int64), "shape"))
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "cw", "cb"], ["conv"], group=2, kernel_shape=[3, 2], pads=[1, 2, 1, 2], strides=[2, 2],
          dilations=[2, 2]),
        n("BatchNormalization", ["conv", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], epsilon=0.001),
        n("PRelu", ["bn", "slope"], ["pr"]),
        n("LeakyRelu", ["pr"], ["lk"], alpha=0.2),
        n("Sigmoid", ["pr"], ["sig"]),
        n("Tanh", ["pr"], ["tanh"]),
        n("Mul", ["sig", "half"], ["sig_half"]),
        n("Add", ["lk", "sig_half"], ["sum"]),
        n("Mul", ["sum", "tanh"], ["prod"]),
        n("Max", ["prod", "sig"], ["max"]),
        n("Concat", ["max", "pr"], ["cat"], axis=1),
        n("MaxPool", ["cat"], ["pool"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        n("GlobalAveragePool", ["cat"], ["gap"]),
        n("Flatten", ["pool"], ["flat"]),
        n("Gemm", ["flat", "fw", "fb"], ["fc"], transB=1),
        n("Elu", ["fc"], ["elu"], alpha=0.5),
        n("Softmax", ["elu"], ["prob"], axis=1),
        n("Reshape", ["gap", "shape"], ["shape_out"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "all", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("shape_out", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_every_layer_type_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    weights = _weights(rng)
    (tmp_path / "all.prototxt").write_text(NET)
    graph = import_caffe(tmp_path / "all.prototxt", _caffemodel(tmp_path / "all.caffemodel", weights))
    assert graph.outputs == ["prob", "shape"]
    assert graph.shape("cat") == (1, 12, 4, 6) and graph.shape("pool") == (1, 12, 2, 3)  # ceil (floor: 1x2)
    x = rng.normal(0, 1, (1, 4, 9, 9)).astype(np.float32)
    got = run(graph, {"x": x})
    ref = ort.InferenceSession(_onnx_reference(weights).SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(got["prob"], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["shape"], ref[1], rtol=1e-5, atol=1e-6)


def _caffe_ave_pool(x: np.ndarray, k: int, s: int, p: int) -> np.ndarray:
    """Caffe's AVE pooling, written out: ceil output size, divisor = window clipped to the padded input."""
    h = x.shape[2]
    out = -(-(h + 2 * p - k) // s) + 1
    if (out - 1) * s >= h + p:
        out -= 1
    y = np.zeros(x.shape[:2] + (out, out), np.float64)
    for i in range(out):
        for j in range(out):
            h0, w0 = i * s - p, j * s - p
            h1, w1 = min(h0 + k, h + p), min(w0 + k, h + p)
            size = (h1 - h0) * (w1 - w0)
            window = x[:, :, max(h0, 0) : min(h1, h), max(w0, 0) : min(w1, h)]
            y[:, :, i, j] = window.sum(axis=(2, 3)) / size
    return y


def test_average_pooling_follows_caffe_rounding(tmp_path):
    (tmp_path / "p.prototxt").write_text(
        'input: "x" input_dim: 1 input_dim: 2 input_dim: 8 input_dim: 8\n'
        'layer { name: "p" type: "Pooling" bottom: "x" top: "p" '
        "pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }\n"
    )
    graph = import_caffe(tmp_path / "p.prototxt")
    x = np.random.default_rng(1).normal(0, 1, (1, 2, 8, 8)).astype(np.float32)
    y = run(graph, {"x": x})["p"]
    assert y.shape == (1, 2, 5, 5)  # ceil((8 + 2 - 3) / 2) + 1 = 5
    np.testing.assert_allclose(y, _caffe_ave_pool(x, 3, 2, 1), rtol=1e-5, atol=1e-6)


# ---- errors ---------------------------------------------------------------------------------------------------


def test_unsupported_layer_names_it(tmp_path):
    (tmp_path / "u.prototxt").write_text(
        'input: "x" input_dim: 1 input_dim: 1 input_dim: 4 input_dim: 4\n'
        'layer { name: "norm1" type: "LRN" bottom: "x" top: "y" }\n'
    )
    with pytest.raises(UnsupportedError, match=r"layer 'norm1' has type 'LRN'"):
        import_caffe(tmp_path / "u.prototxt")


def test_parse_error_quoting_a_carriage_return_is_one_line(tmp_path):
    """bench/fuzz.py --seed 10, caffe_prototxt case 235: a byte flipped into CR inside a line the parser quotes
    made the message two lines."""
    (tmp_path / "cr.prototxt").write_bytes(b'layer {\n  name: "c"\n  type: \rottom: "x"\n}\n')
    with pytest.raises(UserError) as info:
        import_caffe(tmp_path / "cr.prototxt")
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'cr.prototxt'}:3:") and "\\r" in message, message
    assert message.splitlines() == [message], message


def test_bad_files_are_user_errors(tmp_path):
    (tmp_path / "bad.prototxt").write_text('layer { name: "c" type: "Convolution" convolution_param { nope: 1 } }')
    with pytest.raises(UserError, match=r"bad.prototxt:1:"):
        import_caffe(tmp_path / "bad.prototxt")
    with pytest.raises(UserError, match=r"layer 'conv1' \(Convolution\): has no weight blob #0"):
        import_caffe(GOLDEN / "lenet_deploy_float.prototxt")
    (tmp_path / "junk.caffemodel").write_bytes(b"\xff\xff\xff\xff")
    with pytest.raises(CorruptFileError, match="not a binary caffemodel"):
        import_caffe(GOLDEN / "lenet_deploy_float.prototxt", tmp_path / "junk.caffemodel")
    with pytest.raises(UserError, match="--input-shape data:"):
        import_caffe(GOLDEN / "lenet_deploy.prototxt", GOLDEN / "lenet_float.caffemodel")
