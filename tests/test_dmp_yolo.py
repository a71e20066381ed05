"""YOLOv8 on the DV700: SiLU as a CPU custom layer, channel splits as views of the WHC8 layout and the 5x5
SPPF max pools as cascades; small graphs built through the target, run from the written folder and compared
with the float interpreter."""

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
    Slice,
    Split,
)
from npuc.compiler.targets import BuildRequest, BuildResult, get_target


def _input(g: Graph, c: int, h: int, w: int) -> None:
    g.add_tensor("x", (1, c, h, w))
    g.inputs = ["x"]


def _conv_silu(g: Graph, src: str, dst: str, m: int, k: int, seed: int) -> None:
    """conv → sigmoid → mul, as Ultralytics exports its Conv blocks."""
    rng = np.random.default_rng(seed)
    c = g.shape(src)[1]
    g.add_const(f"{dst}_w", (rng.standard_normal((m, c, k, k)) * 0.3).astype(np.float32))
    g.add_const(f"{dst}_b", (rng.standard_normal(m) * 0.1).astype(np.float32))
    g.add_op("conv2d", [src, f"{dst}_w", f"{dst}_b"], [f"{dst}_c"], Conv2d(pads=(k // 2,) * 4))
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
