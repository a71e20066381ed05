"""YOLOv8 on the DV700: SiLU as a CPU custom layer, channel splits as views of the WHC8 layout, the 5x5
SPPF max pools as cascades, and the detection head's decode on the host; small graphs built through the
target, run from the written folder and compared with the float interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from metrics import cosine

from npuc.backends.dmp.artifact import load_network
from npuc.compiler import interp
from npuc.compiler.artifacts import ArtifactOptions, detect
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph
from npuc.compiler.ops import (
    Activation,
    ActivationOp,
    Concat,
    Conv2d,
    Eltwise,
    Pool2d,
    Reshape,
    Slice,
    Softmax,
    Split,
    Transpose,
)
from npuc.compiler.targets import BuildRequest, BuildResult, get_target


def _input(g: Graph, c: int, h: int, w: int) -> None:
    g.add_tensor("x", (1, c, h, w))
    g.inputs = ["x"]


def _conv_silu(g: Graph, src: str, dst: str, m: int, k: int, seed: int, silu: bool = True) -> None:
    """conv → sigmoid → mul, as Ultralytics exports its Conv blocks (silu False: the conv alone)."""
    rng = np.random.default_rng(seed)
    c = g.shape(src)[1]
    g.add_const(f"{dst}_w", (rng.standard_normal((m, c, k, k)) * 0.3).astype(np.float32))
    g.add_const(f"{dst}_b", (rng.standard_normal(m) * 0.1).astype(np.float32))
    g.add_op("conv2d", [src, f"{dst}_w", f"{dst}_b"], [f"{dst}_c" if silu else dst], Conv2d(pads=(k // 2,) * 4))
    if not silu:
        return
    g.add_op("activation", [f"{dst}_c"], [f"{dst}_s"], ActivationOp(Activation("sigmoid")))
    g.add_op("eltwise", [f"{dst}_c", f"{dst}_s"], [dst], Eltwise("mul"))


def _build_run(g: Graph, tmp_path: Path, quant: str = "fp16", threshold: float = 0.999) -> BuildResult:
    g.verify()
    out = tmp_path / quant
    result = get_target("dmp").build(BuildRequest(g, Path("t.onnx"), out, quant=quant))
    x = np.random.default_rng(7).standard_normal(g.shape("x")).astype(np.float32)
    got = detect(out).run(out, {"x": x}, ArtifactOptions())
    ref = interp.run(g, {"x": x})
    for name in g.outputs:
        assert got[name].shape == ref[name].shape
        assert cosine(got[name], ref[name]) >= threshold, (name, cosine(got[name], ref[name]))
    return result


def test_silu_is_one_cpu_custom_layer_counted_in_the_summary(tmp_path: Path) -> None:
    g = Graph("t")
    _input(g, 3, 12, 10)
    _conv_silu(g, "x", "a", 16, 3, 0)
    _conv_silu(g, "a", "y", 8, 1, 1)
    g.outputs = ["y"]
    result = _build_run(g, tmp_path)
    net, _ = load_network(tmp_path / "fp16")
    assert [(layer.type, layer.custom_type) for layer in net.layers] == [
        ("LT_CONV", None),
        ("LT_CUSTOM", "silu"),
        ("LT_CONV", None),
        ("LT_CUSTOM", "silu"),
    ]
    assert net.layers[1].ops == ["a_s", "a"]  # the sigmoid and its mul
    assert result.summary["cpu_layers"] == 2
    assert result.notes == ["2 of 4 layers are CPU custom layers (2 silu); the host runs them"]
    header = (tmp_path / "fp16" / "t_gen.h").read_text()
    assert "void custom_callback_silu(fpga_layer& layer, void* custom_param, uint8_t* io_ptr);" in header
    _build_run(g, tmp_path, "8bit", 0.99)


def test_sigmoid_times_something_else_is_not_silu(tmp_path: Path) -> None:
    """A sigmoid whose product is with another tensor stays a DV700 sigmoid; the mul is refused by name."""
    g = Graph("t")
    _input(g, 8, 6, 6)
    _conv_silu(g, "x", "a", 8, 1, 0)
    g.add_op("activation", ["a"], ["s"], ActivationOp(Activation("sigmoid")))
    g.add_op("eltwise", ["x", "s"], ["y"], Eltwise("mul"))
    g.outputs = ["y"]
    with pytest.raises(UserError, match="mul 'y': DV700 multiplies tensors only by a per-channel"):
        get_target("dmp").build(BuildRequest(g, Path("t.onnx"), tmp_path / "o"))


def _c2f(g: Graph, src: str, dst: str, c: int, first: tuple[int, ...], order: tuple[int, ...] = (0, 1)) -> None:
    """Ultralytics' C2f: cv1 → split → bottleneck on the last chunk (+ shortcut) → concat → cv2."""
    _conv_silu(g, src, f"{dst}_cv1", c, 1, 10)
    g.add_op("split", [f"{dst}_cv1"], [f"{dst}_s{k}" for k in range(len(first))], Split(1, first))
    last = f"{dst}_s{len(first) - 1}"
    _conv_silu(g, last, f"{dst}_m1", first[-1], 3, 11)
    _conv_silu(g, f"{dst}_m1", f"{dst}_m2", first[-1], 3, 12)
    g.add_op("eltwise", [last, f"{dst}_m2"], [f"{dst}_add"], Eltwise("add"))
    parts = [f"{dst}_s{k}" for k in order] + [f"{dst}_add"]
    g.add_op("concat", parts, [f"{dst}_cat"], Concat(1))
    _conv_silu(g, f"{dst}_cat", dst, c, 1, 13)


