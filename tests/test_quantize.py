"""The quantize pass and the quantized reference kernels (cv18xx int8 and bf16).

Vendor checks use tpu-mlir 1.30.2's own files in golden/cv18xx: its calibration table, its cvimodels' weight
sections (our int8 weights, biases and multipliers are compared with the bytes it wrote) and the outputs of its
cvimodels on the vendor simulator.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from metrics import cosine

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.compiler import ops
from npuc.compiler.errors import UserError
from npuc.compiler.interp import run
from npuc.compiler.ir import Graph, Op, QuantParams
from npuc.compiler.kernels.quantized import QUANT_KERNELS, OpQuant, with_quant
from npuc.passes.calibration.calitable import CalibrationTable, Threshold, read_table
from npuc.passes.quantization.quant_context import int8_params
from npuc.passes.quantization.quantize import ThresholdMap, quantize, thresholds_for_graph

GOLDEN = GOLDEN_ROOT / "cv18xx"
REGION_MASK = (1 << 40) - 1


@pytest.fixture(scope="module")
def table() -> CalibrationTable:
    return read_table(GOLDEN / "smallcnn_cali_table.txt")


@pytest.fixture(scope="module")
def feed() -> dict[str, np.ndarray]:
    return {"input": np.load(GOLDEN / "smallcnn_in.npz")["input"]}


@pytest.fixture(scope="module")
def vendor() -> dict[str, np.ndarray]:
    with np.load(GOLDEN / "smallcnn_vendor_sim_outputs.npz") as data:
        return {k: data[k] for k in data}


@pytest.fixture(scope="module")
def int8_graph(smallcnn: Graph, table: CalibrationTable) -> Graph:
    return quantize(smallcnn, table, "cv18xx_int8")


# ---- smallcnn against tpu-mlir ----------------------------------------------------------------------------


def test_int8_output_is_bit_exact_with_vendor_simulator(int8_graph, feed, vendor):
    ours = run(int8_graph, feed, kernels=QUANT_KERNELS)["output"].reshape(1, 10, 1, 1)
    theirs = vendor["smallcnn_cv183x_int8"]
    diff = np.abs(ours - theirs)
    print(f"int8 vs vendor: cosine {cosine(ours, theirs):.7f}, max abs diff {diff.max()}, unequal {(diff > 0).sum()}")
    assert cosine(ours, theirs) >= 0.9999
    np.testing.assert_array_equal(ours, theirs)  # all 10 elements identical
    assert ours[0, :3, 0, 0].tolist() == [0.9140625, -0.33984375, -0.140625]


def test_bf16_output_is_bit_exact_with_vendor_simulator(smallcnn, table, feed, vendor):
    qgraph = quantize(smallcnn, table, "cv18xx_bf16")
    ours = run(qgraph, feed, kernels=QUANT_KERNELS)["output"].reshape(1, 10, 1, 1)
    theirs = vendor["smallcnn_cv183x_bf16"]
    print(f"bf16 vs vendor: cosine {cosine(ours, theirs):.7f}, max abs diff {np.abs(ours - theirs).max()}")
    assert cosine(ours, theirs) >= 0.9999
    np.testing.assert_array_equal(ours, theirs)


def test_int8_reference_tracks_onnxruntime_float(int8_graph, feed):
    session = ort.InferenceSession(str(GOLDEN / "smallcnn.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, feed)[0]
    ours = run(int8_graph, feed, kernels=QUANT_KERNELS)["output"]
    assert cosine(ours, expected) >= 0.999
    assert np.argmax(ours) == np.argmax(expected) == 0


def _vendor_weights() -> dict[str, np.ndarray]:
    model = read_cvimodel(GOLDEN / "smallcnn_cv183x_int8.cvimodel")
    blob = np.frombuffer(model.weight, np.uint8)
    out = {}
    for w in model.body.weight_map:
        start = w.offset & REGION_MASK
        out[w.name] = blob[start : start + w.size]
    return out


# IR conv op -> the name tpu-mlir gave its weights (the table name of its output)
_VENDOR_CONV = {"conv_2": "relu_8_Relu", "conv_11": "relu_17_Relu", "conv_19": "conv_19_Conv",
                "conv_28": "relu_34_Relu", "conv_37": "relu_38_Relu"}  # fmt: skip


def test_int8_parameters_match_vendor_weight_section(int8_graph):
    vendor = _vendor_weights()
    convs = {op.name: op for op in int8_graph.ops if op.kind == "conv2d"}
    for name, stem in _VENDOR_CONV.items():
        op = convs[name]
        q = op.attrs.quant
        weight = int8_graph.const(op.inputs[1])
        oc, icg, kh, kw = weight.shape
        packed = vendor[f"{stem}_bias_packed"].reshape(oc, 9)
        filt = vendor[f"{stem}_filter_reordered"].view(np.int8)
        if op.attrs.group == 1:  # stored (oc, kh*kw, ic padded to even)
            ours = weight.transpose(0, 2, 3, 1).reshape(oc, kh * kw, icg)
            filt = filt.reshape(oc, kh * kw, -1)[:, :, :icg]
        else:
            ours, filt = weight.reshape(oc, -1), filt.reshape(oc, -1)
        np.testing.assert_array_equal(ours, filt)
        np.testing.assert_array_equal(int8_graph.const(op.inputs[2]), packed[:, :4].copy().view("<i4").ravel())
        np.testing.assert_array_equal(q.rshift, packed[:, 8])
        vendor_mult = packed[:, 4:8].copy().view("<u4").ravel().astype(np.int64)
        # BN-folded convs: the frontend folds BN in float64, tpu-mlir in float32, so max|W| can differ by one
        # float32 ulp (= 128 in the multiplier); the unfolded conv_37 is exact.
        limit = 0 if name == "conv_37" else 256
        assert np.abs(q.multiplier - vendor_mult).max() <= limit, name
    fc = next(op for op in int8_graph.ops if op.kind == "gemm")
    np.testing.assert_array_equal(
        int8_graph.const(fc.inputs[1]).T, vendor["output_Gemm_filter_i8"].view(np.int8).reshape(32, 10)
    )
    planes = vendor["output_Gemm_bias_int32"].reshape(4, 10).astype(np.int64)  # four byte planes
    bias = (planes[0] | planes[1] << 8 | planes[2] << 16 | planes[3] << 24).astype(np.uint32).view(np.int32)
    np.testing.assert_array_equal(int8_graph.const(fc.inputs[2]), bias)
    assert (fc.attrs.quant.multiplier.tolist(), fc.attrs.quant.rshift.tolist()) == ([1631959168], [7])


def test_int8_per_tensor_parameters_match_vendor_cmdbuf(int8_graph):
    # values read from the vendor cmdbuf: add = MUL #72 then MAC #79 with rshift 7; GAP = avg_pool #124 >> 13
    by_name = {op.name: op.attrs.quant for op in int8_graph.ops}
    assert by_name["add_25"].multiplier.tolist() == [72, 79] and int(by_name["add_25"].rshift) == 7
    assert (int(by_name["gap_39"].multiplier), int(by_name["gap_39"].rshift)) == (124, 13)


def test_quantized_graph_structure_and_float_graph_untouched(smallcnn, int8_graph):
    kinds = [(op.kind, op.attrs.quant.mode) for op in int8_graph.ops]
    assert kinds[0] == ("cast", "cast") and kinds[-1] == ("cast", "cast")
    assert [m for _, m in kinds[1:-1]] == ["int8"] * 10
    assert int8_graph.tensors["input_i8"].dtype == "int8"
    assert int8_graph.tensors["relu_26"].quant.threshold == pytest.approx(13.2940731)
    assert int8_graph.tensors["flatten_40"].quant.threshold == pytest.approx(2.124094)
    assert int8_graph.tensors["output"].dtype == "float32" and int8_graph.outputs == ["output"]
    assert all(getattr(op.attrs, "quant", None) is None for op in smallcnn.ops)
    assert all(t.quant is None for t in smallcnn.tensors.values())
    int8_graph.verify()


def test_float_layers_run_in_bf16(smallcnn, table, feed):
    qgraph = quantize(smallcnn, table, "cv18xx_int8", float_layers=["conv_37"])
    modes = {op.name: op.attrs.quant.mode for op in qgraph.ops}
    assert modes["conv_37"] == "bf16" and modes["conv_28"] == "int8" and modes["gap_39"] == "int8"
    casts = [op for op in qgraph.ops if op.kind == "cast"]
    assert [c.attrs.quant.output.scheme if c.attrs.quant.output else "float32" for c in casts] == [
        "int8_sym", "bf16", "int8_sym", "float32"
    ]  # fmt: skip
    session = ort.InferenceSession(str(GOLDEN / "smallcnn.onnx"), providers=["CPUExecutionProvider"])
    ours = run(qgraph, feed, kernels=QUANT_KERNELS)["output"]
    assert cosine(ours, session.run(None, feed)[0]) >= 0.999


def test_unknown_scheme_is_a_user_error(smallcnn, table):
    with pytest.raises(UserError, match="unknown quantization scheme 'int3'"):
        quantize(smallcnn, table, "int3")


# ---- threshold name mapping -------------------------------------------------------------------------------


def test_thresholds_for_graph_maps_tpu_mlir_names(smallcnn, table):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every name matches: no warning
        result = thresholds_for_graph(smallcnn, table)
    assert result.unknown == [] and result.missing == []
    assert result.thresholds["bn_24"] == pytest.approx(8.2905769)  # conv_19_Conv: the op renamed by BN folding
    assert result.thresholds["output"] == pytest.approx(1.4881867)  # output_Gemm
    assert result.thresholds["input"] == pytest.approx(4.7247663)
    assert len(result.thresholds) == 11


def test_thresholds_for_graph_reports_unknown_and_missing(smallcnn):
    rows = {"input": Threshold(4.0, -4.0, 4.0), "nosuch_Conv": Threshold(1.0, -1.0, 1.0)}
    with pytest.warns(UserWarning, match="1 unknown name"):
        result = thresholds_for_graph(smallcnn, CalibrationTable(entries=rows))
    assert result.unknown == ["nosuch_Conv"]
    assert "relu_8" in result.missing and "input" not in result.missing and len(result.missing) == 10


def test_missing_threshold_falls_back_to_bf16(smallcnn, table, feed):
    rows = {k: v for k, v in table.entries.items() if k != "relu_38_Relu"}
    qgraph = quantize(smallcnn, CalibrationTable(entries=rows), "cv18xx_int8")
    assert any(n.startswith("calibration table: 1 tensor(s) without a threshold (relu_38)") for n in qgraph.notes)
    modes = {op.name: op.attrs.quant.mode for op in qgraph.ops}
    assert modes["conv_37"] == "bf16" and modes["conv_28"] == "int8"
    assert run(qgraph, feed, kernels=QUANT_KERNELS)["output"].shape == (1, 10)


# ---- kernels on hand-computed integer examples ------------------------------------------------------------


def _op(kind: str, attrs, quant: OpQuant, n_in: int = 1) -> Op:
    return Op("t", kind, [f"x{i}" for i in range(n_in)], ["y"], with_quant(attrs, quant))


def test_int8_conv_qdm_requant():
    # acc = 3*x + 5 = [35, -55]; m = 2^30 (0.5), rshift 1: 35*0.25 = 8.75 -> 9, -55*0.25 = -13.75 -> -14
    q = OpQuant("int8", multiplier=np.array([1 << 30]), rshift=np.array([1]))
    x = np.array([10, -20], np.int8).reshape(1, 1, 1, 2)
    args = [x, np.array([[[[3]]]], np.int8), np.array([5], np.int32)]
    assert QUANT_KERNELS["conv2d"](_op("conv2d", ops.Conv2d(), q, 3), args)[0].ravel().tolist() == [9, -14]
    relu = ops.Conv2d(act=ops.Activation("relu"))
    assert QUANT_KERNELS["conv2d"](_op("conv2d", relu, q, 3), args)[0].ravel().tolist() == [9, 0]
    q.relu_max = 5  # relu6 clamp in int8 codes
    assert QUANT_KERNELS["conv2d"](_op("conv2d", relu, q, 3), args)[0].ravel().tolist() == [5, 0]


def test_int8_conv_saturates_and_rounds_ties_away():
    # acc = 100*3 = 300 -> *0.5 = 150 -> 127; acc = 1 -> 0.5 (tie) -> 1 with m = 2^30, rshift 0
    q = OpQuant("int8", multiplier=np.array([1 << 30]), rshift=np.array([0]))
    x = np.array([100, 1, -1], np.int8).reshape(1, 1, 1, 3)
    w = np.array([[[[3]]]], np.int8)
    out = QUANT_KERNELS["conv2d"](_op("conv2d", ops.Conv2d(), q, 2), [x, w])[0]
    assert out.dtype == np.int8 and out.ravel().tolist() == [127, 2, -1]  # 1.5 -> 2, -1.5 -> -1 (SRDHM)


def test_int8_gemm_per_tensor_qdm():
    # [2, 3] @ [[4], [5]] + 7 = 30; m = 2^30 (0.5), rshift 2: 30 / 8 = 3.75 -> 4
    q = OpQuant("int8", multiplier=np.array([1 << 30]), rshift=np.array([2]))
    args = [np.array([[2, 3]], np.int8), np.array([[4, 5]], np.int8), np.array([7], np.int32)]
    out = QUANT_KERNELS["gemm"](_op("gemm", ops.Gemm(trans_b=True), q, 3), args)[0]
    assert out.tolist() == [[4]]


def test_int8_eltwise_add_mul_mac_rounding():
    # 100*72 + 60*79 = 11940 -> (11940 + 64) >> 7 = 93; -50*72 + 30*79 = -1230 -> floor(-1166/128) = -10
    q = OpQuant("int8", multiplier=np.array([72, 79]), rshift=np.array(7))
    args = [np.array([100, -50], np.int8), np.array([60, 30], np.int8)]
    assert QUANT_KERNELS["eltwise"](_op("eltwise", ops.Eltwise("add"), q, 2), args)[0].tolist() == [93, -10]
    relu = ops.Eltwise("add", act=ops.Activation("relu"))
    assert QUANT_KERNELS["eltwise"](_op("eltwise", relu, q, 2), args)[0].tolist() == [93, 0]


def test_int8_eltwise_mul_and_max():
    # mul: 100 * -90 = -9000, QDM m = 2^30 (0.5), rshift 6 -> -9000/128 = -70.3 -> -70
    q = OpQuant("int8", multiplier=np.array([1 << 30]), rshift=np.array([6]))
    args = [np.array([100], np.int8), np.array([-90], np.int8)]
    assert QUANT_KERNELS["eltwise"](_op("eltwise", ops.Eltwise("mul"), q, 2), args)[0].tolist() == [-70]
    # max: each input rescaled ((x*m + 1) >> 1) before the max: 40*3 -> 60, 50*2 -> 50
    q = OpQuant("int8", multiplier=np.array([3, 2]), rshift=np.array(1))
    args = [np.array([40, 10], np.int8), np.array([50, 50], np.int8)]
    assert QUANT_KERNELS["eltwise"](_op("eltwise", ops.Eltwise("max"), q, 2), args)[0].tolist() == [60, 50]


def test_int8_pools():
    x = np.array([10, 20, 30, 41, -128, 5, 6, 7], np.int8).reshape(1, 2, 2, 2)
    avg = OpQuant("int8", multiplier=np.int64(3), rshift=np.int64(2))
    # channel 0: sum 101 -> (303 + 2) >> 2 = 76; channel 1: sum -110 -> (-330 + 2) >> 2 = -82
    out = QUANT_KERNELS["global_pool"](_op("global_pool", ops.GlobalPool("avg"), avg), [x])[0]
    assert out.ravel().tolist() == [76, -82]
    pool = ops.Pool2d("avg", kernel=(2, 2), strides=(2, 2))
    assert QUANT_KERNELS["pool2d"](_op("pool2d", pool, avg), [x])[0].ravel().tolist() == [76, -82]
    mx = ops.Pool2d("max", kernel=(2, 2), strides=(1, 1), pads=(1, 1, 0, 0))
    out = QUANT_KERNELS["pool2d"](_op("pool2d", mx, OpQuant("int8")), [x])[0]
    assert out[0, 1].tolist() == [[-128, 5], [6, 7]]  # padding never wins a max


def test_int8_lookup_table_and_concat():
    table = (np.arange(256) ^ 0x7F).astype(np.uint8).view(np.int8)  # entry i = byte i with low 7 bits flipped
    x = np.array([-128, -1, 0, 127], np.int8)
    out = QUANT_KERNELS["activation"](
        _op("activation", ops.ActivationOp(ops.Activation("tanh")), OpQuant("int8", lut=table)), [x]
    )[0]
    assert out.tolist() == [-1, -128, 127, 0]
    q = OpQuant("int8", multiplier=np.array([1, 3]), rshift=np.array([0, 1]))
    out = QUANT_KERNELS["concat"](
        _op("concat", ops.Concat(0), q, 2), [np.array([5], np.int8), np.array([101], np.int8)]
    )[0]
    assert out.tolist() == [5, 127]  # (101*3 + 1) >> 1 = 152 saturates


def test_casts_follow_the_cpu_quant_and_tpu_dequant_rules():
    to_int8 = OpQuant("cast", (None,), int8_params(127.0))  # scale exactly 1
    x = np.array([0.5, -0.5, 2.5, -2.5, 1.49, 200.0, -200.0], np.float32)
    out = QUANT_KERNELS["cast"](_op("cast", ops.Cast("int8"), to_int8), [x])[0]
    assert out.tolist() == [1, -1, 3, -3, 1, 127, -128]
    to_f32 = OpQuant("cast", (int8_params(1.4881867),), None)
    out = QUANT_KERNELS["cast"](_op("cast", ops.Cast("float32"), to_f32), [np.array([78, -122], np.int8)])[0]
    assert out.tolist() == [0.9140625, -1.4296875]  # bf16(q * bf16(th/127)) = q * 0.01171875
    to_bf16 = OpQuant("cast", (None,), QuantParams("bf16"))
    x = np.array([1.0 + 2.0**-8 + 2.0**-9, -3.0 - 2.0**-7 - 2.0**-20], np.float32)
    out = QUANT_KERNELS["cast"](_op("cast", ops.Cast("float32"), to_bf16), [x])[0]
    assert out.tolist() == [1.0, -3.0]  # truncated, where rounding would give 1.0078125 and -3.015625


def test_bf16_kernels_round_every_result():
    q = OpQuant("bf16")
    x = np.full((1, 1, 3, 3), 1.0, np.float32)
    # avg pool multiplies the sum by bf16(1/9) = 0.111328125: 9 * that = 1.001953125 -> bf16 1.0
    assert QUANT_KERNELS["global_pool"](_op("global_pool", ops.GlobalPool("avg"), q), [x])[0].ravel().tolist() == [1.0]
    a = np.array([1.0, 256.0], np.float32)
    b = np.array([2.0**-8, 1.0], np.float32)
    # 1 + 2^-8 is a tie between bf16 neighbours: rounds to even (1.0); 257 rounds to 256
    assert QUANT_KERNELS["eltwise"](_op("eltwise", ops.Eltwise("add"), q, 2), [a, b])[0].tolist() == [1.0, 256.0]


# ---- small graphs through the pass ------------------------------------------------------------------------


def _unary_graph(act: ops.Activation) -> Graph:
    g = Graph("unary")
    g.add_tensor("x", (1, 4))
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_op("activation", ["x"], ["y"], ops.ActivationOp(act))
    return g


def test_sigmoid_becomes_an_int8_lut_with_output_threshold_one():
    g = _unary_graph(ops.Activation("sigmoid"))
    qgraph = quantize(g, ThresholdMap({"x": 4.0, "y": 0.9}), "cv18xx_int8")
    op = next(op for op in qgraph.ops if op.kind == "activation")
    assert op.attrs.quant.output.threshold == 1.0  # sigmoid range is fixed to [0, 1]
    lut = op.attrs.quant.lut
    # code 0 -> sigmoid(0) = 0.5 -> 63.5 -> 64; code 127 -> sigmoid(4) = 0.982 -> 125; code -128 -> 2
    assert (lut[0], lut[127], lut[128]) == (64, 125, 2)
    y = run(qgraph, {"x": np.array([[0.0, 4.0, -4.0, 1.0]], np.float32)}, kernels=QUANT_KERNELS)["y"]
    # x=1: code 32 -> sigmoid(1.00787) = 0.7326 -> code 93 -> bf16(93 * bf16(1/127)) = 0.73046875
    assert y.tolist() == [[0.50390625, 0.984375, 0.0157470703125, 0.73046875]]


def test_leaky_relu_fused_in_conv_is_split_out():
    g = Graph("leaky")
    g.add_tensor("x", (1, 1, 1, 2))
    g.add_const("w", np.array([[[[1.0]]]], np.float32))
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_op("conv2d", ["x", "w"], ["y"], ops.Conv2d(act=ops.Activation("leaky_relu", alpha=0.5)), name="c")
    qgraph = quantize(g, ThresholdMap({"x": 2.0, "y": 2.0}, pre_activation={"c": 2.0}), "cv18xx_int8")
    assert [(op.kind, op.attrs.quant.mode) for op in qgraph.ops] == [
        ("cast", "cast"), ("conv2d", "int8"), ("activation", "int8"), ("cast", "cast")
    ]  # fmt: skip
    y = run(qgraph, {"x": np.array([[[[1.0, -1.0]]]], np.float32)}, kernels=QUANT_KERNELS)["y"]
    np.testing.assert_allclose(y.ravel(), [1.0, -0.5], atol=2 / 127)


def test_int8_lut_outside_the_functions_domain_is_defined() -> None:
    """sqrt/log tables over a symmetric int8 range: the negative codes get defined bytes (NaN -> 0, -inf
    saturated), not whatever a NaN -> int8 cast gives on this machine."""
    import warnings

    from npuc.backends.cv18xx.rules import int8_lut

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 'invalid value encountered in cast'
        root = int8_lut(np.sqrt, 4.0, 2.0)
        log = int8_lut(np.log, 4.0, 2.0)
    negative = np.r_[129:256]  # bytes of the codes -127..-1
    assert (root[negative] == 0).all() and root[127] == 127  # sqrt(4) = 2 = th_y
    assert (log[negative] == 0).all() and log[0] == -128  # NaN -> 0; log(0) = -inf saturates


def test_a_table_made_for_another_model_is_refused(smallcnn):
    rows = {"input": Threshold(4.0, -4.0, 4.0), "nosuch_Conv": Threshold(1.0, -1.0, 1.0)}
    with pytest.raises(UserError, match="made for another model: 10 of this model's 11 tensors have no threshold"):
        quantize(smallcnn, CalibrationTable(entries=rows), "cv18xx_int8")
    qgraph = quantize(smallcnn, CalibrationTable(entries=rows), "cv18xx_int8", partial_table=True)
    assert {op.attrs.quant.mode for op in qgraph.ops if op.kind == "conv2d"} == {"bf16"}
