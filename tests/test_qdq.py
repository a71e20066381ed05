"""QDQ ONNX export: onnxruntime runs npuc's int8 numerics. The exact form gives the quantized reference's int8
tensors and outputs bit for bit (smallcnn, PP-LCNet, an every-op model with bf16 fallbacks); the plain form
(float ops between QuantizeLinear/DequantizeLinear) agrees to cosine 0.9999 on smallcnn and 0.99 on PP-LCNet.
bm1880's exact form gives the output codes of the bmodel npuc builds, simulated from its bytes (smallcnn, P-Net,
PP-LCNet, every layer form of the bm1880 lowering), with BMNet's per-layer shifts and with the per-channel gains a
cali_table build uses by default."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from accumulator_cases import saturating_bias_model, wrap_feeds
from metrics import cosine
from onnx import TensorProto, helper, numpy_helper
from qdq_cases import GOLDEN, cli, import_and_canon, int8_tensor_mismatches, session, smallcnn_feeds

from npuc.cli.app import main
from npuc.compiler.errors import UserError
from npuc.compiler.interp import run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.numformats.bm1880_int8 import bm1880_quantize_layer
from npuc.compiler.numformats.cv18xx_int8 import cv18xx_apply_multiplier_rshift, cv18xx_quantize_activation
from npuc.compiler.numformats.gemmlowp import rounding_divide_by_pot, saturating_rounding_doubling_high_mul
from npuc.passes.calibration.calitable import read_table
from npuc.passes.export.qdq import (
    plan_bm1880,
    plan_from_quantized,
    qdq_for_target,
    thresholds_for_model,
    write_qdq,
    write_qdq_exact,
)
from npuc.passes.export.qdq_exact import ExactBuilder
from npuc.passes.quantization.quantize import ThresholdMap, quantize


def test_smallcnn_qdq_agrees_with_quantized_reference(smallcnn_int8):
    qdq = session(write_qdq(smallcnn_int8, plan_from_quantized(smallcnn_int8)))
    for feed in smallcnn_feeds():
        ours = run(smallcnn_int8, feed, kernels=QUANT_KERNELS)["output"]
        theirs = qdq.run(None, feed)[0]
        assert cosine(ours, theirs) >= 0.9999
        assert ours.argmax() == theirs.argmax()


def test_smallcnn_qdq_structure(smallcnn_int8):
    plan = plan_from_quantized(smallcnn_int8)
    model = write_qdq(smallcnn_int8, plan)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    int8_activations = [n for n, t in smallcnn_int8.tensors.items() if t.dtype == "int8" and not t.is_const]
    assert counts["QuantizeLinear"] == len(int8_activations) == len(plan.act) == 11
    assert counts["Conv"] == 5 and counts["Gemm"] == 1
    # weights and biases are integers behind DequantizeLinear, conv weights per output channel
    inits = {i.name: i for i in model.graph.initializer}
    conv_w = next(n for n in model.graph.node if n.op_type == "Conv").input[1]
    dq = next(n for n in model.graph.node if n.output[0] == conv_w)
    assert inits[dq.input[0]].data_type == onnx.TensorProto.INT8
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0}
    assert len(onnx.numpy_helper.to_array(inits[dq.input[1]])) == inits[dq.input[0]].dims[0]
    assert model.opset_import[0].version == 17


def test_conv_weight_scale_reproduces_the_qdm_multiplier(smallcnn_int8):
    plan = plan_from_quantized(smallcnn_int8)
    op = next(op for op in smallcnn_int8.ops if op.kind == "conv2d")
    q = op.attrs.quant
    w = plan.consts[(op.name, 1)]
    th_x, th_y = q.inputs[0].threshold, q.output.threshold
    # s_x · s_w / s_y must equal M · 2^-(31 + rshift) per channel
    real = (th_x / 127) * w.scale.astype(np.float64) / (th_y / 127)
    expected = q.multiplier.astype(np.float64) * np.ldexp(1.0, -(31 + q.rshift.astype(np.int32)))
    np.testing.assert_allclose(real, expected, rtol=1e-6)
    b = plan.consts[(op.name, 2)]
    np.testing.assert_allclose(b.scale, w.scale * np.float32(th_x / 127), rtol=1e-6)


def test_eltwise_inputs_get_their_multiplier_scale(smallcnn_int8):
    plan = plan_from_quantized(smallcnn_int8)
    add = next(op for op in smallcnn_int8.ops if op.kind == "eltwise")
    q = add.attrs.quant
    for i, m in enumerate(np.asarray(q.multiplier).ravel()):
        assert plan.dq_scales[(add.name, i)] == pytest.approx(abs(int(m)) / 2 ** int(q.rshift) * float(q.output.scale))


def test_bm1880_plan_uses_th_over_128_and_layer_shift(smallcnn):
    table = read_table(GOLDEN / "smallcnn_cali_table.txt")
    th = thresholds_for_model(smallcnn, table, GOLDEN / "smallcnn.onnx")
    plan = plan_bm1880(smallcnn, th)
    op = next(op for op in smallcnn.ops if op.kind == "conv2d")
    tx, ty = th.thresholds[op.inputs[0]], th.thresholds[op.outputs[0]]
    assert plan.act[op.outputs[0]] == pytest.approx(ty / 128)
    layer = bm1880_quantize_layer(smallcnn.const(op.inputs[1]), smallcnn.const(op.inputs[2]), tx, ty)
    np.testing.assert_array_equal(plan.consts[(op.name, 1)].data, layer.weight)
    assert float(plan.consts[(op.name, 1)].scale) == pytest.approx(ty / (tx * 2**layer.rshift))
    assert float(plan.consts[(op.name, 2)].scale) == pytest.approx(ty / (128 * 2**layer.rshift))
    model = session(qdq_for_target(smallcnn, "bm1880", table, model_path=GOLDEN / "smallcnn.onnx", form="plain"))
    for feed in smallcnn_feeds()[:4]:
        assert cosine(model.run(None, feed)[0], run(smallcnn, feed)["output"]) >= 0.999


def test_fp16_targets_show_symmetric_int8_and_say_so(smallcnn):
    table = read_table(GOLDEN / "smallcnn_cali_table.txt")
    model = qdq_for_target(smallcnn, "lyngor", table)
    assert model.doc_string.startswith("lyngor runs fp16")
    with pytest.raises(UserError, match="no QDQ export for target 'tpu'"):
        qdq_for_target(smallcnn, "tpu", table)


def test_pplcnet_plain_qdq_is_close_and_exact_form_is_bit_exact(pplcnet):
    """Plain QDQ: QuantizeLinear rounds once, half to even, where npuc's QDM requantization rounds twice (at 2^31,
    then half away at 2^rshift); the first 1-code differences (130 codes of the first conv on picture 5) grow
    through the depthwise layers: cosine 1.0 on the page pictures, 0.995 on the text ones (measured 0.99999994,
    0.9999998, 0.9999996, 0.9999999, 0.99579, 0.99464, 0.99995, 0.99593). The exact form: every picture's
    output and all 71 int8 tensors equal the reference bit for bit (the head's MatMul and bias Add are one
    Gemm)."""
    path, graph, table, feeds = pplcnet
    qgraph = quantize(graph, thresholds_for_model(graph, table, path), "cv18xx_int8")
    int8_ops = sum(1 for op in qgraph.ops if op.attrs.quant.mode == "int8")
    assert int8_ops >= 70  # table rows found for the folded conv+BN tensors too
    plain = session(write_qdq(qgraph, plan_from_quantized(qgraph)))
    exact = write_qdq_exact(qgraph)
    exact_out = session(exact)
    cosines = []
    for feed in feeds:
        ours = run(qgraph, feed, kernels=QUANT_KERNELS)["fetch_name_0"]
        theirs = plain.run(None, feed)[0]
        cosines.append(cosine(ours, theirs))
        assert ours.argmax() == theirs.argmax()
        np.testing.assert_array_equal(exact_out.run(None, feed)[0], ours)
    assert max(cosines) >= 0.99999 and min(cosines) >= 0.99 and float(np.mean(cosines)) >= 0.995
    assert int8_tensor_mismatches(qgraph, exact, feeds[4:6]) == (71, {})


def test_export_command_writes_deterministic_qdq(tmp_path):
    out = tmp_path / "small_qdq.onnx"
    args = ["export", str(GOLDEN / "smallcnn.onnx"), "--target", "cv18xx", "--qdq", "-o", str(out)]
    cli([*args, "--calib", str(GOLDEN / "smallcnn_cali_table.txt")])
    first = out.read_bytes()
    cli([*args, "--calib", str(GOLDEN / "smallcnn_cali_table.txt")])
    assert out.read_bytes() == first
    feed = smallcnn_feeds()[0]
    qgraph = quantize(
        import_and_canon(GOLDEN / "smallcnn.onnx"), read_table(GOLDEN / "smallcnn_cali_table.txt"), "cv18xx_int8"
    )
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_array_equal(got, run(qgraph, feed, kernels=QUANT_KERNELS)["output"])  # exact by default


def test_export_calibrates_from_data(tmp_path):
    out = tmp_path / "b.onnx"
    cli(
        ["export", str(GOLDEN / "smallcnn.onnx"), "-t", "bm1880", "--qdq", "-o", str(out), "--calib-data",
         str(GOLDEN / "smallcnn_cali_samples"), "--method", "max"]
    )  # fmt: skip
    model = onnx.load(str(out))
    assert model.doc_string.startswith("bm1880 exact form")  # bm1880's default form
    assert sum(n.op_type == "ConvInteger" for n in model.graph.node) == 7  # 6 conv/dw/fc layers + the avg pool


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "give exactly one of --calib TABLE and --calib-data DIR"),
        (["--calib", "nope.txt"], "calibration table not found: nope.txt"),
    ],
)
def test_export_errors(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as info:
        main(["export", str(GOLDEN / "smallcnn.onnx"), "-t", "cv18xx", "--qdq", "-o", str(tmp_path / "x.onnx"), *extra])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["export", str(GOLDEN / "smallcnn.onnx"), "-t", "cv18xx", "-o", str(tmp_path / "x.onnx")])
    assert info.value.code == 2 and "add --qdq" in capsys.readouterr().err


# ---- the exact form -------------------------------------------------------------------------------------------


def test_smallcnn_exact_form_is_bit_exact(smallcnn_int8):
    model = write_qdq_exact(smallcnn_int8)
    exact = session(model)
    feeds = smallcnn_feeds()
    for feed in feeds:
        np.testing.assert_array_equal(
            exact.run(None, feed)[0], run(smallcnn_int8, feed, kernels=QUANT_KERNELS)["output"]
        )
    assert int8_tensor_mismatches(smallcnn_int8, model, feeds[:3]) == (11, {})


def test_exact_form_structure(smallcnn_int8):
    model = write_qdq_exact(smallcnn_int8)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    assert counts["ConvInteger"] == 5 and counts["ReduceSum"] == 1  # the global average pool's sum
    assert counts["MatMulInteger"] == 1 and "Conv" not in counts and "Gemm" not in counts
    assert counts["QuantizeLinear"] == 1 and counts["DequantizeLinear"] == 1  # the model's boundaries
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
    th_in = float(np.ravel(smallcnn_int8.tensors[q.output[0]].quant.threshold)[0])
    assert float(inits[q.input[1]]) == np.float32(th_in / 127) and inits[q.input[2]].dtype == np.int8
    docs = {v.name: v.doc_string for v in model.graph.value_info}
    assert len(docs) == 11 and all(d.startswith("int8 code; value = code * ") for d in docs.values())
    assert model.doc_string.startswith("exact form:")


def _every_op_model(path: Path) -> None:
    """conv+PReLU, ceil-mode average and max pools, depthwise conv, concat at two thresholds, sigmoid/tanh LUTs,
    sub/max/mul (broadcast), relu conv, global average pool, padded average pool, gemm (transB); min with a
    constant, its leaky relu and the softmax fall back to bf16."""
    rng = np.random.default_rng(7)

    def w(name: str, *shape: int, s: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    inits = [w("w1", 8, 3, 3, 3), w("b1", 8, s=0.1), w("slope", 8, 1, 1, s=0.2), w("w2", 8, 1, 3, 3),
             w("w3", 16, 16, 1, 1), w("b3", 16), w("gw", 10, 256), w("gb", 10), w("c1", 1, 16, 1, 1),
             numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]  # fmt: skip
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1o"], pads=[1, 1, 1, 1]),
        n("PRelu", ["c1o", "slope"], ["p1"]),
        n("AveragePool", ["p1"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        n("MaxPool", ["p1"], ["mp"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        n("Conv", ["mp", "w2"], ["dw"], pads=[1, 1, 1, 1], group=8),
        n("Concat", ["ap", "dw"], ["cat"], axis=1),
        n("Sigmoid", ["cat"], ["sg"]),
        n("Sub", ["cat", "sg"], ["sb"]),
        n("Max", ["sb", "cat"], ["mx"]),
        n("Min", ["mx", "c1"], ["mn"]),
        n("LeakyRelu", ["mn"], ["lr"], alpha=0.1),
        n("Conv", ["lr", "w3", "b3"], ["c3"]),
        n("Relu", ["c3"], ["r3"]),
        n("GlobalAveragePool", ["r3"], ["gap"]),
        n("Mul", ["r3", "gap"], ["se"]),
        n("MaxPool", ["se"], ["mp2"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Pad", ["mp2", "pads"], ["pd"]),
        n("AveragePool", ["pd"], ["ap2"], kernel_shape=[2, 2], strides=[1, 1]),
        n("Reshape", ["ap2", "shape"], ["fl"]),
        n("Gemm", ["fl", "gw", "gb"], ["g"], transB=1),
        n("Tanh", ["g"], ["t"]),
        n("Softmax", ["t"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "every_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], initializer=inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)


@pytest.mark.parametrize(
    ("float_layers", "modes"),
    [
        ((), {"int8": 17, "bf16": 3, "cast": 5}),
        (("c3", "ap", "gap", "ap2", "cat"), {"int8": 12, "bf16": 8, "cast": 11}),
    ],
)
def test_every_op_exact_form_is_bit_exact(tmp_path, float_layers, modes):
    """Every int8 kernel, the bf16 fallbacks (pools with the bf16 1/count, conv, concat, eltwise, softmax) and
    every format conversion (float->int8, int8->bf16, bf16->int8) agree with npuc's reference code for code."""
    _every_op_model(tmp_path / "m.onnx")
    graph = import_and_canon(tmp_path / "m.onnx")
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    th = ThresholdMap()
    for feed in feeds:  # max-abs thresholds of the float run
        for name, v in run(graph, feed, keep_all=True).items():
            th.thresholds[name] = max(th.thresholds.get(name, 1e-3), float(np.abs(v).max()))
    qgraph = quantize(graph, th, "cv18xx_int8", float_layers)
    counted: dict[str, int] = {}
    for op in qgraph.ops:
        counted[op.attrs.quant.mode] = counted.get(op.attrs.quant.mode, 0) + 1
    assert counted == modes
    model = write_qdq_exact(qgraph)
    exact = session(model)
    for feed in feeds:
        np.testing.assert_array_equal(exact.run(None, feed)[0], run(qgraph, feed, kernels=QUANT_KERNELS)["y"])
    count, bad = int8_tensor_mismatches(qgraph, model, feeds)
    assert bad == {} and count == sum(1 for t in qgraph.tensors.values() if t.dtype == "int8" and not t.is_const)


