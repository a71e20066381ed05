"""`npuc build --target bm1880`: LeNet against the vendor's int8 weights, P-Net against the vendor's bmodel,
op-family models against onnxruntime, the three --opt levels, multi-shape files, determinism, bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from metrics import cosine, softmax
from onnx import numpy_helper

from npuc.backends.bm1880 import isa
from npuc.backends.bm1880.build import compile_bmodel
from npuc.backends.bm1880.calibration import new_calibration, save_calibration
from npuc.backends.bm1880.cmdbuf import decode_cmdbuf, gmem_refs
from npuc.backends.bm1880.container import BModel, load_bmodel, read_bmodel, write_bmodel
from npuc.backends.bm1880.quantize import load_thresholds, table_kind
from npuc.backends.bm1880.sim import run_bmodel
from npuc.cli.app import main
from npuc.compiler.errors import CorruptFileError, UnsupportedError, UserError
from npuc.compiler.protoschema import load_proto
from npuc.frontends.onnx import import_onnx
from npuc.models.images import model_inputs
from npuc.models.make_models import make_all
from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate, max_abs_thresholds
from npuc.passes.calibration.calitable import CalibrationTable, Threshold, write_table
from npuc.passes.rewrite.canonicalize import canonicalize

GOLDEN = GOLDEN_ROOT / "bm1880"
ROOT = Path(__file__).resolve().parents[1]
VENDOR_PNET = GOLDEN / "mtcnn_pnet_multishape.bmodel"
OPTS = ("none", "layer-group", "layer-group-weight")


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code or 0


# ---- LeNet: float ONNX + the vendor's calibration table ---------------------------------------------------


@pytest.fixture(scope="module")
def lenet_no_elu(tmp_path_factory) -> Path:
    """The golden float LeNet without its final ELU (a CPU layer for BMNet; monotonic, so the class is kept)."""
    model = onnx.load(str(GOLDEN / "lenet_float.onnx"))
    (elu,) = [n for n in model.graph.node if n.op_type == "Elu"]
    model.graph.node.remove(elu)
    model.graph.output[0].name = elu.input[0]
    path = tmp_path_factory.mktemp("lenet") / "lenet.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def lenet_bmodel(tmp_path_factory) -> Path:
    """The golden float LeNet as it is: its final ELU is left to the host, as BMNet does with CPU layers."""
    out = tmp_path_factory.mktemp("lenet_out") / "lenet.bmodel"
    calib = GOLDEN / "bmnet_lenet_calibration.prototxt"
    assert _cli("build", GOLDEN / "lenet_float.onnx", "--target", "bm1880", "--calib", calib, "-o", out) == 0
    return out


def test_lenet_final_elu_is_left_to_the_host(tmp_path, capsys):
    calib = GOLDEN / "bmnet_lenet_calibration.prototxt"
    out = tmp_path / "lenet.bmodel"
    assert _cli("build", GOLDEN / "lenet_float.onnx", "--target", "bm1880", "--calib", calib, "--json", "-o", out) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["notes"] == ["left to the host (not in the bmodel): customized2 (activation)", BMNET_RULE_NOTE]
    assert summary["host_ops"] == 1
    assert [t.shape for t in load_bmodel(out).commands[0].outputs] == [(1, 10)]


BMNET_RULE_NOTE = (
    "weights: BMNet's per-layer shift, the default with a BMNet calibration table "
    "(--option weight_scale=channel: per-channel power-of-two gains)"
)
CALI_TABLE_RULE_NOTE = (
    "weights: per-channel power-of-two gains, the default with a tpu-mlir cali_table "
    "(--option weight_scale=layer: BMNet's per-layer shift)"
)


def test_weight_scale_default_follows_the_table(lenet_no_elu, tmp_path, capsys):
    """A BMNet table (text or binary) builds BMNet's per-layer rule, the same bytes as asking for it; the same
    thresholds as a tpu-mlir cali_table get per-channel gains; --option weight_scale wins either way (no note)."""
    text, binary = GOLDEN / "bmnet_lenet_calibration.prototxt", GOLDEN / "bmnet_lenet_calibration.pb2"
    cali_table = tmp_path / "lenet_cali_table"
    thresholds = load_thresholds(text)
    write_table(CalibrationTable({n: Threshold(t, -t, t) for n, t in thresholds.items()}), cali_table)
    assert [table_kind(p) for p in (text, binary, cali_table)] == ["bmnet", "bmnet", "cali_table"]

    def build(table: Path, *option: str) -> tuple[str, list[str], bytes]:
        """(the summary's weight scale, the notes about it, the bmodel's bytes)"""
        out = tmp_path / "lenet.bmodel"
        assert _cli("build", lenet_no_elu, "--target", "bm1880", "--calib", table, "--json", "-o", out, *option) == 0
        record = json.loads(capsys.readouterr().out)
        notes = [n for n in record["notes"] if n.startswith("weights:")]
        return record["details"]["weight_scale"], notes, out.read_bytes()

    vendor = build(binary)
    assert vendor[:2] == ("layer", [BMNET_RULE_NOTE])
    assert build(text) == vendor
    assert build(binary, "--option", "weight_scale=layer") == ("layer", [], vendor[2])
    gains = build(cali_table)
    assert gains[:2] == ("channel", [CALI_TABLE_RULE_NOTE]) and gains[2] != vendor[2]
    assert build(cali_table, "--option", "weight_scale=layer")[:2] == ("layer", [])
    assert build(binary, "--option", "weight_scale=channel")[:2] == ("channel", [])
    assert _cli("build", lenet_no_elu, "--target", "bm1880", "--calib", cali_table, "-o", tmp_path / "x.bmodel",
                "--option", "weight_scale=per-tensor") == 2  # fmt: skip
    assert "--option weight_scale='per-tensor' is not one of layer, channel" in capsys.readouterr().err


def _weight_loads(model: BModel) -> list[np.ndarray]:
    """Every weight-area GDMA of the first command, decoded from the cmdbuf: (n, c, h, w) int8 tensors."""
    blob = np.frombuffer(model.weights[0], np.int8)
    loads = []
    for ins in decode_cmdbuf(model.commands[0].cmdbuf):
        refs = gmem_refs(ins)
        if refs and refs[0].area == "weight":
            f = ins.fields
            shape = (f["src_n"], f["src_c"], f["src_h"], f["src_w"])
            idx = (refs[0].offset + np.arange(shape[0])[:, None, None, None] * f["src_n_stride"]
                   + np.arange(shape[1])[None, :, None, None] * f["src_c_stride"]
                   + np.arange(shape[2])[None, None, :, None] * f["src_h_stride"]
                   + np.arange(shape[3])[None, None, None, :])  # fmt: skip
            loads.append(blob[idx])
    return loads


def test_lenet_int8_weights_equal_the_vendor_caffemodel(lenet_bmodel):
    net = load_proto(ROOT / "frontends" / "caffe.proto").NetParameter()
    net.ParseFromString((GOLDEN / "lenet_int8_vendor.caffemodel").read_bytes())
    vendor = {layer.name: [np.asarray(b.data, np.float32) for b in layer.blobs] for layer in net.layer if layer.blobs}
    loads = _weight_loads(load_bmodel(lenet_bmodel))
    assert len(loads) == 8  # weight + bias planes of conv1, conv2, ip1, ip2
    total = 0
    for name, (weight, bias) in zip(("conv1", "conv2", "ip1", "ip2"), zip(loads[::2], loads[1::2], strict=True)):
        _, oc, taps, ic = weight.shape  # [oc][kh·kw][ic]
        ours_w = weight[0].transpose(0, 2, 1).reshape(oc, ic * taps)
        ours_b = (bias[0].astype(np.uint8).astype(np.int32) | (bias[1].astype(np.int32) << 8)).ravel()
        np.testing.assert_array_equal(ours_w.ravel().astype(np.float32), vendor[name][0])
        np.testing.assert_array_equal(ours_b.astype(np.float32), vendor[name][1])
        total += ours_w.size + ours_b.size
    assert total == 430_500 + 580


def test_lenet_run_gives_the_reference_class(lenet_bmodel, lenet_no_elu, tmp_path):
    """The bmodel's output is the ELU's input (the host applies the ELU; it is monotonic, the class stays)."""
    x = np.fromfile(GOLDEN / "lenet_input_1_1_28_28.bin", np.float32).reshape(1, 1, 28, 28)
    np.savez(tmp_path / "in.npz", input=x)
    assert _cli("run", lenet_bmodel, "--input", tmp_path / "in.npz", "-o", tmp_path / "out.npz") == 0
    got = np.load(tmp_path / "out.npz")["ip2_1"].ravel()
    ref = np.fromfile(GOLDEN / "lenet_output_ref.bin", np.float32)
    assert int(np.argmax(got)) == int(np.argmax(ref)) == 5
    logits = ort.InferenceSession(str(lenet_no_elu)).run(None, {"data_0": x})[0].ravel()
    # this input reaches |x| = 3.5 while the table's data threshold is 0.997: 8% of it saturates in int8
    assert cosine(got, logits) > 0.95  # measured 0.9596


def test_lenet_conv1_pool1_bit_exact_against_an_integer_reference(lenet_no_elu):
    from npuc.compiler.numformats.bm1880_int8 import (
        bm1880_quantize_activation,
        bm1880_quantize_layer,
        bm1880_requant_multiplier,
        bm1880_shift_requantize,
    )

    graph = import_onnx(lenet_no_elu)
    canonicalize(graph)
    graph.outputs = ["pool1_1"]
    graph.prune()
    table = load_thresholds(GOLDEN / "bmnet_lenet_calibration.prototxt")
    x = np.fromfile(GOLDEN / "lenet_input_1_1_28_28.bin", np.float32).reshape(1, 1, 28, 28)
    xq = bm1880_quantize_activation(x, table["data"])
    q = bm1880_quantize_layer(graph.const("conv1_w_0"), graph.const("conv1_b_0"), table["data"], table["conv1"])
    acc = np.zeros((1, 20, 24, 24), np.int64)
    for ky in range(5):
        for kx in range(5):
            acc += np.einsum("nchw,oc->nohw", xq[:, :, ky : ky + 24, kx : kx + 24].astype(np.int64),
                             q.weight[:, :, ky, kx].astype(np.int64))  # fmt: skip
    conv1 = bm1880_shift_requantize(acc + q.bias.reshape(1, -1, 1, 1), q.rshift).astype(np.int64)
    m, r = bm1880_requant_multiplier(table["conv1"], table["pool1"])
    pooled = conv1.reshape(1, 20, 12, 2, 12, 2).max(axis=(3, 5))
    expect = np.clip((pooled * m + (1 << (r - 1))) >> r, -128, 127)
    for opt in ("none", "layer-group"):
        model = compile_bmodel([graph], table, None, opt, "lenet").model
        got = run_bmodel(model, {"input": xq})["pool1_1"]  # int8 in; dequantized out
        np.testing.assert_array_equal(np.round(got * 128 / np.float32(table["pool1"])).astype(np.int64), expect)


def test_lenet_opt_levels_agree_and_layer_groups_save_ddr(lenet_no_elu):
    graph = import_onnx(lenet_no_elu)
    canonicalize(graph)
    table = load_thresholds(GOLDEN / "bmnet_lenet_calibration.pb2")  # the binary twin of the text table
    x = np.fromfile(GOLDEN / "lenet_input_1_1_28_28.bin", np.float32).reshape(1, 1, 28, 28)
    outs, stats = {}, {}
    for opt in OPTS:
        model, (st,), _, _ = compile_bmodel([graph], table, None, opt, "lenet")
        outs[opt] = run_bmodel(read_bmodel(write_bmodel(model)), {"input": x})["ip2_1"]
        stats[opt] = st
    assert all(np.array_equal(outs["none"], o) for o in outs.values())
    assert (stats["none"].groups, stats["layer-group"].groups) == (7, 1)
    assert stats["layer-group"].ddr_bytes < stats["none"].ddr_bytes
    assert stats["layer-group"].neuron_size < stats["none"].neuron_size


def test_builds_are_byte_deterministic(lenet_no_elu, lenet_bmodel, tmp_path):
    again = tmp_path / "again.bmodel"
    calib = GOLDEN / "bmnet_lenet_calibration.prototxt"
    assert _cli("build", lenet_no_elu, "--target", "bm1880", "--calib", calib, "-o", again) == 0
    assert again.read_bytes() == lenet_bmodel.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left behind


def test_unsupported_op_names_the_node(tmp_path):
    """A transposed conv whose blocks overlap (4x4 kernel, stride 2) has no BM1880 form (a stride-sized one is
    phase convs, tests/test_bm1880_moves.py): the node is named, exit 2, no file."""
    model = make_all(tmp_path, ["conv_transpose_4x4"])["conv_transpose_4x4"]
    graph = import_onnx(model)
    canonicalize(graph)
    with pytest.raises(UnsupportedError, match=r"op '\w+' \(conv_transpose2d\) with kernel \(4, 4\), strides \(2, 2\)"):
        compile_bmodel([graph], dict.fromkeys(graph.tensors, 1.0), None, "none", "x")
    calib = GOLDEN / "bmnet_lenet_calibration.prototxt"
    out = tmp_path / "lenet.bmodel"
    assert _cli("build", model, "--target", "bm1880", "--calib", calib, "-o", out) == 2
    assert not out.exists()
    assert _cli("build", GOLDEN / "lenet_float.onnx", "--target", "bm1880", "-o", out) == 2  # no --calib
    assert _cli("build", GOLDEN / "lenet_float.onnx", "--target", "bm1880", "--calib", calib, "--opt", "fast",
                "-o", out) == 2  # fmt: skip


# ---- P-Net: ours vs the vendor's compiled bmodel ------------------------------------------------------------


def _face(rows: int, cols: int) -> np.ndarray:
    """The astronaut's face as NHWC RGB, (x-127.5)/128, resized to rows x cols."""
    import skimage.data
    from skimage.transform import resize

    face = skimage.data.astronaut()[20:240, 140:340]
    pic = resize(face, (rows, cols), order=1, preserve_range=True, anti_aliasing=False)
    return ((pic.astype(np.float32) - 127.5) / 128.0)[None].astype(np.float32)


