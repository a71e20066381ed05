"""DV700 lowering checked on small IR graphs (the driver's validation rules: test_dmp_validate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from npuc.backends.dmp import weights as wp
from npuc.backends.dmp.layers import pack4
from npuc.backends.dmp.lower import lower_graph
from npuc.backends.dmp.sim import run_network
from npuc.compiler import interp
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph
from npuc.compiler.ops import (
    Activation,
    ActivationOp,
    ChannelScale,
    Conv2d,
    ConvTranspose2d,
    Eltwise,
    GlobalPool,
    Pad,
    Pool2d,
    PRelu,
    Resize,
)
from npuc.passes.rewrite.canonicalize import canonicalize

# ---------------------------------------------------------------------------------------------------------
# lowering on small graphs, simulated and compared with the float interpreter
# ---------------------------------------------------------------------------------------------------------


def _graph(c: int = 8, h: int = 12, w: int = 10) -> Graph:
    g = Graph("t")
    g.add_tensor("x", (1, c, h, w))
    g.inputs = ["x"]
    return g


def _conv(g: Graph, src: str, dst: str, m: int, k: int, seed: int, **attrs: object) -> None:
    rng = np.random.default_rng(seed)
    c = g.shape(src)[1]
    group = attrs.get("group", 1)
    g.add_const(f"{dst}_w", (rng.standard_normal((m, c // group, k, k)) * 0.2).astype(np.float32))
    g.add_const(f"{dst}_b", rng.standard_normal(m).astype(np.float32) * 0.1)
    g.add_op("conv2d", [src, f"{dst}_w", f"{dst}_b"], [dst], Conv2d(**attrs))


def _check(g: Graph, quantized: bool = False, threshold: float = 0.9995) -> tuple:
    g.verify()
    x = np.random.default_rng(0).standard_normal(g.shape("x")).astype(np.float32)
    net, blob = lower_graph(g, name="t", quantized=quantized)
    out = run_network(net, blob, {"x": x})
    ref = interp.run(g, {"x": x})
    for name in g.outputs:
        a, b = out[name].ravel().astype(np.float64), ref[name].ravel().astype(np.float64)
        assert out[name].shape == ref[name].shape
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) >= threshold, name
    return net, blob


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_conv_kernels_fused_pool_and_act(k: int) -> None:
    g = _graph()
    _conv(g, "x", "c", 12, k, k, pads=(k // 2,) * 4, act=Activation("relu"))
    g.add_op("pool2d", ["c"], ["y"], Pool2d("max", (2, 2), (2, 2)))
    g.outputs = ["y"]
    net, _ = _check(g)
    assert [layer.type for layer in net.layers] == ["LT_CONV", "LT_FLATTEN"]  # 12 channels: HWC for the CPU
    run = net.layers[0].conv.runs[0]
    assert (run.pool_enable, run.pool_size, run.actfunc, run.actfunc_param, run.p) == (1, 0x202, 2, 0, k)
    assert net.layers[0].output_dim == [5, 6, 12]


def test_depthwise_dilated_and_8bit() -> None:
    g = _graph(c=16)
    _conv(g, "x", "d", 16, 3, 1, pads=(1, 1, 1, 1), group=16)
    _conv(g, "d", "y", 8, 3, 2, pads=(2, 2, 2, 2), dilations=(2, 2))
    g.outputs = ["y"]
    net, _ = _check(g)
    runs = [layer.conv.runs[0] for layer in net.layers]
    assert [(r.conv_enable, r.conv_dilation, r.weight_fmt) for r in runs] == [(3, 0, 1), (1, 0x202, 1)]
    net8, blob8 = _check(g, quantized=True, threshold=0.995)
    assert [layer.conv.runs[0].weight_fmt for layer in net8.layers] == [3, 3]
    assert net8.layers[1].conv.runs[0].weight_offs == 512 + 72 * 16 + 32  # after the 8-bit depthwise pack


def test_eltwise_add_avg_pool_cascade_upsample() -> None:
    g = _graph(c=8, h=14, w=14)
    _conv(g, "x", "a", 8, 3, 3, pads=(1, 1, 1, 1))
    g.add_op("eltwise", ["a", "x"], ["s"], Eltwise("add", act=Activation("relu")))
    g.add_op("resize", ["s"], ["u"], Resize((1, 8, 28, 28), (1.0, 1.0, 2.0, 2.0)))
    g.add_op("global_pool", ["u"], ["y"], GlobalPool("avg"))
    g.outputs = ["y", "s"]
    net, _ = _check(g)
    add = net.layers[1].conv
    assert (add.output_mode, add.eltwise_offs, add.runs[0].pool_avg_param) == (1, net.layers[0].input_offs, 0x3C00)
    pool = net.layers[3].conv
    assert [(r.pool_size, r.pool_stride) for r in pool.runs] == [(0x707, 0x707), (0x404, 0x404)]
    assert pool.topo == 0b10


def test_lowering_errors_name_the_op() -> None:
    g = _graph(c=8)
    _conv(g, "x", "y", 8, 3, 0, group=2)
    g.outputs = ["y"]
    with pytest.raises(UserError, match="conv 'y' has group=2"):
        lower_graph(g, name="t", quantized=False)
    g = _graph(c=8)
    g.add_op("pool2d", ["x"], ["y"], Pool2d("avg", (2, 2), (1, 1), pads=(1, 1, 1, 1)))
    g.outputs = ["y"]
    with pytest.raises(UserError, match="average pool 'y' pads"):
        lower_graph(g, name="t", quantized=False)
    g = _graph(c=8, h=11, w=11)
    g.add_op("global_pool", ["x"], ["y"], GlobalPool("avg"))
    g.outputs = ["y"]
    with pytest.raises(UserError, match="does not factor"):
        lower_graph(g, name="t", quantized=False)


DECONVS = [
    # (kernel, stride, pads t/l/b/r, output_padding, group): even kernels, cropping pads, output_padding, depthwise
    (2, 2, (0, 0, 0, 0), (0, 0), 1),
    (3, 2, (1, 1, 1, 1), (1, 1), 1),
    (4, 2, (1, 1, 1, 1), (0, 0), 1),
    (3, 1, (0, 0, 0, 0), (0, 0), 1),
    (3, 2, (1, 1, 1, 1), (1, 1), 8),
]


@pytest.mark.parametrize("k,stride,pads,out_pad,group", DECONVS, ids=[f"k{d[0]}s{d[1]}g{d[4]}" for d in DECONVS])
def test_deconvolution(k: int, stride: int, pads: tuple, out_pad: tuple, group: int) -> None:
    """ConvTranspose runs as conv_enable 5 (7 depthwise) over the stride-spread input, rotated kernel packed."""
    g = _graph(c=8, h=5, w=6)
    rng = np.random.default_rng(k * 10 + stride + group)
    m = 8 if group == 8 else 12
    g.add_const("dw", (rng.standard_normal((8, m // group, k, k)) * 0.3).astype(np.float32))
    g.add_const("db", rng.standard_normal(m).astype(np.float32) * 0.1)
    attrs = ConvTranspose2d((stride, stride), pads, group=group, output_padding=out_pad, act=Activation("relu"))
    g.add_op("conv_transpose2d", ["x", "dw", "db"], ["y"], attrs)
    g.outputs = ["y"]
    for quantized, threshold in ((False, 0.9995), (True, 0.99)):
        net, blob = _check(g, quantized=quantized, threshold=threshold)
        run = net.layers[0].conv.runs[0]
        assert run.conv_enable == (7 if group == 8 else 5) and run.conv_stride == stride * 0x101
        assert net.layers[0].output_dim == [g.shape("y")[3], g.shape("y")[2], m]
        left = k - 1 - pads[1]
        assert run.conv_pad == pack4(left, k - 1 - pads[3] + out_pad[1], k - 1 - pads[0], k - 1 - pads[2] + out_pad[0])
        cg = 1 if group == 8 else 8
        assert run.weight_size == len(blob) == wp.conv_weight_size(m, cg, k, k, quantized=quantized)
    decoded = wp.unpack_conv(blob, m, cg, k, k, quantized=True).weight
    rotated = g.const("dw")[:, :, ::-1, ::-1].transpose(*((1, 0, 2, 3) if group == 1 else (0, 1, 2, 3)))
    wp.reset_kmeans_seed()  # as the build: the LUT is clustered from OpenCV's initial state
    lut, idx = wp.cluster_lut(wp.stored_kernels(rotated))
    p = wp.effective_kernel(k, k)
    assert np.array_equal(decoded, lut.astype(np.float32)[idx][:, :, p - k :, :k])  # the rotated kernel is packed


def test_deconv_errors() -> None:
    g = _graph(c=8)
    g.add_const("dw", np.ones((8, 4, 3, 3), np.float32))
    g.add_op("conv_transpose2d", ["x", "dw"], ["y"], ConvTranspose2d((2, 2), (3, 3, 3, 3)))
    g.outputs = ["y"]
    with pytest.raises(UserError, match=r"deconv 'y': pads \[3, 3, 3, 3\] with a 3x3 kernel need HW pads"):
        lower_graph(g, name="t", quantized=False)


ACTS = [
    (Activation("relu"), 2, 0x0000),
    (Activation("leaky_relu", alpha=0.1), 2, 0x2E66),
    (Activation("clip", lo=0.0, hi=6.0), 6, 0),
    (Activation("sigmoid"), 3, 0),
    (Activation("tanh"), 1, 0),
    (Activation("elu", alpha=1.0), 5, 0),
]


@pytest.mark.parametrize("act,code,param", ACTS, ids=[a[0].kind + str(a[0].alpha) for a in ACTS])
def test_activation_codes(act: Activation, code: int, param: int) -> None:
    g = _graph(c=8)
    _conv(g, "x", "y", 8, 3, code, pads=(1, 1, 1, 1), act=act)
    g.outputs = ["y"]
    net, _ = _check(g)
    run = net.layers[0].conv.runs[0]
    assert (run.actfunc, run.actfunc_param) == (code, param)


def test_prelu_stays_fp16_in_8bit_mode() -> None:
    """The driver rejects 8-bit weights with PReLU: that run keeps fp16 weights with its slopes, the rest go 8-bit."""
    g = _graph(c=8)
    _conv(g, "x", "a", 16, 3, 5, pads=(1, 1, 1, 1))
    g.add_const("slope", np.linspace(0.05, 0.4, 16, dtype=np.float32).reshape(1, 16, 1, 1))
    g.add_op("prelu", ["a", "slope"], ["p"], PRelu())
    _conv(g, "p", "y", 8, 1, 6)
    g.outputs = ["y"]
    net, blob = _check(g, quantized=True, threshold=0.99)
    first, second = (layer.conv.runs[0] for layer in net.layers)
    assert (first.actfunc, first.weight_fmt, second.weight_fmt) == (4, 1, 3)
    assert first.weight_size == 144 * 16 * 1 + 16 * 2 + 16 * 2  # fp16 3x3, bias blocks, PReLU slope blocks
    assert second.weight_offs == first.weight_size and second.weight_size == 512 + 72 * 8 + 16  # 8-bit 1x1
    slopes = wp.unpack_conv(blob[: first.weight_size], 16, 8, 3, 3, quantized=False, prelu=True).prelu
    assert np.array_equal(slopes, np.linspace(0.05, 0.4, 16, dtype=np.float32).astype(np.float16).astype(np.float32))


def test_resnet50_stem_offsets_8bit() -> None:
    """A stem shaped like the vendor ResNet50 (7x7 3->64 s2 + max pool, 1x1 64->64, 3x3 64->64): in 8-bit mode
    the vendor's generated code puts the second and third weights at 14464 and 19712."""
    g = _graph(c=3, h=32, w=32)
    _conv(g, "x", "c1", 64, 7, 1, pads=(3, 3, 3, 3), strides=(2, 2), act=Activation("relu"))
    g.add_op("pool2d", ["c1"], ["p1"], Pool2d("max", (3, 3), (2, 2), pads=(1, 1, 1, 1)))
    _conv(g, "p1", "c2", 64, 1, 2, act=Activation("relu"))
    _conv(g, "c2", "y", 64, 3, 3, pads=(1, 1, 1, 1))
    g.outputs = ["y"]
    net, blob = lower_graph(g, name="t", quantized=True)
    runs = [r for layer in net.layers if layer.conv for r in layer.conv.runs if r.weight_size]
    assert [r.weight_offs for r in runs] == [0, 14464, 19712]
    assert len(blob) == 19712 + 512 + 72 * 64 * 8 + 16 * 8


