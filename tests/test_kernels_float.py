"""Float reference kernels, checked op by op against onnxruntime / onnx.reference.

Each case builds a one-op IR graph by hand and the equivalent ONNX model, runs both on the same random
data, and requires the outputs to agree: exactly for data movement, and for arithmetic to within 1e-5 of
the reference's magnitude (|got - want| <= 1e-5 * (|want| + max|want|)).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from npuc.compiler import ops as O
from npuc.compiler.errors import UserError
from npuc.compiler.interp import run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels import FLOAT_KERNELS
from npuc.compiler.kernels.activation import erf

RTOL = 1e-5


# ---------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------


def onnx_outputs(
    nodes: list[onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    consts: dict[str, np.ndarray] | None = None,
    outputs: tuple[str, ...] = ("y",),
    out_dtype: np.dtype | None = None,
    opset: int = 18,
    engine: str = "ort",
) -> list[np.ndarray]:
    """Run a tiny ONNX graph (nodes over feeds + initializers) with onnxruntime or the ONNX reference."""
    consts = consts or {}
    elem = helper.np_dtype_to_tensor_dtype(out_dtype or next(iter(feeds.values())).dtype)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info(name, elem, None) for name in outputs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    if engine == "ref":
        return list(ReferenceEvaluator(model).run(None, feeds))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def ir_outputs(
    kind: str,
    attrs: object,
    feeds: dict[str, np.ndarray],
    consts: dict[str, np.ndarray] | None = None,
    outputs: tuple[str, ...] = ("y",),
    inputs: list[str] | None = None,
) -> list[np.ndarray]:
    """Run a one-op IR graph through the interpreter."""
    g = Graph()
    for name, value in feeds.items():
        g.add_tensor(name, value.shape, str(value.dtype))
        g.inputs.append(name)
    for name, value in (consts or {}).items():
        g.add_const(name, value)
    g.add_op(kind, inputs or [*feeds, *(consts or {})], list(outputs), attrs)
    g.outputs = list(outputs)
    g.verify()
    result = run(g, feeds)
    return [result[name] for name in outputs]


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = RTOL) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.size == 0:
        return
    if not np.issubdtype(want.dtype, np.floating):
        np.testing.assert_array_equal(got, want)
        return
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    scale = float(np.max(np.abs(want[finite]))) if finite.any() else 0.0
    err = np.abs(got[finite].astype(np.float64) - want[finite])
    bound = rtol * (np.abs(want[finite].astype(np.float64)) + scale) + 1e-30
    assert np.all(err <= bound), f"max error {err.max():.3g}, worst ratio {np.max(err / bound):.3g}"


def rand(*shape: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------------------
# erf and activations
# ---------------------------------------------------------------------------------------------------------


def test_erf_matches_math_erf() -> None:
    x = np.concatenate([np.linspace(-7, 7, 20001), np.geomspace(1e-8, 1, 200), [0.0, 2.999, 3.0, 3.001]])
    want = np.array([math.erf(v) for v in x])
    got = erf(x.astype(np.float64)).astype(np.float64)
    assert np.max(np.abs(got - want)) < 1e-8
    # small arguments are accurate relatively too (the series path)
    small = np.abs(x) < 1
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


# ---------------------------------------------------------------------------------------------------------
# data movement and reductions
# ---------------------------------------------------------------------------------------------------------


def test_concat_reshape_transpose() -> None:
    feeds = {"a": rand(2, 3, 4), "b": rand(2, 1, 4, seed=1)}
    want = onnx_outputs([helper.make_node("Concat", ["a", "b"], ["y"], axis=1)], feeds)[0]
    assert_close(ir_outputs("concat", O.Concat(1), feeds)[0], want, rtol=0)
    x = rand(2, 3, 4)
    assert_close(ir_outputs("reshape", O.Reshape((4, 6)), {"x": x})[0], x.reshape(4, 6), rtol=0)
    want = onnx_outputs([helper.make_node("Transpose", ["x"], ["y"], perm=[2, 0, 1])], {"x": x})[0]
    got = ir_outputs("transpose", O.Transpose((2, 0, 1)), {"x": x})[0]
    assert_close(got, want, rtol=0)
    assert got.flags.c_contiguous


SLICES = [
    ((1,), (3,), (1,), (1,)),
    ((0, -1), (2**31, 0), (0, 2), (1, -1)),
    ((-3, 5), (-1, 0), (2, 1), (1, -2)),
    ((0,), (-(2**31),), (1,), (-1,)),
    ((1, 0), (100, 4), (-1, -3), (2, 3)),
]


@pytest.mark.parametrize("case", SLICES)
def test_slice(case) -> None:
    starts, ends, axes, steps = case
    x = rand(3, 4, 6)
    consts = {k: np.array(v, np.int64) for k, v in zip(("s", "e", "a", "t"), case, strict=True)}
    want = onnx_outputs([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], {"x": x}, consts)[0]
    got = ir_outputs("slice", O.Slice(starts, ends, tuple(a % 3 for a in axes), steps), {"x": x})[0]
    assert_close(got, want, rtol=0)


def test_split() -> None:
    x = rand(2, 7, 3)
    node = helper.make_node("Split", ["x", "sz"], ["y0", "y1", "y2"], axis=1)
    want = onnx_outputs([node], {"x": x}, {"sz": np.array([2, 4, 1], np.int64)}, outputs=("y0", "y1", "y2"))
    got = ir_outputs("split", O.Split(1, (2, 4, 1)), {"x": x}, outputs=("y0", "y1", "y2"))
    for g_, w_ in zip(got, want, strict=True):
        assert_close(g_, w_, rtol=0)


PADS = [(0, 1, 2, 1, 0, 2), (1, 0, 0, 0, 3, 1), (2, 2, 2, 2, 2, 2)]
PAD_CASES = [(m, p) for m in ("constant", "reflect", "edge", "wrap") for p in PADS] + [
    ("constant", (0, 2, -1, 0, -1, 2)),  # negative pads crop
]


@pytest.mark.parametrize("mode,pads", PAD_CASES)
def test_pad(mode: str, pads) -> None:
    x = rand(3, 4, 5)
    consts = {"p": np.array(pads, np.int64), "v": np.array(1.5, np.float32)}
    node = helper.make_node("Pad", ["x", "p", "v"], ["y"], mode=mode)
    want = onnx_outputs([node], {"x": x}, consts, opset=19)[0]
    got = ir_outputs("pad", O.Pad(pads, mode, 1.5), {"x": x})[0]
    assert_close(got, want, rtol=0)


@pytest.mark.parametrize("axis,idx", [(0, [[0, 2], [-1, 1]]), (1, [3, 0, -4]), (2, 1), (-1, [[-1]])])
def test_gather(axis: int, idx) -> None:
    x = rand(3, 4, 5)
    consts = {"i": np.array(idx, np.int64)}
    want = onnx_outputs([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], {"x": x}, consts)[0]
    assert_close(ir_outputs("gather", O.Gather(axis % 3), {"x": x}, consts)[0], want, rtol=0)


def test_gather_out_of_range_is_user_error() -> None:
    with pytest.raises(UserError, match="index out of range"):
        ir_outputs("gather", O.Gather(0), {"x": rand(3, 2)}, {"i": np.array([3], np.int64)})


@pytest.mark.parametrize("src,shape", [((3, 1), (2, 3, 4)), ((1,), (5,)), ((2, 1, 3), (1, 4, 1))])
def test_expand(src, shape) -> None:
    x = rand(*src)
    consts = {"s": np.array(shape, np.int64)}
    want = onnx_outputs([helper.make_node("Expand", ["x", "s"], ["y"])], {"x": x}, consts)[0]
    assert_close(ir_outputs("expand", O.Expand(shape), {"x": x})[0], want, rtol=0)


@pytest.mark.parametrize("to", ["int32", "int64", "float16", "bool", "uint8", "float32"])
def test_cast(to: str) -> None:
    x = np.array([[-2.7, -0.5, 0.0, 0.4, 1.5, 3.99, 100.2, 7.0]], np.float32)
    if to == "uint8":
        x = np.abs(x)
    node = helper.make_node("Cast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(to)))
    want = onnx_outputs([node], {"x": x}, out_dtype=np.dtype(to))[0]
    assert_close(ir_outputs("cast", O.Cast(to), {"x": x})[0], want, rtol=0)


def test_cast_int_to_float() -> None:
    x = np.array([-3, 0, 2**20 + 1], np.int64)
    assert_close(ir_outputs("cast", O.Cast("float32"), {"x": x})[0], x.astype(np.float32), rtol=0)


REDUCE_OPS = {"mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "sum": "ReduceSum"}


@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("axes", [(1,), (0, 2), (1, 2, 3)])
@pytest.mark.parametrize("kind", sorted(REDUCE_OPS))
def test_reduce(kind: str, axes, keepdims: bool) -> None:
    x = rand(2, 3, 4, 5)
    node = helper.make_node(REDUCE_OPS[kind], ["x", "a"], ["y"], keepdims=int(keepdims))
    want = onnx_outputs([node], {"x": x}, {"a": np.array(axes, np.int64)})[0]
    assert_close(ir_outputs("reduce", O.Reduce(kind, axes, keepdims), {"x": x})[0], want)


def test_reduce_int_mean_truncates() -> None:
    x = np.array([[1, 2], [3, 5], [-3, -4]], np.int32)
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)
    want = onnx_outputs([node], {"x": x}, opset=13)[0]
    got = ir_outputs("reduce", O.Reduce("mean", (1,), False), {"x": x})[0]
    assert_close(got, want)
    np.testing.assert_array_equal(got, [1, 4, -3])


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_lrn(size: int) -> None:
    x = rand(2, 6, 3, 4)
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=2e-3, beta=0.6, bias=1.5)
    if size % 2:
        want = onnx_outputs([node], {"x": x})[0]
    else:  # onnxruntime rejects even sizes (and onnx.reference loops over N, not C): use the spec formula
        lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
        sq = np.stack([np.sum(x[:, max(0, c - lo) : c + hi + 1] ** 2, axis=1) for c in range(6)], axis=1)
        want = (x / (1.5 + 2e-3 / size * sq) ** 0.6).astype(np.float32)
    assert_close(ir_outputs("lrn", O.LRN(size, 2e-3, 0.6, 1.5), {"x": x})[0], want)


# ---------------------------------------------------------------------------------------------------------
# resize
# ---------------------------------------------------------------------------------------------------------


def resize_pair(
    x: np.ndarray, mode: str, coord: str, *, scales=None, sizes=None, roi=None, engine: str = "ort", **kw
) -> tuple[np.ndarray, np.ndarray]:
    """(ours, reference) for one ONNX Resize node given scales or sizes."""
    consts = {"roi": np.array(roi or [], np.float32)}
    if scales is not None:
        consts["scales"] = np.array(scales, np.float32)
        inputs = ["x", "roi", "scales"]
        out = tuple(int(d * s) for d, s in zip(x.shape, consts["scales"], strict=True))
        used = tuple(float(s) for s in consts["scales"])
    else:
        consts["sizes"] = np.array(sizes, np.int64)
        inputs, out, used = ["x", "roi", "", "sizes"], tuple(sizes), ()
    onnx_kw = {"coordinate_transformation_mode": coord, "mode": mode, **kw}
    want = onnx_outputs(
        [helper.make_node("Resize", inputs, ["y"], **onnx_kw)], {"x": x}, consts, opset=19, engine=engine
    )[0]
    attrs = O.Resize(
        out, used, mode, coord, kw.get("nearest_mode", "round_prefer_floor"), kw.get("cubic_coeff_a", -0.75),
        bool(kw.get("exclude_outside", 0)), kw.get("extrapolation_value", 0.0), tuple(roi or ()),
        bool(kw.get("antialias", 0)),
    )  # fmt: skip
    return ir_outputs("resize", attrs, {"x": x})[0], want


RESIZE_COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
RESIZE_TARGETS = [
    {"scales": [1, 1, 2, 3]},
    {"scales": [1, 1, 0.6, 0.5]},
    {"scales": [1, 1, 1.7, 1.25]},
    {"sizes": [1, 2, 8, 4]},
    {"sizes": [1, 2, 3, 1]},
]


@pytest.mark.parametrize("target", RESIZE_TARGETS, ids=str)
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("coord", [*RESIZE_COORDS, "tf_half_pixel_for_nn"])
def test_resize_nearest(coord: str, nearest_mode: str, target) -> None:
    got, want = resize_pair(rand(1, 2, 5, 6), "nearest", coord, nearest_mode=nearest_mode, **target)
    assert_close(got, want, rtol=0)


@pytest.mark.parametrize("target", RESIZE_TARGETS, ids=str)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coord", RESIZE_COORDS)
def test_resize_linear_cubic(coord: str, mode: str, target) -> None:
    got, want = resize_pair(rand(1, 2, 5, 6), mode, coord, **target)
    assert_close(got, want)


@pytest.mark.parametrize("a,exclude", [(-0.5, 0), (-0.5, 1), (-0.75, 1)])
@pytest.mark.parametrize("target", RESIZE_TARGETS[:3], ids=str)
def test_resize_cubic_coeff_exclude_outside(a: float, exclude: int, target) -> None:
    got, want = resize_pair(rand(1, 2, 5, 6), "cubic", "half_pixel", cubic_coeff_a=a, exclude_outside=exclude, **target)
    assert_close(got, want)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("target", [{"sizes": [1, 2, 4, 5]}, {"scales": [1, 1, 0.8, 1.5]}], ids=str)
def test_resize_tf_crop_and_resize_extrapolates(mode: str, target) -> None:
    roi = [0, 0, 0.2, -0.3, 1, 1, 0.9, 1.4]
    got, want = resize_pair(rand(1, 2, 5, 6), mode, "tf_crop_and_resize", roi=roi, extrapolation_value=-7.0, **target)
    assert_close(got, want)
    assert np.sum(got == -7.0) > 0  # the roi reaches outside the image


@pytest.mark.parametrize("engine", ["ort", "ref"])
@pytest.mark.parametrize("exclude", [0, 1])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize(
    "target", [{"scales": [1, 1, 0.5, 0.4]}, {"sizes": [1, 2, 3, 2]}, {"scales": [1, 1, 0.6, 2]}], ids=str
)
def test_resize_antialias(mode: str, exclude: int, engine: str, target) -> None:
    x = rand(1, 2, 9, 11)
    got, want = resize_pair(x, mode, "half_pixel", antialias=1, exclude_outside=exclude, engine=engine, **target)
    assert_close(got, want)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_uint8(mode: str) -> None:
    x = np.random.default_rng(0).integers(0, 256, (1, 3, 4, 5)).astype(np.uint8)
    got, want = resize_pair(x, mode, "asymmetric", scales=[1, 1, 2, 2])
    np.testing.assert_allclose(got.astype(int), want.astype(int), atol=1)
    assert got.dtype == np.uint8


# ---------------------------------------------------------------------------------------------------------
# the kernel registry
# ---------------------------------------------------------------------------------------------------------


def test_every_op_kind_but_lut_has_a_float_kernel() -> None:
    assert sorted(FLOAT_KERNELS) == sorted(set(O.OPS) - {"lut"})


def test_attr_choices_are_what_the_kernels_look_up() -> None:
    """`ops.ATTR_CHOICES` (what a serialized graph's reader accepts) names exactly the keys of the kernels'
    tables, and only fields that exist as strings on the op's attribute dataclass."""
    from dataclasses import fields

    from npuc.compiler.kernels import elementwise, resize, tensor

    choices = O.ATTR_CHOICES
    assert set(choices["eltwise"]["kind"]) == set(elementwise._BINARY)
    assert set(choices["reduce"]["kind"]) == set(tensor._REDUCERS)
    assert set(choices["pad"]["mode"]) == set(tensor._PAD_MODES)
    assert set(choices["resize"]["mode"]) == {"nearest", *resize._FILTERS}
    assert set(choices["resize"]["coord_mode"]) == set(resize.COORD_MODES)
    assert set(choices["resize"]["nearest_mode"]) == set(resize.NEAREST_MODES)
    for kind, attrs in choices.items():
        declared = {f.name: str(f.type) for f in fields(O.OPS[kind].attrs)}
        for name, values in attrs.items():
            assert declared.get(name) == "str", (kind, name)
            default = next(f.default for f in fields(O.OPS[kind].attrs) if f.name == name)
            if isinstance(default, str):
                assert default in values, (kind, name, default)
