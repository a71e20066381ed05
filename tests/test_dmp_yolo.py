"""YOLOv8 on the DV700: SiLU as a CPU custom layer; small graphs built through the target, run from the
written folder and compared with the float interpreter."""

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
from npuc.compiler.ops import Activation, ActivationOp, Conv2d, Eltwise
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