def test_zero_padding_merges_into_the_conv() -> None:
    g = _graph(c=8)
    g.add_tensor("xp", (1, 8, 15, 12))
    g.add_op("pad", ["x"], ["xp"], Pad((0, 0, 2, 1, 0, 0, 1, 1)))
    _conv(g, "xp", "y", 8, 3, 4)
    g.outputs = ["y"]
    ref = interp.run(g, {"x": np.ones(g.shape("x"), np.float32)})["y"]
    canonicalize(g)
    net, _ = _check(g)
    assert [layer.conv.runs[0].conv_pad for layer in net.layers] == [pack4(1, 1, 2, 1)]  # left right top bottom
    assert net.layers[0].output_dim == [ref.shape[3], ref.shape[2], 8]


def test_standalone_batchnorm_and_activation_become_dummy_depthwise() -> None:
    """A BN with no conv before it (and a bare activation) runs as a 1x1 depthwise conv, weights = BN scale."""
    g = _graph(c=8)
    scale = np.linspace(0.5, 2.0, 8, dtype=np.float32)
    g.add_const("s", scale)
    g.add_const("b", np.full(8, 0.25, np.float32))
    g.add_op("channel_scale", ["x", "s", "b"], ["n"], ChannelScale())
    g.add_op("activation", ["n"], ["y"], ActivationOp(Activation("tanh")))
    g.outputs = ["y"]
    net, blob = _check(g)
    run = net.layers[0].conv.runs[0]
    assert len(net.layers) == 1 and (run.conv_enable, run.p, run.m, run.actfunc) == (3, 1, 8, 1)
    packed = wp.unpack_conv(blob, 8, 1, 1, 1, quantized=False)
    assert np.array_equal(packed.weight.reshape(8), scale.astype(np.float16).astype(np.float32))
    assert np.array_equal(packed.bias, np.full(8, 0.25, np.float32))
