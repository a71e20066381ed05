"""The bm1880 QDQ export (`npuc export -t bm1880`): its exact form gives the bmodel simulator's output codes in
onnxruntime, for both weight-scale rules (smallcnn, P-Net, PP-LCNet, every layer form)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from metrics import cosine
from onnx import TensorProto, helper, numpy_helper
from qdq_cases import GOLDEN, cli, import_and_canon, int8_tensor_mismatches, session, smallcnn_feeds

from npuc.backends.bm1880.build import build as build_bmodel
from npuc.backends.bm1880.build import compile_bmodel
from npuc.backends.bm1880.container import BModel, load_bmodel, read_bmodel, write_bmodel
from npuc.backends.bm1880.qdq import lower_for_export, write_qdq_bm1880
from npuc.backends.bm1880.quantize import WEIGHT_RULES
from npuc.backends.bm1880.sim import quantize as bm1880_runner_quantize
from npuc.backends.bm1880.sim import run_bmodel
from npuc.compiler.errors import UserError
from npuc.compiler.interp import run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.targets import BuildRequest
from npuc.frontends.onnx import import_onnx
from npuc.models.fetch import get_model
from npuc.models.images import model_inputs
from npuc.models.make_models import make_all
from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate, max_abs_thresholds, tensor_table_names
from npuc.passes.calibration.calitable import CalibrationTable, Threshold, read_table, write_table
from npuc.passes.export.qdq import (
    qdq_for_target,
    thresholds_for_model,
    write_qdq_exact,
)
from npuc.passes.quantization.quantize import ThresholdMap, quantize
from npuc.passes.rewrite.canonicalize import canonicalize

# ---- bm1880: the exact form against the bmodel simulator --------------------------------------------------------


def bm1880_build(graph: Graph, model_path: Path, table: Path, out: Path, **options) -> tuple[BModel, str]:
    """`npuc build --target bm1880` through the backend's entry point, read back from the file's bytes; and the
    weight scale the build's summary names."""
    result = build_bmodel(BuildRequest(graph, model_path, out, calib_table=table, options=options))
    return load_bmodel(out), result.summary["weight_scale"]