@pytest.mark.parametrize("head", ["conv", "gemm"])
def test_exact_form_wraps_the_accumulator(tmp_path, head):
    """A conv or FC whose input has tpu-mlir's all-zero threshold (1e-5) gets an int32 bias saturated at its
    limit; with large products beside it the sum leaves int32 and wraps, in the reference (as on the vendor
    simulator, tests/vendor/test_cv18xx_accumulator_vendor.py) and in the exact form."""
    model, dead = saturating_bias_model(head)
    onnx.save(model, tmp_path / "wrap.onnx")
    graph = import_and_canon(tmp_path / "wrap.onnx")
    feeds = wrap_feeds()
    th = ThresholdMap()
    for feed in feeds:
        for name, v in run(graph, feed, keep_all=True).items():
            th.thresholds[name] = max(th.thresholds.get(name, 1e-3), float(np.abs(v).max()))
    th.thresholds[dead] = 1e-5
    qgraph = quantize(graph, th, "cv18xx_int8")
    exact = session(write_qdq_exact(qgraph))
    wrapped = False
    for feed in feeds:
        ours = run(qgraph, feed, kernels=QUANT_KERNELS)["output"]
        np.testing.assert_array_equal(exact.run(None, feed)[0], ours)
        wrapped |= bool((ours < 0).any())  # int64 sums would put every output at the top
    assert wrapped


