"""Float reference kernels, checked op by op against onnxruntime / onnx.reference.

Each case builds a one-op IR graph by hand and the equivalent ONNX model, runs both on the same random
data, and requires the outputs to agree: exactly for data movement, and for arithmetic to within 1e-5 of
the reference's magnitude (|got - want| <= 1e-5 * (|want| + max|want|)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_cases import assert_close, ir_outputs, onnx_outputs, rand
from onnx import helper

from npuc.compiler import ops as O
from npuc.compiler.kernels.activation import erf

# ---------------------------------------------------------------------------------------------------------
# erf and activations
# ---------------------------------------------------------------------------------------------------------


def test_erf_matches_math_erf() -> None:
    x = np.concatenate([np.linspace(-7, 7, 20001), np.geomspace(1e-8, 1, 200), [0.0, 2.999, 3.0, 3.001]])
    want = np.array([math.erf(v) for v in x])
    got = erf(x.astype(np.float64)).astype(np.float64)
    assert np.max(np.abs(got - want)) < 1e-10
    assert erf(np.float64(0.25)).shape == () and np.isnan(erf(np.array([np.nan]))[0])
    # small arguments are accurate relatively too (the series path)
    small = np.abs(x) < 0.5
    nz = small & (x != 0)
    assert np.max(np.abs(got[nz] - want[nz]) / np.abs(want[nz])) < 1e-12
    got32 = erf(x.astype(np.float32))
    assert got32.dtype == np.float32
    assert np.max(np.abs(got32.astype(np.float64) - want)) < 1e-6


ACTIVATIONS = [
    (O.Activation("relu"), [helper.make_node("Relu", ["x"], ["y"])], {}),
    (O.Activation("leaky_relu", alpha=0.1), [helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.1)], {}),
    (
        O.Activation("clip", lo=-0.5, hi=0.75),
        [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])],
        {"lo": np.array(-0.5, np.float32), "hi": np.array(0.75, np.float32)},
    ),
    (
        O.Activation("clip", lo=0.0, hi=6.0),
        [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])],
        {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)},
    ),  # fmt: skip
    (O.Activation("sigmoid"), [helper.make_node("Sigmoid", ["x"], ["y"])], {}),
    (O.Activation("tanh"), [helper.make_node("Tanh", ["x"], ["y"])], {}),
    (
        O.Activation("hard_sigmoid", alpha=0.3, beta=0.4),
        [helper.make_node("HardSigmoid", ["x"], ["y"], alpha=0.3, beta=0.4)],
        {},
    ),
    (O.Activation("hard_swish"), [helper.make_node("HardSwish", ["x"], ["y"])], {}),
    (O.Activation("gelu"), [helper.make_node("Gelu", ["x"], ["y"])], {}),
    (
        O.Activation("gelu", approximate="tanh"),
        [helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")],
        {},
    ),
    (O.Activation("erf"), [helper.make_node("Erf", ["x"], ["y"])], {}),
    (O.Activation("elu", alpha=0.7), [helper.make_node("Elu", ["x"], ["y"], alpha=0.7)], {}),
]


@pytest.mark.parametrize("act,nodes,consts", ACTIVATIONS, ids=lambda v: getattr(v, "kind", ""))
def test_activation(act: O.Activation, nodes, consts) -> None:
    x = rand(2, 3, 5, 7) * 4
    x[0, 0, 0, :3] = [100.0, -100.0, 0.0]  # saturation and zero
    want = onnx_outputs(nodes, {"x": x}, consts, opset=20)[0]
    got = ir_outputs("activation", O.ActivationOp(act), {"x": x})[0]
    assert_close(got, want)


def test_relu_and_clip_keep_integer_dtype() -> None:
    x = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    assert_close(ir_outputs("activation", O.ActivationOp(O.Activation("relu")), {"x": x})[0], np.maximum(x, 0))
    got = ir_outputs("activation", O.ActivationOp(O.Activation("clip", lo=-2.5, hi=3.0)), {"x": x})[0]
    want = onnx_outputs(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])],
        {"x": x},
        {"lo": np.array(-2, np.int32), "hi": np.array(3, np.int32)},
    )[0]
    assert_close(got, want)


# ---------------------------------------------------------------------------------------------------------
# convolution
# ---------------------------------------------------------------------------------------------------------

CONV_CASES = [
    # (in_ch, out_ch, group, kernel, strides, pads, dilations)
    (4, 6, 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (4, 6, 1, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1)),
    (4, 6, 2, (3, 3), (2, 1), (1, 0, 2, 1), (1, 1)),
    (4, 8, 4, (3, 3), (1, 1), (1, 1, 1, 1), (2, 2)),
    (6, 6, 6, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # depthwise
    (3, 6, 3, (5, 3), (1, 2), (2, 1, 0, 3), (1, 2)),  # depthwise multiplier 2, asymmetric
    (4, 4, 1, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    (2, 3, 1, (2, 4), (3, 2), (0, 2, 1, 0), (2, 1)),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(case, bias: bool) -> None:
    c, oc, g, k, s, p, d = case
    x = rand(2, c, 9, 10)
    consts = {"w": rand(oc, c // g, *k, seed=1)}
    if bias:
        consts["b"] = rand(oc, seed=2)
    node = helper.make_node("Conv", ["x", *consts], ["y"], strides=s, pads=p, dilations=d, group=g)
    want = onnx_outputs([node], {"x": x}, consts)[0]
    got = ir_outputs("conv2d", O.Conv2d(s, p, d, g), {"x": x}, consts)[0]
    assert_close(got, want)


def test_conv2d_fused_activation() -> None:
    x = rand(1, 3, 6, 6)
    consts = {"w": rand(4, 3, 3, 3, seed=1), "b": rand(4, seed=2)}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["y"]),
    ]
    bounds = {"lo": np.array(0, np.float32), "hi": np.array(1, np.float32)}
    want = onnx_outputs(nodes, {"x": x}, {**consts, **bounds})[0]
    got = ir_outputs("conv2d", O.Conv2d(pads=(1, 1, 1, 1), act=O.Activation("clip", lo=0, hi=1)), {"x": x}, consts)
    assert_close(got[0], want)
    assert got[0].min() == 0.0 and got[0].max() == 1.0


CONV_T_CASES = [
    # (in_ch, out_per_group, group, kernel, strides, pads, dilations, output_padding)
    (4, 3, 1, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), (0, 0)),
    (4, 3, 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1)),
    (4, 2, 2, (4, 4), (2, 2), (1, 1, 1, 1), (1, 1), (0, 0)),
    (3, 1, 3, (3, 2), (3, 2), (0, 1, 2, 0), (2, 1), (1, 0)),
    (2, 3, 1, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), (0, 0)),
]


@pytest.mark.parametrize("case", CONV_T_CASES)
def test_conv_transpose2d(case) -> None:
    c, ocg, g, k, s, p, d, op_ = case
    x = rand(2, c, 5, 4)
    consts = {"w": rand(c, ocg, *k, seed=1), "b": rand(ocg * g, seed=2)}
    node = helper.make_node(
        "ConvTranspose", ["x", "w", "b"], ["y"], strides=s, pads=p, dilations=d, group=g, output_padding=op_
    )
    want = onnx_outputs([node], {"x": x}, consts)[0]
    got = ir_outputs("conv_transpose2d", O.ConvTranspose2d(s, p, d, g, op_), {"x": x}, consts)[0]
    assert_close(got, want)


# ---------------------------------------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------------------------------------

POOL_CASES = [
    # (kernel, strides, pads, dilations, ceil_mode)
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False),
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True),
    ((3, 2), (2, 3), (0, 1, 1, 0), (1, 1), True),
    ((3, 3), (1, 1), (1, 1, 1, 1), (2, 2), False),
    ((2, 3), (2, 2), (1, 0, 0, 1), (2, 1), True),
    ((3, 3), (3, 3), (0, 0, 0, 0), (1, 1), True),
]


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool(case) -> None:
    k, s, p, d, ceil = case
    x = rand(2, 3, 9, 8)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=k, strides=s, pads=p, dilations=d, ceil_mode=ceil)
    want = onnx_outputs([node], {"x": x})[0]
    got = ir_outputs("pool2d", O.Pool2d("max", k, s, p, d, ceil), {"x": x})[0]
    assert_close(got, want, rtol=0)


@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize("case", POOL_CASES)
def test_avg_pool(case, include_pad: bool) -> None:
    k, s, p, d, ceil = case
    x = rand(2, 3, 9, 8)
    node = helper.make_node(
        "AveragePool", ["x"], ["y"], kernel_shape=k, strides=s, pads=p, dilations=d, ceil_mode=ceil,
        count_include_pad=int(include_pad),
    )  # fmt: skip
    want = onnx_outputs([node], {"x": x}, opset=19)[0]
    got = ir_outputs("pool2d", O.Pool2d("avg", k, s, p, d, ceil, include_pad), {"x": x})[0]
    assert_close(got, want)


def test_max_pool_int8() -> None:
    x = np.random.default_rng(0).integers(-128, 128, (1, 2, 5, 5)).astype(np.int8)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    want = onnx_outputs([node], {"x": x})[0]
    got = ir_outputs("pool2d", O.Pool2d("max", (3, 3), (2, 2), (1, 1, 1, 1)), {"x": x})[0]
    assert_close(got, want)


@pytest.mark.parametrize("mode,op_type", [("avg", "GlobalAveragePool"), ("max", "GlobalMaxPool")])
def test_global_pool(mode: str, op_type: str) -> None:
    x = rand(2, 5, 7, 6)
    want = onnx_outputs([helper.make_node(op_type, ["x"], ["y"])], {"x": x})[0]
    assert_close(ir_outputs("global_pool", O.GlobalPool(mode), {"x": x})[0], want)


# ---------------------------------------------------------------------------------------------------------
# elementwise arithmetic, gemm, matmul
# ---------------------------------------------------------------------------------------------------------

ELTWISE = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max", "min": "Min", "pow": "Pow"}
BROADCASTS = [
    ((2, 3, 4, 5), (2, 3, 4, 5)),
    ((2, 3, 4, 5), (3, 1, 1)),
    ((1, 3, 1, 5), (2, 1, 4, 1)),
    ((4, 5), ()),
]


@pytest.mark.parametrize("shapes", BROADCASTS)
@pytest.mark.parametrize("kind", sorted(ELTWISE))
def test_eltwise_float(kind: str, shapes) -> None:
    a, b = rand(*shapes[0]), rand(*shapes[1], seed=1)
    if kind == "pow":
        a = np.abs(a) + 0.1
    if kind == "div":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    want = onnx_outputs([helper.make_node(ELTWISE[kind], ["a", "b"], ["y"])], {"a": a, "b": b})[0]
    assert_close(ir_outputs("eltwise", O.Eltwise(kind), {"a": a, "b": b})[0], want)


@pytest.mark.parametrize("kind", ["add", "sub", "mul", "div", "max", "min", "pow"])
def test_eltwise_int(kind: str) -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(-20, 20, (3, 8)).astype(np.int32)
    b = rng.integers(1, 6, (8,)).astype(np.int32) * np.array([1, -1] * 4, np.int32)
    if kind == "pow":
        a, b = np.abs(a) % 5, np.abs(b) % 4
    feeds = {"a": a, "b": b}
    want = onnx_outputs([helper.make_node(ELTWISE[kind], ["a", "b"], ["y"])], feeds)[0]
    assert_close(ir_outputs("eltwise", O.Eltwise(kind), feeds)[0], want)


def test_integer_div_truncates_toward_zero() -> None:
    a, b = np.array([7, -7, 7, -7, 6], np.int64), np.array([2, 2, -2, -2, -3], np.int64)
    got = ir_outputs("eltwise", O.Eltwise("div"), {"a": a, "b": b})[0]
    np.testing.assert_array_equal(got, [3, -3, -3, 3, -2])


def test_pow_float_base_int_exponent() -> None:
    a, b = rand(3, 4), np.array([2, 3, 0, 1], np.int64)
    want = onnx_outputs([helper.make_node("Pow", ["a", "b"], ["y"])], {"a": a, "b": b})[0]
    assert_close(ir_outputs("eltwise", O.Eltwise("pow"), {"a": a, "b": b})[0], want)


@pytest.mark.parametrize("kind,op_type", [("add", "Sum"), ("max", "Max"), ("min", "Min")])
def test_eltwise_nary_with_act(kind: str, op_type: str) -> None:
    feeds = {"a": rand(2, 3, 4), "b": rand(3, 1, seed=1), "c": rand(1, 4, seed=2)}
    nodes = [helper.make_node(op_type, list(feeds), ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    want = onnx_outputs(nodes, feeds)[0]
    assert_close(ir_outputs("eltwise", O.Eltwise(kind, act=O.Activation("relu")), feeds)[0], want)


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("alpha,beta,c_shape", [(1.0, 1.0, (6,)), (0.5, 2.0, (4, 6)), (1.5, 1.0, None)])
def test_gemm(trans_a: bool, trans_b: bool, alpha: float, beta: float, c_shape) -> None:
    a = rand(*((5, 4) if trans_a else (4, 5)))
    consts = {"w": rand(*((6, 5) if trans_b else (5, 6)), seed=1)}
    if c_shape:
        consts["c"] = rand(*c_shape, seed=2)
    node = helper.make_node(
        "Gemm", ["a", *consts], ["y"], transA=int(trans_a), transB=int(trans_b), alpha=alpha, beta=beta
    )
    want = onnx_outputs([node], {"a": a}, consts)[0]
    assert_close(ir_outputs("gemm", O.Gemm(trans_a, trans_b, alpha, beta), {"a": a}, consts)[0], want)


@pytest.mark.parametrize(
    "sa,sb",
    [((4, 5), (5, 3)), ((2, 4, 5), (5, 3)), ((2, 1, 4, 5), (3, 5, 2)), ((5,), (5, 3)), ((2, 4, 5), (5,))],
)
def test_matmul(sa, sb) -> None:
    feeds = {"a": rand(*sa), "b": rand(*sb, seed=1)}
    want = onnx_outputs([helper.make_node("MatMul", ["a", "b"], ["y"])], feeds)[0]
    assert_close(ir_outputs("matmul", O.MatMul(), feeds)[0], want)


def test_prelu_per_channel() -> None:
    x, slope = rand(2, 4, 3, 3), rand(4, 1, 1, seed=1)
    want = onnx_outputs([helper.make_node("PRelu", ["x", "s"], ["y"])], {"x": x}, {"s": slope})[0]
    assert_close(ir_outputs("prelu", O.PRelu(), {"x": x}, {"s": slope})[0], want)


def test_channel_scale_matches_batchnorm() -> None:
    x = rand(2, 4, 3, 5)
    gamma, beta, mean = rand(4, seed=1), rand(4, seed=2), rand(4, seed=3)
    var = np.abs(rand(4, seed=4)) + 0.5
    eps = 1e-5
    node = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], epsilon=eps)
    want = onnx_outputs([node], {"x": x}, {"g": gamma, "b": beta, "m": mean, "v": var})[0]
    scale = (gamma / np.sqrt(var.astype(np.float64) + eps)).astype(np.float32)
    bias = (beta - mean * scale).astype(np.float32)
    got = ir_outputs("channel_scale", O.ChannelScale(axis=1), {"x": x}, {"s": scale, "t": bias})[0]
    assert_close(got, want)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_softmax(axis: int) -> None:
    x = rand(2, 3, 5) * 5
    want = onnx_outputs([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], {"x": x}, opset=13)[0]
    assert_close(ir_outputs("softmax", O.Softmax(axis), {"x": x})[0], want)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_coerce_2d(axis: int) -> None:
    x = rand(2, 3, 5) * 5
    want = onnx_outputs([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], {"x": x}, opset=11)[0]
    assert_close(ir_outputs("softmax", O.Softmax(axis, coerce_2d=True), {"x": x})[0], want)
