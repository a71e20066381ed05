"""bm1880 data moves and lookups: slice/split/transpose (GDMA S2S copies), nearest upsample (TIU strided copies), LUT
activations (hard-swish, hard-sigmoid, sigmoid), products (SE per-channel, SiLU's x·sigmoid(x), constants).

Each generated model is built, written, read back and simulated from its bytes; every output code equals the
exact integer form of npuc's bm1880 lowering (`write_qdq_bm1880` run by onnxruntime), and the values follow
the float model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from metrics import cosine
from onnx import TensorProto, helper, numpy_helper
from qdq_cases import session
from test_qdq_bm1880 import assert_codes_equal, bmodel_codes, run_named, with_bmodel_output_codes

from npuc.backends.bm1880.build import compile_bmodel
from npuc.backends.bm1880.cmdbuf import decode_cmdbuf, gdma_direction
from npuc.backends.bm1880.container import read_bmodel, write_bmodel
from npuc.backends.bm1880.qdq import lower_for_export, write_qdq_bm1880
from npuc.compiler.errors import UnsupportedError
from npuc.frontends.onnx import import_onnx
from npuc.passes.calibration.calibrate import max_abs_thresholds
from npuc.passes.rewrite.canonicalize import canonicalize

SHAPE = [1, 8, 12, 10]


class Net:
    """A small ONNX graph under construction: nodes, initializers and a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def conv(self, name: str, x: str, y: str, cin: int, cout: int, k: int) -> None:
        w = self.const(f"{name}_w", self.rng.standard_normal((cout, cin, k, k)).astype(np.float32) * 0.3)
        b = self.const(f"{name}_b", self.rng.standard_normal(cout).astype(np.float32) * 0.1)
        self.node("Conv", [x, w, b], [y], name, pads=[k // 2] * 4)

    def node(self, op: str, ins: list[str], outs: list[str], name: str, **attrs) -> None:
        self.nodes.append(helper.make_node(op, ins, outs, name=name, **attrs))

    def save(self, path: Path, outputs: list[str], opset: int = 14) -> Path:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)
        ys = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph(self.nodes, path.stem, [x], ys, self.inits)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
        return path


def moves_model(path: Path, slice_steps: tuple[int, int] = (2, 1), scales=(2.0, 3.0), mode="asymmetric") -> Path:
    """conv -> Split channels 6/10 -> (rows 1..10 step 2, channels 2..5 of the first) and (nearest x2 x3 of
    the second -> conv)."""
    net = Net(3)
    net.conv("c0", "x", "t0", 8, 16, 3)
    net.node("Split", ["t0", net.const("sizes", np.array([6, 10], np.int64))], ["a", "b"], "split", axis=1)
    args = {"st": [1, 2], "en": [11, 6], "ax": [2, 3 if slice_steps[1] > 1 else 1], "sp": list(slice_steps)}
    net.node("Slice", ["a", *(net.const(k, np.array(v, np.int64)) for k, v in args.items())], ["a2"], "slice")
    scales_c = net.const("scales", np.array([1, 1, *scales], np.float32))
    net.node("Resize", ["b", "", scales_c], ["b2"], "up", mode="nearest", coordinate_transformation_mode=mode,
             nearest_mode="floor")  # fmt: skip
    net.conv("c1", "b2", "y", 10, 4, 3)
    return net.save(path, ["a2", "y"])


def lookup_model(path: Path) -> Path:
    """conv -> HardSwish -> SE (global pool, 1x1 conv, HardSigmoid, per-channel Mul) -> x 0.7 -> x per-channel
    constant -> conv -> SiLU (Sigmoid, Mul)."""
    net = Net(4)
    net.conv("c0", "x", "t0", 8, 16, 3)
    net.node("HardSwish", ["t0"], ["h0"], "hswish")
    net.node("GlobalAveragePool", ["h0"], ["p"], "gap")
    net.conv("c1", "p", "q", 16, 16, 1)
    net.node("HardSigmoid", ["q"], ["g"], "hsigmoid", alpha=1 / 6, beta=0.5)
    net.node("Mul", ["h0", "g"], ["se"], "se_mul")
    net.node("Mul", ["se", net.const("k", np.array([0.7], np.float32))], ["k1"], "scale")
    per_channel = net.rng.uniform(-1.5, 1.5, (16, 1, 1)).astype(np.float32)
    net.node("Mul", [net.const("kc", per_channel), "k1"], ["k2"], "channel_scale")
    net.conv("c2", "k2", "t2", 16, 8, 3)
    net.node("Sigmoid", ["t2"], ["s2"], "sigmoid")
    net.node("Mul", ["t2", "s2"], ["y"], "silu")
    return net.save(path, ["y"])


def transpose_model(path: Path, perm: tuple[int, ...] = (0, 2, 1, 3)) -> Path:
    """conv -> Transpose (channels <-> rows) -> conv; and the DFL head's reshape (1, 4, 4, 120) -> transpose."""
    net = Net(5)
    net.conv("c0", "x", "t0", 8, 16, 3)
    net.node("Transpose", ["t0"], ["tt"], "swap", perm=[0, 2, 1, 3])
    net.conv("c1", "tt", "y", 12, 4, 3)
    net.node("Reshape", ["t0", net.const("dfl", np.array([1, 4, 4, 120], np.int64))], ["r"], "reshape")
    net.node("Transpose", ["r"], ["d"], "dfl_transpose", perm=list(perm))
    net.conv("c2", "d", "z", (1, 4, 4, 120)[perm[1]], 4, 1)
    return net.save(path, ["y", "z"])


def deconv_model(path: Path, bias_apart: bool = True) -> Path:
    """conv -> ConvTranspose 2x2 stride 2 (a learned 2x upsample) with its bias as a following Add of a
    per-channel constant and a ReLU (PP-OCR's DB head spells it so) or as its own input -> conv."""
    net = Net(6)
    net.conv("c0", "x", "t0", 8, 16, 3)
    weight = net.const("up_w", net.rng.standard_normal((16, 8, 2, 2)).astype(np.float32) * 0.3)
    bias = net.const("up_b", net.rng.standard_normal(8).astype(np.float32) * 0.2)
    if bias_apart:
        net.node("ConvTranspose", ["t0", weight], ["u"], "up", strides=[2, 2])
        net.node("Add", ["u", net.const("up_add", net.rng.standard_normal((8, 1, 1)).astype(np.float32))], ["ub"],
                 "up_bias")  # fmt: skip
    else:
        net.node("ConvTranspose", ["t0", weight, bias], ["ub"], "up", strides=[2, 2])
    net.node("Relu", ["ub"], ["ur"], "up_relu")
    net.conv("c1", "ur", "y", 8, 4, 3)
    return net.save(path, ["y"])


def overlapping_deconv_model(path: Path) -> Path:
    """A 3x3 stride-2 transposed conv: its blocks overlap, which phase convs do not express."""
    net = Net(7)
    weight = net.const("up_w", net.rng.standard_normal((8, 4, 3, 3)).astype(np.float32))
    net.node("ConvTranspose", ["x", weight], ["t"], "up", strides=[2, 2])
    net.conv("c1", "t", "y", 4, 4, 1)
    return net.save(path, ["y"])


def wide_transpose_model(path: Path) -> Path:
    """A transpose whose output rows walk an input axis 65536 bytes apart: past a GDMA h stride."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 256, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((1, 256, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="far", perm=[0, 2, 1, 3]),
             helper.make_node("Conv", ["t", "w"], ["y"], name="sum")]  # fmt: skip
    graph = helper.make_graph(nodes, "wide", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), path)
    return path


def _graph(path: Path):
    graph = import_onnx(path)
    canonicalize(graph)
    return graph


def _feeds(n: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(n)]


def _exact_against_reference(path: Path, weight_scale: str = "layer") -> tuple[int, float, list]:
    """Codes compared (all equal, both opt levels) and the worst output cosine against onnxruntime."""
    graph = _graph(path)
    feeds = _feeds()
    table = max_abs_thresholds(graph, feeds)
    gains = weight_scale == "channel"
    probe, names = with_bmodel_output_codes(write_qdq_bm1880(graph, table, channel_gains=gains))
    reference = session(probe)
    float_model = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    compared, worst, models = 0, 1.0, []
    for opt in ("none", "layer-group"):
        model = read_bmodel(write_bmodel(compile_bmodel([graph], table, None, opt, path.stem, weight_scale)[0]))
        models.append(model)
        for feed in feeds:
            codes, floats = bmodel_codes(model, feed["x"])
            compared += assert_codes_equal(run_named(reference, feed), names, codes)
            expect = dict(zip([o.name for o in float_model.get_outputs()], float_model.run(None, feed)))
            worst = min(worst, *(cosine(floats[k], expect[k]) for k in floats))
    return compared, worst, models


def test_split_slice_upsample_are_exact(tmp_path):
    compared, worst, models = _exact_against_reference(moves_model(tmp_path / "moves.onnx"))
    assert compared == 2 * 3 * (1 * 4 * 5 * 10 + 1 * 4 * 24 * 30)
    assert worst >= 0.999  # measured 0.99977
    directions = [gdma_direction(i) for i in decode_cmdbuf(models[0].commands[0].cmdbuf) if i.engine == 2]
    assert directions.count("S2S") == 3  # the two split halves and the slice: gmem to gmem, no local memory


def test_lookups_and_products_are_exact(tmp_path):
    compared, worst, _ = _exact_against_reference(lookup_model(tmp_path / "lookup.onnx"))
    assert compared == 2 * 3 * 8 * 12 * 10
    assert worst >= 0.998  # measured 0.9994


def test_per_channel_gains_are_exact(tmp_path):
    """weight_scale=channel: conv/depthwise write 16 bits, then a per-channel u8 gain and a shift of 7."""
    path = lookup_model(tmp_path / "m.onnx")
    graph = _graph(path)
    table = max_abs_thresholds(graph, _feeds(1))
    layers = lower_for_export(graph, table, None, channel_gains=True).net.layers
    assert any(layer.gains is not None and layer.gains.min() < 128 for layer in layers)
    compared, worst, _ = _exact_against_reference(path, "channel")
    assert compared > 0 and worst >= 0.998


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (0, 3, 2, 1), (0, 2, 3, 1), (0, 1, 3, 2), (0, 3, 1, 2)])
def test_transposes_are_strided_copies(tmp_path, perm):
    """Whole rows when the last axis stays (one S2S each), single bytes when it moves (the output's W on the
    GDMA's N axis: still one S2S for these sizes)."""
    compared, worst, models = _exact_against_reference(transpose_model(tmp_path / "transpose.onnx", perm))
    d = [(1, 4, 4, 120)[a] for a in perm]  # the transposed map; c2 gives 4 channels of its rows x columns
    assert compared == 2 * 3 * (4 * 16 * 10 + 4 * d[2] * d[3])
    assert worst >= 0.999
    gdmas = [i for i in decode_cmdbuf(models[0].commands[0].cmdbuf) if i.engine == 2]
    copies = [i.fields for i in gdmas if gdma_direction(i) == "S2S"]
    assert len(copies) == 2
    assert copies[1]["src_w"] == (120 if perm[3] == 3 else 1)


@pytest.mark.parametrize("bias_apart", [True, False])
def test_stride_sized_deconvs_are_phase_convs(tmp_path, bias_apart):
    """One 1x1 conv per phase of the 2x2 block (the bias Add and ReLU folded in), then the phases interleaved
    by TIU copies into strided output tiles."""
    path = deconv_model(tmp_path / "deconv.onnx", bias_apart)
    graph = _graph(path)
    layers = lower_for_export(graph, max_abs_thresholds(graph, _feeds(1)), None).net.layers
    kinds = [layer.kind for layer in layers]
    assert kinds == ["conv"] * 5 + ["interleave", "conv"] and all(layer.relu for layer in layers[1:5])
    compared, worst, _ = _exact_against_reference(path)
    assert compared == 2 * 3 * 4 * 24 * 20
    assert worst >= 0.999


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda p: moves_model(p, slice_steps=(1, 2)), r"op 'slice' \(slice\) with step 2 along the last axis"),
        (lambda p: moves_model(p, scales=(1.5, 2.0)), r"op 'up' \(resize\) mode nearest"),
        (lambda p: moves_model(p, mode="tf_crop_and_resize"), r"op 'up' \(resize\)"),
        (lambda p: wide_transpose_model(p), r"op 'far' \(transpose\) reading rows 65536 bytes apart"),
        (lambda p: overlapping_deconv_model(p), r"op 'up' \(conv_transpose2d\) with kernel \(3, 3\), strides \(2, 2\)"),
    ],
)
def test_moves_the_hardware_cannot_do_name_the_op(tmp_path, make, what):
    graph = _graph(make(tmp_path / "bad.onnx"))
    feed = {"x": np.random.default_rng(0).standard_normal(graph.shape("x")).astype(np.float32)}
    with pytest.raises(UnsupportedError, match=what):
        compile_bmodel([graph], max_abs_thresholds(graph, [feed]), None, "none", "bad")


