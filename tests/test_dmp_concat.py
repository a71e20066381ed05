"""Channel concat on the DV700: branches merged into one multi-run conv layer, the free LT_CONCAT, and the
LT_COPY_CONCAT fallback — each built from a generated ONNX model, run from the output folder's bytes and
compared with onnxruntime."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npuc.backends.dmp.artifact import load_network
from npuc.backends.dmp.codegen import INCLUDE_DIR
from npuc.backends.dmp.layers import ConvConf, Layer, Run, pack2, pack4
from npuc.backends.dmp.validate import check_layer
from npuc.compiler.artifacts import ArtifactOptions, detect
from npuc.compiler.errors import UserError
from npuc.compiler.targets import BuildRequest, get_target
from npuc.frontends.onnx import import_onnx
from npuc.models.netbuilder import NetBuilder
from npuc.passes.rewrite.canonicalize import canonicalize

SHAPE = (1, 3, 14, 12)


def _model(tmp_path: Path, body: Callable[[NetBuilder, str], str], name: str) -> Path:
    b = NetBuilder(name, np.random.default_rng(5))
    model = b.build({"input": SHAPE}, {"output": body(b, b.op("Relu", b.conv("input", 3, 16)))})
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _build_and_compare(tmp_path: Path, path: Path, quant: str = "fp16", threshold: float = 0.9995, **options):
    g = import_onnx(path)
    canonicalize(g)
    out = tmp_path / f"{path.stem}_{quant}"
    get_target("dmp").build(BuildRequest(g, path, out, quant=quant, options={"name": "Net", **options}))
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    got = detect(out).run(out, {"input": x}, ArtifactOptions())["output"]
    ref = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    assert got.shape == ref.shape
    a, b = got.ravel().astype(np.float64), ref.ravel().astype(np.float64)
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) >= threshold
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max()
    net, _ = load_network(out)
    return net, out


def _inception(b: NetBuilder, x: str) -> str:
    """Three branches of the GoogLeNet kind: 1x1 | 1x1 -> 3x3 | max pool 3x3 s1 -> 1x1, concatenated."""
    one = b.op("Relu", b.conv(x, 16, 16, k=1))
    three = b.op("Relu", b.conv(b.op("Relu", b.conv(x, 16, 8, k=1)), 8, 24, k=3))
    pool = b.op("MaxPool", x, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    proj = b.op("Relu", b.conv(pool, 16, 8, k=1))
    return b.conv(b.op("Concat", one, three, proj, axis=1), 48, 8, k=1)


def test_branches_become_one_multi_run_layer(tmp_path: Path) -> None:
    net, out = _build_and_compare(tmp_path, _model(tmp_path, _inception, "inception"))
    assert [layer.type for layer in net.layers] == ["LT_CONV", "LT_CONV", "LT_CONV"]
    conf = net.layers[1].conv
    assert conf.topo == 0b10101 and conf.output_mode == 0 and (conf.w, conf.h, conf.c) == (12, 14, 16)
    runs = [(r.conv_enable, r.m, r.p, r.pool_enable, r.actfunc) for r in conf.runs]
    assert runs == [(1, 16, 1, 0, 2), (1, 8, 1, 0, 2), (1, 24, 3, 0, 2), (0, 16, 1, 1, 0), (1, 8, 1, 0, 2)]
    assert net.layers[1].output_dim == [12, 14, 48] and net.layers[1].output_size == 12 * 14 * 48 * 2
    # the weights of the five runs follow each other (fp16 size formula: 144*M*Cg + 16*ceil(M/8))
    sizes = [r.weight_size for r in conf.runs]
    assert sizes == [144 * 16 * 1 + 32, 144 * 8 * 1 + 16, 144 * 24 * 1 + 48, 0, 144 * 8 * 1 + 16]
    assert conf.runs[4].weight_offs == sum(sizes[:4]) + net.layers[0].conv.runs[0].weight_size
    cpp = (out / "Net_gen.cpp").read_text()
    assert "conf.topo = 0x15;" in cpp and "// Topo: 00000000000000000000000000010101" in cpp
    assert "conf.run[4].m = 8;" in cpp
    res = subprocess.run(
        ["g++", "-std=c++14", "-fsyntax-only", "-I", str(INCLUDE_DIR), str(out / "Net_gen.cpp")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr


def test_branches_8bit(tmp_path: Path) -> None:
    net, _ = _build_and_compare(tmp_path, _model(tmp_path, _inception, "inception8"), "8bit", 0.99)
    assert [r.weight_fmt for r in net.layers[1].conv.runs] == [3, 3, 3, 0, 3]


def test_two_conv_branches(tmp_path: Path) -> None:
    def body(b: NetBuilder, x: str) -> str:
        return b.op("Concat", b.conv(x, 16, 8, k=3), b.conv(x, 16, 16, k=5), axis=1)

    net, _ = _build_and_compare(tmp_path, _model(tmp_path, body, "two_branches"))
    assert len(net.layers) == 3 and net.layers[1].conv.topo == 0b11
    assert net.layers[2].type == "LT_FLATTEN"  # the convertor flattens a conv output of more than 8 channels
    assert [r.p for r in net.layers[1].conv.runs] == [3, 5] and net.layers[1].output_dim == [12, 14, 24]
    # an 8 KB unified buffer: each conv alone fits (2 tiles), but the merged command's single-tile peak is
    # 8736 bytes, so the driver would refuse it and the branches stay separate layers with a free concat
    (tmp_path / "small").mkdir()
    small, _ = _build_and_compare(tmp_path / "small", _model(tmp_path, body, "two_branches"), ub_size=8192)
    assert [layer.type for layer in small.layers] == ["LT_CONV", "LT_CONV", "LT_CONV", "LT_CONCAT"]
    assert small.hardware["ub_size"] == 8192


def test_free_concat_places_producers_side_by_side(tmp_path: Path) -> None:
    """One input is a three-layer chain (deeper than a branch may be): LT_CONCAT, producers write in place."""

    def body(b: NetBuilder, x: str) -> str:
        deep = b.conv(b.op("Relu", b.conv(b.op("Relu", b.conv(x, 16, 16, k=1)), 16, 8)), 8, 8)
        return b.op("Concat", b.conv(x, 16, 16, k=1), deep, axis=1)

    net, out = _build_and_compare(tmp_path, _model(tmp_path, body, "free_concat"))
    cpp = (out / "Net_gen.cpp").read_text()
    assert "layer.type = LT_CONCAT;" in cpp and "layer.input_layer_num = 2;" in cpp
    res = subprocess.run(
        ["g++", "-std=c++14", "-fsyntax-only", "-I", str(INCLUDE_DIR), str(out / "Net_gen.cpp")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    concat = net.layers[-1]
    assert concat.type == "LT_CONCAT" and len(net.layers) == 6
    first, second = (net.layers[j] for j in concat.input_layers)
    assert first.output_offs == concat.output_offs and first.output_size == 12 * 14 * 16 * 2
    assert second.output_offs == concat.output_offs + first.output_size
    assert concat.output_size == first.output_size + second.output_size == 12 * 14 * 24 * 2


def test_unaligned_branches_copy_concat(tmp_path: Path) -> None:
    def body(b: NetBuilder, x: str) -> str:
        return b.op("Concat", b.conv(x, 16, 4, k=3), b.conv(x, 16, 6, k=1), axis=1)

    net, _ = _build_and_compare(tmp_path, _model(tmp_path, body, "copy_concat"))
    assert [layer.type for layer in net.layers] == ["LT_CONV", "LT_CONV", "LT_CONV", "LT_COPY_CONCAT"]
    assert net.layers[3].input_layers == [1, 2]


def test_branch_output_used_elsewhere_is_not_merged(tmp_path: Path) -> None:
    def body(b: NetBuilder, x: str) -> str:
        left, right = b.conv(x, 16, 8, k=1), b.conv(x, 16, 8, k=3)
        return b.op("Add", b.op("Concat", left, right, axis=1), b.op("Concat", right, left, axis=1))

    net, _ = _build_and_compare(tmp_path, _model(tmp_path, body, "shared_branch"))
    assert all(len(layer.conv.runs) == 1 for layer in net.layers if layer.conv)
    types = [layer.type for layer in net.layers]
    # the first concat places both producers in its region; the second cannot place them again, so it copies
    assert types == ["LT_CONV", "LT_CONV", "LT_CONV", "LT_CONCAT", "LT_COPY_CONCAT", "LT_CONV", "LT_FLATTEN"]
    assert net.layers[3].input_layers == [1, 2] and net.layers[4].input_layers == [2, 1]


def _branch_layer(m0: int, m1: int, pool: bool = False) -> Layer:
    a = Run(m=m0, conv_enable=1, p=3, conv_pad=pack4(1, 1, 1, 1))
    b = Run(m=m1, conv_enable=1, p=1)
    if pool:
        b.pool_enable, b.pool_size, b.pool_stride = 1, pack2(2, 2), pack2(2, 2)
    return Layer("probe", "LT_CONV", 0, 0, 0, [8, 8, 16], [8, 8, m0 + m1], conv=ConvConf(8, 8, 16, [a, b], topo=3))


def test_branch_rules() -> None:
    check_layer(0, _branch_layer(8, 4))  # only the last branch may end off an 8-channel boundary
    with pytest.raises(UserError, match="branch channels \\[4, 8\\] are not multiples of 8"):
        check_layer(0, _branch_layer(4, 8))
    with pytest.raises(UserError, match="branches end in different sizes"):
        check_layer(0, _branch_layer(8, 8, pool=True))


def test_large_branches_stay_separate(tmp_path: Path) -> None:
    """Input + branch output over the 640 KB unified buffer: no multi-run layer, the producers write in place."""
    b = NetBuilder("big", np.random.default_rng(5))
    x = b.op("Relu", b.conv("input", 3, 16))
    model = b.build(
        {"input": (1, 3, 128, 128)}, {"output": b.op("Concat", b.conv(x, 16, 8), b.conv(x, 16, 16), axis=1)}
    )
    path = tmp_path / "big.onnx"
    onnx.save(model, path)
    g = import_onnx(path)
    canonicalize(g)
    get_target("dmp").build(BuildRequest(g, path, tmp_path / "o"))
    net, _ = load_network(tmp_path / "o")
    assert [layer.type for layer in net.layers] == ["LT_CONV", "LT_CONV", "LT_CONV", "LT_CONCAT"]
    assert 2 * (128 * 128 * 16 + 128 * 128 * 16) > 640 * 1024 >= 2 * (96 * 96 * 16 + 96 * 96 * 16)