def _pnet_feeds(shape: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(ONNX NHWC feed, bmodel NCHW feed) for a bmodel input shape, as tests/test_bm1880_sim.py does."""
    a, b = shape[2:]
    onnx_in = np.ascontiguousarray(_face(b, a).transpose(0, 2, 1, 3))
    return onnx_in, np.ascontiguousarray(onnx_in.transpose(0, 3, 1, 2))


def vendor_pnet_thresholds(pnet_onnx: Path, vendor: BModel) -> dict[str, float]:
    """The vendor's own thresholds, read back from its bmodel: each conv's Tx/Ty from its int8 weights
    (least squares of Wq against W·2^r), PReLU gt scales (m >> s), the pool requant (235 >> 8), the
    input/output thresholds of the file. Names are the IR tensors of the ONNX P-Net."""
    kernels = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(pnet_onnx)).graph.initializer}
    blob = np.frombuffer(vendor.weights[0], np.int8)

    def ratio(kernel: str, offset: int, rshift: int) -> float:  # = Tx / Ty
        w = kernels[kernel].transpose(0, 2, 3, 1).ravel().astype(np.float64)
        q = blob[offset : offset + w.size].astype(np.float64)
        return float(w @ q / (w @ w)) / 2.0**rshift

    # weight offsets / shifts / scales as disassembled from the 12x12 command (`npuc inspect --disasm`)
    t = {"input_1": vendor.commands[0].inputs[0].threshold}
    t["convolution_output4"] = t["input_1"] / ratio("conv2d/kernel:0", 0, 9)
    t["p_re_lu/add:0"] = t["convolution_output4"] * 64 / 70
    t["p_re_lu/add:0_pooling0"] = t["p_re_lu/add:0"] * 256 / 235
    t["convolution_output3"] = t["p_re_lu/add:0_pooling0"] / ratio("conv2d_1/kernel:0", 0x12C, 7)
    t["p_re_lu_1/add:0"] = t["convolution_output3"] * 32 / 110
    t["convolution_output2"] = t["p_re_lu_1/add:0"] / ratio("conv2d_2/kernel:0", 0x6FC, 7)
    t["p_re_lu_2/add:0"] = t["convolution_output2"] * 64 / 93
    outputs = {o.name: o.threshold for o in vendor.commands[0].outputs}
    t["convolution_output"], t["convolution_output1"] = outputs["conv4-2"], outputs["conv4-1"]
    return t


@pytest.fixture(scope="module")
def pnet_onnx(real_model) -> Path:
    return real_model("mtcnn_pnet")


@pytest.fixture(scope="module")
def vendor_pnet() -> BModel:
    return load_bmodel(VENDOR_PNET)


PNET_SHAPES = ((1, 3, 12, 12), (1, 3, 36, 48))


@pytest.fixture(scope="module")
def pnet_vendor_table(pnet_onnx, vendor_pnet, tmp_path_factory) -> Path:
    """The vendor-derived thresholds written as a BMNet calibration table (exercises that import path)."""
    msg = new_calibration("pnet")
    for name, threshold in vendor_pnet_thresholds(pnet_onnx, vendor_pnet).items():
        layer = msg.layer.add(name=name)
        layer.threshold_y.append(threshold)
        layer.blob_param.add(name=name, threshold_y=threshold)
    path = tmp_path_factory.mktemp("pnet_calib") / "pnet.pb2"
    save_calibration(msg, path)
    return path


@pytest.fixture(scope="module")
def pnet_bmodel(pnet_onnx, pnet_vendor_table, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pnet") / "pnet.bmodel"
    shapes = [f"input_1:1,{s[2]},{s[3]},3" for s in PNET_SHAPES]
    args = ["build", pnet_onnx, "--target", "bm1880", "--calib", pnet_vendor_table, "-o", out]
    assert _cli(*args, *(x for s in shapes for x in ("--input-shape", s))) == 0
    return out


@pytest.mark.parametrize("shape", PNET_SHAPES)
def test_pnet_matches_the_vendor_bmodel(pnet_bmodel, vendor_pnet, pnet_onnx, shape, tmp_path):
    onnx_in, x = _pnet_feeds(shape)
    np.savez(tmp_path / "in.npz", input=x)
    dims = ",".join(map(str, shape))
    assert _cli("run", pnet_bmodel, "--input", tmp_path / "in.npz", "--shape", dims, "-o", tmp_path / "o.npz") == 0
    ours = np.load(tmp_path / "o.npz")
    vendor = run_bmodel(vendor_pnet, {"input": x})
    box, face = ours["convolution_output"], ours["convolution_output1"]
    assert box.shape == vendor["conv4-2"].shape and face.shape == vendor["conv4-1"].shape
    assert cosine(box, vendor["conv4-2"]) >= 0.99  # measured 0.9972 (12x12), 0.9961 (36x48)
    assert cosine(softmax(face, 1), softmax(vendor["conv4-1"], 1)) >= 0.99  # measured 1.0000, 0.9993
    ref_box, ref_prob = ort.InferenceSession(str(pnet_onnx)).run(None, {"input_1": onnx_in})
    assert cosine(box, ref_box.transpose(0, 3, 1, 2)) >= 0.99


def test_pnet_multishape_round_trip(pnet_bmodel):
    model = load_bmodel(pnet_bmodel)
    assert [c.inputs[0].shape for c in model.commands] == list(PNET_SHAPES)
    assert len(model.weights) == 1 and all(c.weight_index == 0 for c in model.commands)
    assert read_bmodel(write_bmodel(model)) == model
    for command in model.commands:
        shape = command.inputs[0].shape
        out = run_bmodel(model, {"input": _pnet_feeds(shape)[1]}, shape)
        expect = {"convolution_output": (1, 4, shape[2] // 2 - 5, shape[3] // 2 - 5)}
        expect["convolution_output1"] = (1, 2, *expect["convolution_output"][2:])
        assert {k: v.shape for k, v in out.items()} == expect
        for ins in decode_cmdbuf(command.cmdbuf):  # every GDMA names its area
            assert ins.engine != isa.ENGINE_GDMA or ins.flags in (isa.FLAG_NEURON, isa.FLAG_WEIGHT)


def test_pnet_with_npuc_calibration(pnet_onnx, vendor_pnet, tmp_path, capsys):
    files = []
    for i, feed in enumerate(model_inputs("mtcnn_pnet", 8)):
        np.savez(tmp_path / f"{i}.npz", **feed)
        files.append(tmp_path / f"{i}.npz")
    table = calibrate(pnet_onnx, files, options=CalibrationOptions(), input_shapes={"input_1": (1, 160, 120, 3)})
    write_table(table.table, tmp_path / "cali_table")
    out = tmp_path / "pnet.bmodel"
    assert _cli("build", pnet_onnx, "--target", "bm1880", "--calib", tmp_path / "cali_table", "--input-shape",
                "input_1:1,36,48,3", "--opt", "layer-group-weight", "-o", out) == 0  # fmt: skip
    # the layout change is said: the ONNX model takes NHWC, the bmodel NCHW (and unnamed)
    assert "note: input 'input_1' is NHWC in the ONNX model; bmodel input #0 takes it as NCHW 1x3x36x48" in (
        capsys.readouterr().out
    )
    onnx_in, x = _pnet_feeds((1, 3, 36, 48))
    ours = run_bmodel(load_bmodel(out), {"input": x})
    box, prob = ort.InferenceSession(str(pnet_onnx)).run(None, {"input_1": onnx_in})
    assert cosine(ours["convolution_output"], box.transpose(0, 3, 1, 2)) >= 0.99  # measured 0.9947
    assert cosine(softmax(ours["convolution_output1"], 1), prob.transpose(0, 3, 1, 2)) >= 0.99  # 0.9989
    vendor = run_bmodel(vendor_pnet, {"input": x})
    # measured 0.9865 with the cali_table's default per-channel gains, 0.9878 with BMNet's per-layer rule (the
    # goal 0.99 is met with the vendor's own thresholds and rule: 0.9961). BMNet's calibration
    # (ONNC's KL: 2048 bins, zeros kept in bin 0) gives npuc's KL thresholds here (P-Net has no exact zeros);
    # max/percentile/mse give 0.9866/0.9839/0.9815. The vendor's thresholds are 1.0-2.1x npuc's, above the
    # max-abs of these images (conv1 13.78 vs 9.59): other calibration data. Both bmodels are close to float
    # (box cosine: npuc 0.9947, vendor 0.9912), so they differ from each other more than from float.
    assert cosine(ours["convolution_output"], vendor["conv4-2"]) >= 0.98


def test_pnet_opt_levels_agree_on_a_large_shape(pnet_onnx, pnet_vendor_table):
    graph = import_onnx(pnet_onnx, {"input_1": (1, 144, 192, 3)})
    canonicalize(graph)
    table = load_thresholds(pnet_vendor_table)
    x = _pnet_feeds((1, 3, 144, 192))[1]
    results = {}
    for opt in OPTS:
        model, (st,), notes, _ = compile_bmodel([graph], table, None, opt, "pnet")
        results[opt] = (run_bmodel(model, {"input": x}), st)
    base = results["none"][0]
    for out, _ in results.values():
        for name in base:
            np.testing.assert_array_equal(out[name], base[name])
    none, group, weight = (results[o][1] for o in OPTS)
    assert group.groups < none.groups and group.ddr_bytes < none.ddr_bytes
    assert weight.ddr_bytes <= group.ddr_bytes
    assert "softmax (softmax)" in notes[0]


# ---- op families vs onnxruntime ----------------------------------------------------------------------------

FAMILIES = (
    "conv_basic", "conv_stride2", "conv_depthwise", "conv_group", "conv_dilated", "conv_1x1_nobias", "conv_5x5",
    "conv_asym_pad", "conv_bn_relu", "pool_max", "pool_max_3x3_s2", "pool_avg", "pool_global_avg",
    "eltwise_add", "act_relu", "act_leakyrelu", "act_prelu", "gemm", "matmul_dense", "concat", "tinycnn",
    "act_sigmoid", "act_tanh", "act_hardswish", "act_hardsigmoid", "act_relu6", "eltwise_mul", "resize_nearest",
    "upsample_nearest", "conv_transpose",
)  # fmt: skip


@pytest.fixture(scope="module")
def family_paths(tmp_path_factory) -> dict[str, Path]:
    return make_all(tmp_path_factory.mktemp("families"), [*FAMILIES, "conv_transpose_4x4", "eltwise_sub"])


@pytest.mark.parametrize("name", FAMILIES)
def test_op_family_matches_onnxruntime(family_paths, name):
    graph = import_onnx(family_paths[name])
    canonicalize(graph)
    rng = np.random.default_rng(7)
    inp = graph.inputs[0]
    feeds = [{inp: rng.standard_normal(graph.shape(inp)).astype(np.float32)} for _ in range(3)]
    table = max_abs_thresholds(graph, feeds)
    outs = {}
    for opt in OPTS:
        model = compile_bmodel([graph], table, None, opt, name).model
        outs[opt] = next(iter(run_bmodel(read_bmodel(write_bmodel(model)), {"input": feeds[0][inp]}).values()))
    for out in outs.values():
        np.testing.assert_array_equal(out, outs["none"])
    sess = ort.InferenceSession(str(family_paths[name]))
    ref = sess.run(None, {sess.get_inputs()[0].name: feeds[0][inp]})[0]
    assert cosine(outs["none"], ref) >= 0.999  # measured 0.9996 .. 0.99996


@pytest.mark.parametrize("name, node", [("conv_transpose_4x4", "convtranspose_3"), ("eltwise_sub", "sub_7")])
def test_unsupported_family_names_the_node(family_paths, name, node):
    graph = import_onnx(family_paths[name])
    canonicalize(graph)
    table = {n: 1.0 for n in graph.tensors}
    with pytest.raises(UnsupportedError, match=f"op '{node}'"):
        compile_bmodel([graph], table, None, "layer-group", name)


def test_missing_threshold_names_the_tensor(family_paths):
    graph = import_onnx(family_paths["conv_basic"])
    canonicalize(graph)
    with pytest.raises(UserError, match="no threshold for tensor"):
        compile_bmodel([graph], {}, None, "none", "x")


# ---- fuzz -------------------------------------------------------------------------------------------------

FUZZ_MUTATIONS = 2000


def test_fuzz_own_bmodel_runs_or_rejects(lenet_bmodel):
    data = lenet_bmodel.read_bytes()
    hot = len(data) - len(load_bmodel(lenet_bmodel).weights[0])  # header + protobuf + cmdbufs
    x = np.fromfile(GOLDEN / "lenet_input_1_1_28_28.bin", np.float32).reshape(1, 1, 28, 28)
    rng = random.Random("bm1880-build-fuzz")
    outcomes = {"ran": 0, "rejected": 0}
    for _ in range(FUZZ_MUTATIONS):
        buf = bytearray(data)
        span = hot if rng.random() < 0.8 else len(buf)
        kind = rng.randrange(3)
        if kind == 0:
            buf = buf[: rng.randrange(span)]
        elif kind == 1:
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(span)
                buf[pos] ^= 1 << rng.randrange(8)
        else:
            pos = rng.randrange(span)
            buf[pos : pos + 4] = bytes(rng.randrange(256) for _ in range(4))
        try:
            run_bmodel(read_bmodel(bytes(buf), "fuzz.bmodel"), {"input": x})
            outcomes["ran"] += 1
        except (CorruptFileError, UserError):
            outcomes["rejected"] += 1
    assert outcomes["ran"] > FUZZ_MUTATIONS // 10 and outcomes["rejected"] > FUZZ_MUTATIONS // 10


def test_channel_gains_lower_the_shift_until_every_bias_fits() -> None:
    """YOLOv8n's class-score conv: biases near -10 at Ty 14.6. BMNet's rule (shift from the weights alone)
    saturates the 16-bit bias; the gain scheme lowers the shift until it fits and gives the channels their
    doublings back where the bias leaves room, so weights and bias both dequantize close to float."""
    from npuc.backends.bm1880.lower_gains import apply_gains
    from npuc.compiler.numformats.bm1880_int8 import bm1880_quantize_layer

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((4, 64, 1, 1)) * 0.05).astype(np.float32)
    bias = np.array([-10.3, -11.0, -0.2, 3.0], np.float32)
    tx, ty = 6.87, 14.64
    rule = bm1880_quantize_layer(weight, bias, tx, ty)
    assert (rule.bias[:2] == -32768).all()  # the per-layer rule saturates
    w, b, r, gains, gain_shift = apply_gains(weight, bias, tx, ty)
    assert gain_shift == 7
    k = 7 - np.log2(gains.astype(np.float64)) if gains is not None else np.zeros(4)
    assert r < rule.rshift and (np.abs(b) < 32767).all()
    unit = 2.0 ** (r + k)  # integer units per float unit, before the 128 / Ty scale
    np.testing.assert_allclose(b / unit * ty / 128, bias, atol=ty / 128 / 2)  # within half an output step
    w_back = w.reshape(4, -1) / unit[:, None] * ty / tx
    assert np.abs(w_back - weight.reshape(4, -1)).max() <= (ty / tx / unit).max() / 2 + 1e-7
    assert k[2] > k[0]  # the channel with a small bias keeps more weight bits