def test_inspect_lists_no_gap(tmp_path):
    models = (moves_model(tmp_path / "m.onnx"), lookup_model(tmp_path / "l.onnx"), transpose_model(tmp_path / "t.onnx"))
    for path in models:
        done = subprocess.run([sys.executable, "-m", "npuc", "inspect", str(path), "--target", "bm1880"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0 and "bm1880 (int8): every op runs" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    "name, shape, weight_scale",
    [("pplcnet_orientation", [1, 3, 224, 224], "channel"), ("mbv3_textline_cls", [1, 3, 48, 192], "layer")],
)
def test_real_classifiers_run_bit_exact(real_model, name, shape, weight_scale):
    """PP-LCNet (hard-swish, SE, a constant scale) and MobileNetV3 text-cls (hard-swish, hard-sigmoid SE) build
    for bm1880 and their bmodels, simulated from the bytes on real pictures, give the exact reference's codes
    (max-abs thresholds of two pictures; accuracy with npuc calibrate's defaults: bench/bm1880_real.py)."""
    from npuc.models.images import model_inputs

    path = real_model(name)
    graph = import_onnx(path, {"x": shape})
    canonicalize(graph)
    feeds = model_inputs(name, 3)
    table = max_abs_thresholds(graph, feeds[:2])
    model = read_bmodel(write_bmodel(compile_bmodel([graph], table, None, "layer-group", name, weight_scale)[0]))
    gains = weight_scale == "channel"
    layers = lower_for_export(graph, table, None, gains).net.layers
    assert {"lut", "mul"} <= {layer.kind for layer in layers}
    assert any(layer.gains is not None for layer in layers) == gains
    probe, names = with_bmodel_output_codes(write_qdq_bm1880(graph, table, channel_gains=gains))
    codes, _ = bmodel_codes(model, feeds[2]["x"])
    classes = 4 if name == "pplcnet_orientation" else 2
    assert assert_codes_equal(run_named(session(probe), feeds[2]), names, codes) == classes