def test_c2f_split_is_a_view_and_its_concat_is_free(tmp_path: Path) -> None:
    g = Graph("t")
    _input(g, 3, 10, 12)
    _conv_silu(g, "x", "a", 16, 3, 0)
    _c2f(g, "a", "y", 32, (16, 16))
    g.outputs = ["y"]
    _build_run(g, tmp_path)
    net, _ = load_network(tmp_path / "fp16")
    types = [layer.type for layer in net.layers]
    assert "LT_COPY_CONCAT" not in types and types.count("LT_CONCAT") == 1
    concat = next(layer for layer in net.layers if layer.type == "LT_CONCAT")
    cv1 = net.layers[concat.input_layers[0]]
    assert (cv1.custom_type, cv1.output_offs, cv1.output_dim) == ("silu", concat.output_offs, [12, 10, 32])
    m1 = next(layer for layer in net.layers if layer.ops and layer.ops[0] == "y_m1_c")
    assert m1.input_offs == cv1.output_offs + 2 * 16 * 12 * 10  # the second chunk, read in place
    _build_run(g, tmp_path, "8bit", 0.99)


def test_views_out_of_order_are_copied_and_unaligned_chunks_picked(tmp_path: Path) -> None:
    g = Graph("t")
    _input(g, 3, 6, 8)
    _c2f(g, "x", "y", 16, (8, 8), order=(1, 0))  # a concat reading the views in the other order
    _c2f(g, "y", "z", 16, (4, 12))  # chunks off the 8-channel grid
    g.add_op("slice", ["z"], ["w"], Slice((8,), (16,), (1,), (1,)))
    g.outputs = ["w"]
    _build_run(g, tmp_path)
    net, _ = load_network(tmp_path / "fp16")
    names = [layer.name for layer in net.layers]
    assert "y_cat:copy0" in names and "y_cat:copy1" in names
    assert "z_s0:z_s0" in names and "z_s0:z_s1" in names  # 1x1 convs picking channels 0-3 and 4-15
    # a graph output gets a layer of its own, not a view of z: the runtime finds outputs by their layer
    w = net.layers[-1]
    assert (w.name, w.type, w.output_dim, w.is_output) == ("w", "LT_CONV", [8, 6, 8], True)
    assert net.outputs[0].offs == w.output_offs