def bmodel_codes(model: BModel, feed: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(int8 codes, float values) of the simulated bmodel's outputs: the runner returns q·float32(T/128), from
    which q is recovered exactly (checked)."""
    floats = run_bmodel(model, {"input": feed})
    codes = {}
    for t in model.commands[0].outputs:
        scale = np.float32(t.threshold / 128.0)
        q = np.rint(floats[t.name] / scale)
        np.testing.assert_array_equal(q.astype(np.float32) * scale, floats[t.name])
        codes[t.name] = q.astype(np.int8)
    return codes, floats


def with_bmodel_output_codes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """`model` with the int8 codes of each bmodel output (value_info documented as such) as extra outputs;
    returns it and bmodel output name -> ONNX name."""
    names = {}
    for info in model.graph.value_info:
        if found := re.match(r"bmodel output '(.+?)'", info.doc_string):
            names[found.group(1)] = info.name
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.INT8, None) for n in names.values())
    return probe, names


def run_named(sess: ort.InferenceSession, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


def assert_codes_equal(got: dict[str, np.ndarray], names: dict[str, str], codes: dict[str, np.ndarray]) -> int:
    """Every bmodel output's codes equal the ONNX model's; returns how many codes were compared."""
    assert set(names) == set(codes)
    for name, onnx_name in names.items():
        np.testing.assert_array_equal(got[onnx_name].reshape(codes[name].shape), codes[name])
    return sum(c.size for c in codes.values())


def gained_layer_records(model: onnx.ModelProto) -> dict[str, bytes]:
    """Each layer with per-channel gains in an exact bm1880 model, as the bmodel's weight area stores it: int8
    weights [oc][kh][kw][ic] (depthwise [c][kh][kw]), the 16-bit bias as its low then high byte plane
    (specs/bm1880.md §2.7), the u8 gains; read from the model's initializers (`<layer>_weight/_bias/_gains`)."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    records = {}
    for name in (n for n in inits if n.endswith("_gains")):
        layer = name.removesuffix("_gains")
        weight = np.ascontiguousarray(inits[f"{layer}_weight"].transpose(0, 2, 3, 1)).astype(np.int8)
        bias = inits.get(f"{layer}_bias", np.zeros(0, np.int64)).ravel()
        planes = bias.astype(np.int16).view(np.uint16)
        np.testing.assert_array_equal(planes.view(np.int16), bias)  # 16-bit values, as the BD reads them
        gains = inits[name].ravel()
        assert gains.min() >= 1 and gains.max() <= 128  # u8 2^(7-k)
        records[layer] = (weight.tobytes() + (planes & 0xFF).astype(np.uint8).tobytes()
                          + (planes >> 8).astype(np.uint8).tobytes() + gains.astype(np.uint8).tobytes())  # fmt: skip
    return records


@pytest.mark.parametrize("weight_scale", [None, "layer", "channel"])
def test_bm1880_exact_form_equals_the_bmodel_on_smallcnn(smallcnn, tmp_path, weight_scale):
    """`npuc export -t bm1880 --qdq` (exact by default) against the bmodel `npuc build -t bm1880` writes, simulated
    from its bytes, both with the cali_table's default weight scale (per-channel gains) or both with the same
    `--option weight_scale`: the 10 output codes of all 9 pictures are identical, and so are the dequantized
    floats. With gains, the 5 conv/depthwise layers that have them hold the same integers in both files."""
    table = GOLDEN / "smallcnn_cali_table.txt"
    options = {"weight_scale": weight_scale} if weight_scale else {}
    bmodel, rule = bm1880_build(smallcnn, GOLDEN / "smallcnn.onnx", table, tmp_path / "smallcnn.bmodel", **options)
    assert rule == (weight_scale or "channel")
    out = tmp_path / "smallcnn_bm1880.onnx"
    option = ["--option", f"weight_scale={weight_scale}"] if weight_scale else []
    cli(["export", str(GOLDEN / "smallcnn.onnx"), "-t", "bm1880", "--qdq", "--calib", str(table), "-o", str(out),
         *option])  # fmt: skip
    model = onnx.load(str(out))
    assert WEIGHT_RULES[rule] in model.doc_string
    records = gained_layer_records(model)
    assert len(records) == (5 if rule == "channel" else 0)  # the FC's channels need no gain
    assert all(record in bmodel.weights[0] for record in records.values())
    probe, names = with_bmodel_output_codes(model)
    assert names == {"output": "output_int8"}
    sess = session(probe)
    compared, distinct = 0, set()
    for feed in smallcnn_feeds():
        codes, floats = bmodel_codes(bmodel, feed["input"])
        got = run_named(sess, feed)
        compared += assert_codes_equal(got, names, codes)
        np.testing.assert_array_equal(got["output"], floats["output"])
        distinct |= set(codes["output"].ravel().tolist())
    assert compared == 90 and len(distinct) >= 40  # 56 (gains) or 55 distinct codes: a spread, not saturation
    counts: dict[str, int] = {}
    for node in probe.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    assert counts["ConvInteger"] == 7 and counts["MaxPool"] == 1  # 4 conv, 1 depthwise, fc, the avg pool's sums
    assert counts["QuantizeLinear"] == 1 and counts["DequantizeLinear"] == 1
    assert not {"Conv", "Gemm", "MatMul"} & set(counts)


def test_bm1880_input_quantization_matches_the_runner(smallcnn):
    """sat8(floor(x·128/T + 0.5)) in float64, over ±300 half steps (ties and saturation): the ONNX input codes
    equal the bmodel runner's."""
    table = read_table(GOLDEN / "smallcnn_cali_table.txt").thresholds()
    names = tensor_table_names(onnx.load(str(GOLDEN / "smallcnn.onnx")))
    threshold = lower_for_export(smallcnn, table, names).net.thresholds["input"]
    step = np.float32(threshold) / np.float32(128)
    x = np.zeros(smallcnn.shape("input"), np.float32).ravel()
    x[:1201] = np.arange(-600, 601, dtype=np.float32) / np.float32(2) * step
    x = x.reshape(smallcnn.shape("input"))
    probe = onnx.ModelProto()
    probe.CopyFrom(write_qdq_bm1880(smallcnn, table, names))
    probe.graph.output.append(helper.make_tensor_value_info("input_int8", TensorProto.INT8, None))
    codes = run_named(session(probe), {"input": x})["input_int8"]
    expected = bm1880_runner_quantize(x, threshold)
    np.testing.assert_array_equal(codes, expected)
    assert expected.min() == -128 and expected.max() == 127


@pytest.fixture(scope="module")
def pnet_bm1880(real_model, tmp_path_factory):
    """The MTCNN P-Net at 160x120 with max-abs thresholds of 3 of its real pictures (written as a cali_table);
    the 3 pictures after them are the test inputs (values past a threshold saturate)."""
    path = real_model("mtcnn_pnet")
    graph = import_onnx(path, {"input_1": (1, 160, 120, 3)})
    canonicalize(graph)
    feeds = model_inputs("mtcnn_pnet", 6)
    thresholds = max_abs_thresholds(graph, feeds[:3], floor=1e-3)
    table = tmp_path_factory.mktemp("pnet_bm1880") / "pnet_cali_table"
    write_table(CalibrationTable({n: Threshold(t, -t, t) for n, t in thresholds.items()}), table)
    return path, graph, table, feeds[3:]


def test_bm1880_exact_form_equals_the_bmodel_on_pnet(pnet_bm1880, tmp_path):
    """Box regression (4 x 75 x 55) and face scores (2 x 75 x 55) of three real pictures: every int8 code of
    the two bmodel outputs is identical (74,250 codes). The host tail BMNet leaves out of the bmodel follows in
    float32: the box transpose is exact; the softmax of the face scores is onnxruntime's against numpy's
    (cosine 1.0, |difference| <= 8.5e-8 measured: float rounding of exp and sum only)."""
    path, graph, table, feeds = pnet_bm1880
    bmodel, rule = bm1880_build(graph, path, table, tmp_path / "pnet.bmodel")
    assert rule == "channel"  # a cali_table's default
    model = qdq_for_target(graph, "bm1880", read_table(table), model_path=path)
    probe, names = with_bmodel_output_codes(model)
    assert set(names) == {"convolution_output", "convolution_output1"}
    sess = session(probe)
    compared = 0
    for feed in feeds:
        codes, floats = bmodel_codes(bmodel, np.ascontiguousarray(feed["input_1"].transpose(0, 3, 1, 2)))
        got = run_named(sess, feed)
        compared += assert_codes_equal(got, names, codes)
        assert len(np.unique(codes["convolution_output"])) >= 100
        np.testing.assert_array_equal(got["conv2d_4"], floats["convolution_output"].transpose(0, 2, 3, 1))
        face = floats["convolution_output1"].transpose(0, 2, 3, 1).astype(np.float64)
        prob = np.exp(face - face.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        assert cosine(got["softmax"], prob) >= 0.9999
        assert float(np.abs(got["softmax"] - prob).max()) < 1e-6
    assert compared == 3 * 6 * 75 * 55


def test_bm1880_exact_form_equals_the_bmodel_on_pplcnet_with_channel_gains(pplcnet, tmp_path):
    """PP-LCNet with npuc's KL cali_table: the build's default is per-channel gains (for its BN-folded depthwise
    convs) and the default export writes the same layers: each of the layers with gains in the lowering is in
    the ONNX model and, with the same integers, in the bmodel's weight area; the 4 logit codes of 4 pictures
    calibration never saw are identical (the host's softmax follows in float32)."""
    path, graph, table, _ = pplcnet
    write_table(table, tmp_path / "cali_table")
    bmodel, rule = bm1880_build(graph, path, tmp_path / "cali_table", tmp_path / "pplcnet.bmodel")
    assert rule == "channel"
    model = qdq_for_target(graph, "bm1880", table, model_path=path)
    names = tensor_table_names(onnx.load(str(path)))
    layers = lower_for_export(graph, table.thresholds(), names, channel_gains=True).net.layers
    gained = {layer.name for layer in layers if layer.gains is not None}
    records = gained_layer_records(model)
    assert set(records) == gained and len(gained) >= 20
    assert any(layer.kind == "dwconv" and layer.gains.min() < 128 for layer in layers if layer.gains is not None)
    assert all(record in bmodel.weights[0] for record in records.values())
    probe, outputs = with_bmodel_output_codes(model)
    sess = session(probe)
    compared = 0
    for feed in model_inputs("pplcnet_orientation", 12)[8:]:
        codes, _ = bmodel_codes(bmodel, feed["x"])
        compared += assert_codes_equal(run_named(sess, feed), outputs, codes)
    assert compared == 4 * 4


def _bm1880_mix_model(path: Path) -> None:
    """A ReLU layer of its own, eltwise max, a ceil-mode 3x3/2 max pool, concat and LeakyReLU."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in (("w1", (8, 4, 3, 3)), ("b1", (8,)), ("w2", (8, 4, 1, 1)))]  # fmt: skip
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["x"], ["xr"]),
        n("Conv", ["xr", "w2"], ["c2"]),
        n("Max", ["c1", "c2"], ["mx"]),
        n("MaxPool", ["mx"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        n("AveragePool", ["mx"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Concat", ["mp", "ap"], ["cat"], axis=1),
        n("LeakyRelu", ["cat"], ["y"], alpha=0.2),
    ]
    graph = helper.make_graph(
        nodes, "bm1880_mix", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6])], initializer=inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)


BM1880_FAMILIES = (
    "tinycnn", "conv_depthwise", "conv_group", "conv_dilated", "conv_asym_pad", "conv_1x1_nobias", "conv_bn_relu",
    "pool_max_3x3_s2", "pool_avg", "pool_global_avg", "eltwise_add", "act_relu", "act_leakyrelu", "act_prelu", "gemm",
    "matmul_dense", "concat",
)  # fmt: skip


@pytest.mark.parametrize("weight_scale", ["layer", "channel"])
def test_bm1880_exact_form_equals_the_bmodel_on_every_layer_form(tmp_path, weight_scale):
    """17 op-family models and a mix of eltwise max / ceil pool / concat / leaky, with thresholds of 0.7x..1.3x
    the max so that pools, concat inputs and activation sides requantize and values saturate: all output codes
    equal the bmodel's, and every layer form of the bm1880 lowering was exercised, with either weight scale
    (per-channel gains on conv, depthwise and FC layers)."""
    gains = weight_scale == "channel"
    paths = make_all(tmp_path, list(BM1880_FAMILIES))
    _bm1880_mix_model(tmp_path / "mix.onnx")
    paths["mix"] = tmp_path / "mix.onnx"
    rng = np.random.default_rng(11)
    forms: set[str] = set()
    gained: set[str] = set()
    compared = 0
    for name, path in paths.items():
        graph = import_and_canon(path)
        inp = graph.inputs[0]
        feeds = [{inp: rng.standard_normal(graph.shape(inp)).astype(np.float32)} for _ in range(3)]
        table = {t: v * float(rng.uniform(0.7, 1.3)) for t, v in max_abs_thresholds(graph, feeds, floor=1e-3).items()}
        bmodel = compile_bmodel([graph], table, None, "layer-group", name, weight_scale).model
        bmodel = read_bmodel(write_bmodel(bmodel))
        for layer in lower_for_export(graph, table, None, gains).net.layers:
            requant = layer.kind in ("pool", "concat") and any(m != 1 for m in layer.multipliers)
            forms.add(f"{layer.kind}:{layer.mode}{':requant' if requant else ''}")
            if layer.gains is not None and layer.gains.min() < 128:
                gained.add(f"{layer.kind}:{'relu' if layer.relu else ''}")
        probe, names = with_bmodel_output_codes(write_qdq_bm1880(graph, table, channel_gains=gains))
        sess = session(probe)
        for feed in feeds:
            codes, _ = bmodel_codes(bmodel, feed[inp])
            compared += assert_codes_equal(run_named(sess, feed), names, codes)
    assert {"conv:", "dwconv:", "pool:max:requant", "pool:avg:requant", "act:relu", "act:leaky",
            "act:prelu", "eltwise:add", "eltwise:max", "concat:1:requant"} <= forms  # fmt: skip
    assert gained == ({"conv:", "conv:relu", "dwconv:"} if gains else set())
    assert compared > 90_000  # measured 94,044 codes


@pytest.mark.parametrize("target", ["cv18xx", "lyngor", "dmp", "bpu"])
def test_every_symmetric_target_exports_its_reference_exactly(smallcnn, smallcnn_int8, target):
    """`npuc export --qdq -t T` for the targets that share the symmetric int8 graph: the output equals npuc's
    int8 reference (for bpu the codes; its contract dequantizes in float32, not through bf16)."""
    table = read_table(GOLDEN / "smallcnn_cali_table.txt")
    model = session(qdq_for_target(smallcnn, target, table, model_path=GOLDEN / "smallcnn.onnx"))
    for feed in smallcnn_feeds()[:4]:
        ours = run(smallcnn_int8, feed, kernels=QUANT_KERNELS)["output"]
        theirs = model.run(None, feed)[0]
        if target == "bpu":
            assert cosine(theirs, ours) >= 0.99999
        else:
            np.testing.assert_array_equal(theirs, ours)


def test_yolov8n_exact_form_is_bit_exact(real_model, tmp_path):
    """YOLOv8n (the bpu export's QDQ model): its C2f splits are written as one slice per output
    (passes.export.qdq.split_into_slices) and its nearest-neighbour int8 upsampling moves codes like any data move;
    both outputs and every int8 tensor equal npuc's int8 reference bit for bit."""
    from npuc.passes.export.qdq import split_into_slices

    path = real_model("yolov8n_320")
    spec = get_model("yolov8n_320")
    graph = import_onnx(path, spec.input_shapes)
    canonicalize(graph)
    feeds = model_inputs("yolov8n_320", 3)
    for i, feed in enumerate(feeds):
        np.save(tmp_path / f"{i}.npy", feed["images"])
    table = calibrate(path, [tmp_path], options=CalibrationOptions(method="max"), input_shapes=spec.input_shapes).table
    graph = split_into_slices(graph)
    assert not any(op.kind == "split" for op in graph.ops)
    qgraph = quantize(graph, thresholds_for_model(graph, table, path), "cv18xx_int8")
    assert any(op.kind == "resize" and op.attrs.quant.mode == "int8" for op in qgraph.ops)
    exact = write_qdq_exact(qgraph)
    out = session(exact)
    for feed in feeds[:2]:
        ours = run(qgraph, feed, kernels=QUANT_KERNELS)
        for name, theirs in zip([o.name for o in out.get_outputs()], out.run(None, feed)):
            np.testing.assert_array_equal(theirs, ours[name])
    count, mismatches = int8_tensor_mismatches(qgraph, exact, feeds[2:])
    assert count > 100 and mismatches == {}


@pytest.mark.parametrize(
    ("kernel", "stride", "pads", "out_pad", "group"),
    [
        (2, 2, (0, 0, 0, 0), (0, 0), 1),
        (4, 2, (1, 1, 1, 1), (0, 0), 1),
        (3, 2, (1, 1, 1, 1), (1, 1), 4),
        (3, 1, (1,) * 4, (0, 0), 1),
    ],
)
def test_int8_conv_transpose_exact_form_is_bit_exact(tmp_path, kernel, stride, pads, out_pad, group):
    """int8 ConvTranspose (PP-OCR det's upsampling head) as the kernel computes it: ConvInteger over the
    zero-spread codes with the flipped, channel-swapped filters; equal to npuc's reference code for code."""
    rng = np.random.default_rng(kernel * 10 + stride + group)
    c_in, c_out = 8, 12
    w = (rng.standard_normal((c_in, c_out // group, kernel, kernel)) * 0.3).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], strides=[stride] * 2, pads=list(pads),
                            output_padding=list(out_pad), group=group)  # fmt: skip
    relu = helper.make_node("Relu", ["t"], ["y"])
    bias = (rng.standard_normal(c_out) * 0.1).astype(np.float32)
    h = 6
    out_h = stride * (h - 1) + out_pad[0] + kernel - pads[0] - pads[2]
    graph = helper.make_graph(
        [node, relu], "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, h, h + 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c_out, out_h, None])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), tmp_path / "m.onnx")
    graph = import_and_canon(tmp_path / "m.onnx")
    feeds = [{"x": rng.standard_normal((1, c_in, h, h + 1)).astype(np.float32)} for _ in range(3)]
    th = ThresholdMap()
    for feed in feeds:
        for name, v in run(graph, feed, keep_all=True).items():
            th.thresholds[name] = max(th.thresholds.get(name, 1e-3), float(np.abs(v).max()))
    qgraph = quantize(graph, th, "cv18xx_int8")
    assert [op.attrs.quant.mode for op in qgraph.ops if op.kind == "conv_transpose2d"] == ["int8"]
    model = write_qdq_exact(qgraph)
    exact = session(model)
    for feed in feeds:
        np.testing.assert_array_equal(exact.run(None, feed)[0], run(qgraph, feed, kernels=QUANT_KERNELS)["y"])


def test_bm1880_exact_form_equals_the_bmodel_with_weights_beyond_int8(tmp_path):
    """A conv/FC whose scaled weights exceed int8 even unshifted (max|W|·Tx/Ty >= 128: PicoDet's stem) has no
    BMNet shift; with gains it is quantized at 2^-s of its scale and the gain step shifts by 7 - s. Each first
    conv/depthwise/FC here gets an output threshold that makes its scaled weights 200 or 600 (s = 1, 3): the
    bmodel's codes equal the exact export's."""
    paths = make_all(tmp_path, ["tinycnn", "conv_depthwise", "gemm"])
    rng = np.random.default_rng(5)
    shifts, compared = set(), 0
    for (name, path), peak in zip(paths.items(), (200.0, 600.0, 200.0), strict=True):
        graph = import_and_canon(path)
        inp = graph.inputs[0]
        feeds = [{inp: rng.standard_normal(graph.shape(inp)).astype(np.float32)} for _ in range(3)]
        table = max_abs_thresholds(graph, feeds, floor=1e-3)
        first = next(op for op in graph.ops if op.kind in ("conv2d", "gemm"))
        weight = np.abs(graph.const(first.inputs[1])).max()
        table[first.outputs[0]] = float(table[first.inputs[0]] * weight / peak)
        with pytest.raises(UserError, match="cannot use a right shift"):  # BMNet's rule
            compile_bmodel([graph], table, None, "layer-group", name, "layer")
        bmodel = read_bmodel(write_bmodel(compile_bmodel([graph], table, None, "layer-group", name, "channel").model))
        shifts |= {layer.gain_shift for layer in lower_for_export(graph, table, None, True).net.layers
                   if layer.name == first.name}  # fmt: skip
        probe, names = with_bmodel_output_codes(write_qdq_bm1880(graph, table, channel_gains=True))
        sess = session(probe)
        for feed in feeds:
            codes, _ = bmodel_codes(bmodel, feed[inp])
            compared += assert_codes_equal(run_named(sess, feed), names, codes)
    assert shifts == {6, 4}
    assert compared > 100