def _run_builder(e: ExactBuilder, out: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    in_types = {np.dtype(np.int64): TensorProto.INT64, np.dtype(np.float32): TensorProto.FLOAT}
    inputs = [helper.make_tensor_value_info(k, in_types[v.dtype], list(v.shape)) for k, v in feeds.items()]
    g = helper.make_graph(e.b.nodes, "t", inputs, [helper.make_tensor_value_info(out, TensorProto.INT64, None)],
                          initializer=list(e.b.initializers.values()))  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return session(model).run(None, feeds)[0]


def test_qdm_requantization_matches_gemmlowp_on_a_sweep():
    """sign(acc)·⌊(|acc|·M + 2^30 − [acc<0] + 2^(r−1)·2^31) / 2^(31+r)⌋ == RoundingDivideByPOT(SRDHM(acc, M), r),
    over int32 extremes, exact ties of both roundings, and every shift 0..31."""
    rng = np.random.default_rng(0)
    m = np.array([0, 1, 1 << 30, (1 << 31) - 1, 1518500250, 1073741825, *rng.integers(1 << 30, 1 << 31, 26)])
    r = np.arange(32)
    acc = np.concatenate([
        [0, 1, -1, 2, -2, (1 << 31) - 1, -(1 << 31), 1 << 30, -(1 << 30), 3 << 29, -(3 << 29)],
        rng.integers(-(1 << 31), 1 << 31, 3000), rng.integers(-5000, 5000, 3000),
    ]).astype(np.int64)[:, None]  # fmt: skip
    e = ExactBuilder(Graph("t"))
    out = e.qdm("acc", m, r, (1, 32))
    got = _run_builder(e, out, {"acc": acc})
    np.testing.assert_array_equal(got, rounding_divide_by_pot(saturating_rounding_doubling_high_mul(acc, m), r))


def test_shift_round_half_up_matches_the_kernel():
    x = np.arange(-3000, 3001, dtype=np.int64)[:, None]
    m, r = np.array([1, -1, 127, -128, 37, 64, 3, 0]), np.array([0, 1, 2, 7, 5, 6, 12, 3])
    e = ExactBuilder(Graph("t"))
    got = _run_builder(e, e.shift_round_half_up("x", m, r, (1, 8)), {"x": x})
    np.testing.assert_array_equal(got, cv18xx_apply_multiplier_rshift(x, m, r))


@pytest.mark.parametrize("threshold", [127.0, 63.5, 4.7241])
def test_input_quantization_rounds_ties_away_like_the_cpu_quant(tmp_path, threshold):
    """The boundary QuantizeLinear sees x snapped to the CPU `quant` grid: ties k+1/2 go away from zero, values
    past the threshold saturate; the relu after it and the output dequantization are bit-exact too."""
    path = tmp_path / "relu.onnx"
    shape = [1, 1, 1, 801]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])  # fmt: skip
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    qgraph = quantize(import_and_canon(path), ThresholdMap({"x": threshold, "y": threshold}), "cv18xx_int8")
    step = np.float32(threshold) / np.float32(127)
    x = (np.arange(-400, 401, dtype=np.float32) / np.float32(2) * step).reshape(shape)  # ±200 codes, every tie
    model = write_qdq_exact(qgraph)
    cast = next(op for op in qgraph.ops if op.kind == "cast" and op.inputs == ["x"]).outputs[0]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info(cast, TensorProto.INT8, None))
    y, codes = session(probe).run(None, {"x": x})
    np.testing.assert_array_equal(codes, cv18xx_quantize_activation(x, threshold))
    np.testing.assert_array_equal(y, run(qgraph, {"x": x}, kernels=QUANT_KERNELS)["y"])
    assert codes.min() == -128 and codes.max() == 127