def test_sppf_max_pools_are_3x3_cascades(tmp_path: Path) -> None:
    g = Graph("t")
    _input(g, 8, 9, 11)
    _conv_silu(g, "x", "a", 16, 1, 0)
    g.add_op("pool2d", ["a"], ["p1"], Pool2d("max", (5, 5), (1, 1), pads=(2, 2, 2, 2)))
    g.add_op("pool2d", ["p1"], ["p2"], Pool2d("max", (5, 5), (1, 1), pads=(2, 2, 2, 2)))
    g.add_op("concat", ["a", "p1", "p2"], ["y"], Concat(1))
    g.outputs = ["y"]
    _build_run(g, tmp_path, threshold=0.99999)
    net, _ = load_network(tmp_path / "fp16")
    pools = [layer for layer in net.layers if layer.conv and layer.conv.runs[0].pool_enable == 1]
    assert [len(layer.conv.runs) for layer in pools] == [2, 2]
    assert all(r.pool_size == 0x303 and r.pool_pad == 0x01010101 for layer in pools for r in layer.conv.runs)


def _head(g: Graph, levels: list[tuple[str, int]], reg_max: int, classes: int, centre: float = 0.5) -> None:
    """Ultralytics' Detect head on (feature, stride) levels, with its exported decode: per level a plain box
    conv (4·reg_max) and a plain class conv concatenated, reshaped to 1xCx(H·W) and concatenated along the anchors; then
    split, DFL (softmax over the bins, 1x1 conv with weights 0..reg_max-1), dist2bbox and the stride."""
    rows, centres, strides = [], [], []
    for i, (feature, stride) in enumerate(levels):
        _, _, h, w = g.shape(feature)
        _conv_silu(g, feature, f"box{i}", 4 * reg_max, 1, 20 + i, silu=False)
        _conv_silu(g, feature, f"cls{i}", classes, 1, 30 + i, silu=False)
        g.add_op("concat", [f"box{i}", f"cls{i}"], [f"lvl{i}"], Concat(1))
        g.add_op("reshape", [f"lvl{i}"], [f"rows{i}"], Reshape((1, 4 * reg_max + classes, h * w)))
        rows.append(f"rows{i}")
        ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        centres.append(np.stack([xs.ravel(), ys.ravel()]) + centre)
        strides.append(np.full(h * w, stride))
    n = sum(c.shape[1] for c in centres)
    g.add_op("concat", rows, ["cat"], Concat(2))
    g.add_op("split", ["cat"], ["dist", "logits"], Split(1, (4 * reg_max, classes)))
    g.add_op("reshape", ["dist"], ["d4"], Reshape((1, 4, reg_max, n)))
    g.add_op("transpose", ["d4"], ["dt"], Transpose((0, 2, 1, 3)))
    g.add_op("softmax", ["dt"], ["p"], Softmax(1))
    g.add_const("bins", np.arange(reg_max, dtype=np.float32).reshape(1, reg_max, 1, 1))
    g.add_op("conv2d", ["p", "bins"], ["e"], Conv2d())
    g.add_op("reshape", ["e"], ["d"], Reshape((1, 4, n)))
    g.add_op("slice", ["d"], ["lt"], Slice((0,), (2,), (1,), (1,)))
    g.add_op("slice", ["d"], ["rb"], Slice((2,), (4,), (1,), (1,)))
    g.add_const("anchors", np.concatenate(centres, axis=1)[None].astype(np.float32))
    g.add_op("eltwise", ["anchors", "lt"], ["x1y1"], Eltwise("sub"))
    g.add_op("eltwise", ["anchors", "rb"], ["x2y2"], Eltwise("add"))
    g.add_op("eltwise", ["x1y1", "x2y2"], ["sum"], Eltwise("add"))
    g.add_op("eltwise", ["x2y2", "x1y1"], ["wh"], Eltwise("sub"))
    g.add_const("half", np.array(0.5, np.float32))
    g.add_op("eltwise", ["sum", "half"], ["cxy"], Eltwise("mul"))
    g.add_op("concat", ["cxy", "wh"], ["box"], Concat(1))
    g.add_const("strides", np.concatenate(strides)[None].astype(np.float32))
    g.add_op("eltwise", ["box", "strides"], ["scaled"], Eltwise("mul"))
    g.add_op("activation", ["logits"], ["scores"], ActivationOp(Activation("sigmoid")))
    g.add_op("concat", ["scaled", "scores"], ["y"], Concat(1))
    g.outputs = ["y"]


