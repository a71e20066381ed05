"""DV700 lowering and the driver's validation rules (spec §1.7), checked on small IR graphs."""

from __future__ import annotations

import numpy as np
import pytest
from npuc.backends.dmp.layers import ConvConf, Layer, Run, pack2, pack4
from npuc.backends.dmp.lower import lower_graph
from npuc.backends.dmp.sim import run_network
from npuc.backends.dmp.validate import check_layer
from npuc.compiler import interp
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph
from npuc.compiler.ops import Activation, Conv2d, Eltwise, GlobalPool, Pool2d, Resize


def _layer(runs: list[Run], c: int = 16, w: int = 8, h: int = 8, topo: int | None = None) -> Layer:
    conf = ConvConf(w=w, h=h, c=c, runs=runs, topo=topo if topo is not None else 1 << (len(runs) - 1))
    return Layer("probe", "LT_CONV", 0, 0, 0, [w, h, c], [w, h, c], conv=conf)


def _conv_run(**kw: int) -> Run:
    return Run(**{"m": 16, "conv_enable": 1, "p": 3, "conv_pad": pack4(1, 1, 1, 1), **kw})


RULES = [
    ("topo is 0", _layer([_conv_run()], topo=0)),
    ("depth z is 0", Layer("probe", "LT_CONV", 0, 0, 0, [], [], conv=ConvConf(8, 8, 16, [_conv_run()], z=0))),
    ("does nothing", _layer([Run(m=16)])),
    ("kernel 9x9", _layer([_conv_run(p=9)])),
    ("stride 0x1", _layer([_conv_run(conv_stride=pack2(0, 1))])),
    ("smaller than the 7x7", _layer([_conv_run(p=7, conv_pad=0)], w=4, h=4)),
    ("depthwise", _layer([_conv_run(conv_enable=3, m=8)])),
    ("own run", _layer([_conv_run(pool_enable=2, pool_size=pack2(2, 2))])),
    ("max pool 4x4", _layer([_conv_run(pool_enable=1, pool_size=pack2(4, 4))])),
    ("average pool 8x8", _layer([Run(m=16, pool_enable=2, pool_size=pack2(8, 8))])),
    ("multiple of 16", _layer([Run(m=12, lrn=1)], c=12)),
    ("standalone", _layer([Run(m=16, lrn=1, pool_enable=1, pool_size=pack2(2, 2))])),
    ("only run", _layer([_conv_run(conv_dilation=pack2(2, 2), conv_pad=pack4(2, 2, 2, 2)), Run(m=16, actfunc=2)])),
    ("odd kernel", _layer([_conv_run(p=4, conv_dilation=pack2(2, 2))])),
    ("'same' padding", _layer([_conv_run(conv_dilation=pack2(2, 2))])),
    ("cannot use PReLU", _layer([_conv_run(conv_dilation=pack2(2, 2), conv_pad=pack4(2, 2, 2, 2), actfunc=4)])),
    ("8-bit quantized weights cannot be combined with PReLU", _layer([_conv_run(weight_fmt=3, actfunc=4)])),
    ("does not match", _layer([_conv_run(), _conv_run()], topo=1)),
    ("exceeds the DV700 limit 2047", _layer([_conv_run()], w=4000)),
]


@pytest.mark.parametrize("fragment,layer", RULES, ids=[r[0] for r in RULES])
def test_validation_rule(fragment: str, layer: Layer) -> None:
    with pytest.raises(UserError, match=fragment) as info:
        check_layer(3, layer)
    assert "DMP layer 3 'probe'" in str(info.value)


def test_valid_layer_passes() -> None:
    check_layer(0, _layer([_conv_run(pool_enable=1, pool_size=pack2(2, 2), pool_stride=pack2(2, 2), actfunc=2)]))


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
    assert len(net.layers) == 1
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