def test_export_forms_on_the_command_line(tmp_path, capsys):
    table = str(GOLDEN / "smallcnn_cali_table.txt")
    base = ["export", str(GOLDEN / "smallcnn.onnx"), "--qdq", "--calib", table]
    cli([*base, "-t", "bpu", "-o", str(tmp_path / "exact.onnx")])
    cli([*base, "-t", "bpu", "--form", "plain", "-o", str(tmp_path / "plain.onnx")])
    ops_of = {f: {n.op_type for n in onnx.load(str(tmp_path / f"{f}.onnx")).graph.node} for f in ("exact", "plain")}
    assert {"ConvInteger", "MatMulInteger"} <= ops_of["exact"] and "Conv" not in ops_of["exact"]
    assert {"Conv", "Gemm"} <= ops_of["plain"] and "ConvInteger" not in ops_of["plain"]
    cli([*base, "-t", "bm1880", "--form", "plain", "-o", str(tmp_path / "bm_plain.onnx")])
    bm_plain = {n.op_type for n in onnx.load(str(tmp_path / "bm_plain.onnx")).graph.node}
    assert {"Conv", "Gemm", "QuantizeLinear"} <= bm_plain and "ConvInteger" not in bm_plain
    for extra, message in [
        (["-t", "bm1880", "--float-layers", "conv_2"], "bm1880 runs every layer in int8; drop --float-layers"),
        (["-t", "cv18xx", "--form", "fast"], "unknown QDQ form 'fast'; choose one of exact, plain"),
        (["-t", "cv18xx", "--option", "weight_scale=layer"],
         "--option weight_scale is not read by the exact form of target 'cv18xx' (it reads none); drop it"),
        (["-t", "bm1880", "--option", "opt=none"],
         "--option opt is not read by the exact form of target 'bm1880' (it reads weight_scale); drop it"),
        (["-t", "bm1880", "--form", "plain", "--option", "weight_scale=channel"],
         "--option weight_scale is not read by the plain form (it reads none); drop it"),
        (["-t", "bm1880", "--option", "weight_scale=both"],
         "--option weight_scale='both' is not one of layer, channel"),
        (["-t", "bm1880", "--option", "weight_scale"], "bad --option 'weight_scale': write KEY=VALUE"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as info:
            main([*base, *extra, "-o", str(tmp_path / "x.onnx")])
        assert info.value.code == 2 and message in capsys.readouterr().err