def _two_level_net(centre: float = 0.5) -> Graph:
    g = Graph("t")
    _input(g, 3, 32, 32)
    _conv_silu(g, "x", "p3", 16, 3, 0)  # stand-ins for the backbone: stride 1 here, the head's strides below
    g.add_op("pool2d", ["p3"], ["p3s"], Pool2d("max", (2, 2), (2, 2)))
    g.add_op("pool2d", ["p3s"], ["p3d"], Pool2d("max", (2, 2), (2, 2)))
    g.add_op("pool2d", ["p3d"], ["f8"], Pool2d("max", (2, 2), (2, 2)))
    g.add_op("pool2d", ["f8"], ["f16"], Pool2d("max", (2, 2), (2, 2)))
    _head(g, [("f8", 8), ("f16", 16)], reg_max=4, classes=3, centre=centre)
    return g


def test_head_decode_is_one_counted_cpu_layer(tmp_path: Path) -> None:
    g = _two_level_net()
    result = _build_run(g, tmp_path, threshold=0.9999)
    net, _ = load_network(tmp_path / "fp16")
    decode = net.layers[-1]
    assert (decode.type, decode.custom_type, decode.is_f32_output) == ("LT_CUSTOM", "yolo_decode", True)
    assert decode.ops[0] == "cat" and "y" in decode.ops and len(decode.ops) == 18
    assert {k: decode.custom_params[k] for k in ("reg_max", "levels", "w0", "h0", "stride0", "w1", "stride1")} == {
        "reg_max": 4.0, "levels": 2.0, "w0": 4.0, "h0": 4.0, "stride0": 8.0, "w1": 2.0, "stride1": 16.0,
    }  # fmt: skip
    levels = [layer for layer in net.layers if layer.type == "LT_CONCAT"]
    assert [decode.custom_params[f"level{k}_offs"] for k in (0, 1)] == [lvl.output_offs for lvl in levels]
    assert decode.input_offs == levels[0].output_offs
    assert result.summary["cpu_layers"] == 1 + sum(layer.custom_type == "silu" for layer in net.layers)
    # the class scores' sigmoid runs on the DV700, as the class convs' activation
    assert decode.custom_params["sigmoid"] == 0.0
    assert [layer.conv.runs[0].actfunc for layer in net.layers if layer.name.startswith("cls")] == [3, 3]
    header = (tmp_path / "fp16" / "t_gen.h").read_text()
    assert "struct custom_param_yolo_decode {\n  float reg_max;\n  float levels;\n  float w0;" in header
    assert "  size_t level0_offs;\n  size_t level1_offs;\n};" in header


def test_a_decode_that_is_not_yolov8s_is_refused_by_name(tmp_path: Path) -> None:
    g = _two_level_net(centre=0.25)  # anchors off the cell centres: not what yolo_decode computes
    with pytest.raises(UserError, match=r"the ops after concat 'cat' \(cat, dist, d4, dt, p, e, .*, y\) are not"):
        get_target("dmp").build(BuildRequest(g, Path("t.onnx"), tmp_path / "o"))


def test_class_scores_read_elsewhere_keep_their_sigmoid_on_the_host(tmp_path: Path) -> None:
    g = _two_level_net()
    g.outputs.append("cls0")  # the raw class logits are wanted too: the class conv must not apply the sigmoid
    _build_run(g, tmp_path, threshold=0.9999)
    net, _ = load_network(tmp_path / "fp16")
    assert net.layers[-1].custom_params["sigmoid"] == 1.0
    assert [layer.conv.runs[0].actfunc for layer in net.layers if layer.name.startswith("cls")] == [0, 0]
