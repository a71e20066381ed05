"""Each canonicalization rewrite fires on the pattern it targets and keeps the float semantics."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuc.compiler import interp
from npuc.frontends.onnx import import_model
from npuc.passes.rewrite.canonicalize import canonicalize

RNG = np.random.default_rng(7)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _model(nodes, inits, in_shape=(1, 4, 8, 8), out_shape=None, opset=13, in_name="x"):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _check(model, expect_fired: dict[str, int], expect_kinds: dict[str, int] | None = None):
    graph = import_model(model)
    fired = canonicalize(graph)
    for name, count in expect_fired.items():
        assert fired.get(name, 0) == count, fired
    if expect_kinds is not None:
        assert graph.summary() == expect_kinds
    x = RNG.standard_normal(interp.external_shape(graph, graph.inputs[0])).astype(np.float32) * 4
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = interp.run(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return graph


def _conv_weights(cout=4, cin=4, k=3):
    return [_const("w", RNG.standard_normal((cout, cin, k, k)) * 0.3), _const("b", RNG.standard_normal(cout))]


def test_batchnorm_folds_into_conv_and_relu6_fuses():
    bn = [_const(n, v) for n, v in (("s", RNG.random(4) + 0.5), ("o", RNG.standard_normal(4)),
                                     ("m", RNG.standard_normal(4)), ("v", RNG.random(4) + 0.1))]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["n"]),
        helper.make_node("Clip", ["n", "lo", "hi"], ["y"]),
    ]
    model = _model(nodes, _conv_weights() + bn + [_const("lo", 0.0), _const("hi", 6.0)])
    graph = _check(model, {"fold_batchnorm": 1, "fuse_activation": 1}, {"conv2d": 1})
    assert graph.ops[0].attrs.act.hi == 6.0


def test_standalone_batchnorm_stays_a_channel_scale():
    bn = [_const(n, v) for n, v in (("s", RNG.random(4) + 0.5), ("o", RNG.standard_normal(4)),
                                     ("m", RNG.standard_normal(4)), ("v", RNG.random(4) + 0.1))]  # fmt: skip
    model = _model([helper.make_node("BatchNormalization", ["x", "s", "o", "m", "v"], ["y"])], bn)
    _check(model, {}, {"channel_scale": 1})


def test_pad_folds_into_conv():
    nodes = [
        helper.make_node("Pad", ["x", "p"], ["xp"]),
        helper.make_node("Conv", ["xp", "w", "b"], ["y"]),
    ]
    pads = numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "p")
    graph = _check(_model(nodes, _conv_weights() + [pads]), {"fold_pad": 1}, {"conv2d": 1})
    assert graph.ops[0].attrs.pads == (1, 2, 2, 1)


@pytest.mark.parametrize("spelling", ["div", "mul"])
def test_hard_sigmoid_and_hard_swish_from_primitives(spelling):
    scale = [_const("six", 6.0)] if spelling == "div" else [_const("six", 1 / 6)]
    nodes = [
        helper.make_node("Add", ["x", "three"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "six_c"], ["c"]),
        helper.make_node("Div" if spelling == "div" else "Mul", ["c", "six"], ["hs"]),
        helper.make_node("Mul", ["x", "hs"], ["y"]),
    ]
    inits = [_const("three", 3.0), _const("zero", 0.0), _const("six_c", 6.0), *scale]
    graph = _check(_model(nodes, inits), {"recognize_hard_sigmoid": 1, "recognize_hard_swish": 1})
    assert [op.attrs.act.kind for op in graph.ops] == ["hard_swish"]


def test_hard_swish_as_product_then_divide():
    nodes = [
        helper.make_node("Add", ["x", "three"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Div", ["m", "six"], ["y"]),
    ]
    inits = [_const("three", 3.0), _const("zero", 0.0), _const("six", 6.0)]
    graph = _check(_model(nodes, inits), {"recognize_hard_swish_product": 1})
    assert [op.attrs.act.kind for op in graph.ops] == ["hard_swish"]


@pytest.mark.parametrize("order", ["half_last", "half_first"])
def test_gelu_from_erf(order):
    nodes = [
        helper.make_node("Div", ["x", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
    ]
    if order == "half_last":
        nodes += [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    inits = [_const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)]
    graph = _check(_model(nodes, inits), {"recognize_gelu": 1})
    assert [op.attrs.act.kind for op in graph.ops] == ["gelu"]


def test_nhwc_input_transpose_becomes_layout():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t", "w", "b"], ["y"]),
    ]
    graph = _check(_model(nodes, _conv_weights(), in_shape=(1, 8, 8, 4)), {"absorb_nhwc_input_transpose": 1})
    assert graph.input_layouts["x"] == "nhwc" and graph.shape("x") == (1, 4, 8, 8)


def test_noop_reshape_and_flatten_are_dropped_but_outputs_keep_their_names():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=0),
        helper.make_node("Reshape", ["f", "shape"], ["y"]),
    ]
    shape = numpy_helper.from_array(np.array([1, 4, 8, 8], np.int64), "shape")
    # reshape(flatten(r)) merges into one reshape, which is then a no-op: two firings
    graph = _check(_model(nodes, [shape]), {"drop_noop_reshape": 2}, {"activation": 1})
    assert graph.outputs == ["y"] and graph.ops[0].outputs == ["y"]


def test_divide_by_a_constant_becomes_a_multiply_by_its_reciprocal():
    divisor = np.array([2.0, 4.0, 0.5, 8.0], np.float32).reshape(1, 4, 1, 1)
    model = _model([helper.make_node("Div", ["x", "d"], ["y"])], [_const("d", divisor)])
    graph = _check(model, {"divide_by_reciprocal": 1}, {"eltwise": 1})
    (op,) = graph.ops
    assert op.attrs.kind == "mul"
    np.testing.assert_array_equal(graph.const(op.inputs[1]).ravel(), [0.5, 0.25, 2.0, 0.125])
    zero = _model([helper.make_node("Div", ["x", "d"], ["y"])], [_const("d", np.zeros((1, 4, 1, 1)))])
    assert canonicalize(import_model(zero)).get("divide_by_reciprocal", 0) == 0  # x / 0 keeps its inf/nan


@pytest.mark.parametrize("op_type, mode", [("ReduceMean", "avg"), ("ReduceMax", "max")])
@pytest.mark.parametrize("axes", [[2, 3], [-1, -2]])
def test_spatial_reduce_becomes_a_global_pool(op_type, mode, axes):
    model = _model([helper.make_node(op_type, ["x"], ["y"], axes=axes, keepdims=1)], [])
    graph = _check(model, {"spatial_reduce_to_global_pool": 1}, {"global_pool": 1})
    assert graph.ops[0].attrs.mode == mode


@pytest.mark.parametrize("axes, keepdims", [([1], 1), ([2, 3], 0), ([1, 2, 3], 1)])
def test_other_reductions_stay_reductions(axes, keepdims):
    model = _model([helper.make_node("ReduceMean", ["x"], ["y"], axes=axes, keepdims=keepdims)], [])
    _check(model, {"spatial_reduce_to_global_pool": 0}, {"reduce": 1})


def test_batchnorm_after_a_squeeze_folds_into_the_conv():
    """conv -> Squeeze(H) -> BatchNormalization (PP-OCR's neck): the scale moves before the squeeze and folds;
    the scaled tensor keeps its name at the conv's shape, the squeeze writes a new one."""
    bn = [_const(n, v) for n, v in (("s", RNG.random(4) + 0.5), ("o", RNG.standard_normal(4)),
                                     ("m", RNG.standard_normal(4)), ("v", RNG.random(4) + 0.1))]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[0, 1, 0, 1]),
        helper.make_node("Squeeze", ["c", "ax"], ["q"]),
        helper.make_node("BatchNormalization", ["q", "s", "o", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    ax = numpy_helper.from_array(np.array([2], np.int64), "ax")
    model = _model(nodes, [*_conv_weights(), *bn, ax], in_shape=(1, 4, 3, 8))
    graph = _check(
        model, {"scale_before_reshape": 1, "fold_batchnorm": 1}, {"conv2d": 1, "reshape": 1, "activation": 1}
    )
    conv = graph.ops[0]
    assert conv.outputs == ["n"] and graph.shape("n") == (1, 4, 1, 8)
    assert graph.ops[1].outputs != ["n"] and graph.shape(graph.ops[1].outputs[0]) == (1, 4, 8)


def test_batchnorm_after_a_squeeze_without_a_conv_stays():
    bn = [_const(n, v) for n, v in (("s", RNG.random(4) + 0.5), ("o", RNG.standard_normal(4)),
                                     ("m", RNG.standard_normal(4)), ("v", RNG.random(4) + 0.1))]  # fmt: skip
    nodes = [
        helper.make_node("Squeeze", ["x", "ax"], ["q"]),
        helper.make_node("BatchNormalization", ["q", "s", "o", "m", "v"], ["y"]),
    ]
    ax = numpy_helper.from_array(np.array([2], np.int64), "ax")
    _check(
        _model(nodes, [*bn, ax], in_shape=(1, 4, 1, 8)), {"scale_before_reshape": 0}, {"reshape": 1, "channel_scale": 1}
    )


def _layer_norm_nodes(square: str, divide: str, affine: bool, axes: list[int]) -> tuple[list, list]:
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=axes),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"])
        if square == "pow"
        else helper.make_node("Mul", ["d", "d"], ["sq"]),  # noqa: E501
        helper.make_node("ReduceMean", ["sq"], ["v"], axes=axes),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
    ]
    last = "y" if not affine else "n"
    if divide == "div":
        nodes.append(helper.make_node("Div", ["d", "s"], [last]))
    else:
        nodes += [helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["r", "d"], [last])]
    tail = (8,) if axes == [-1] else (6, 8)
    inits = [_const("two", 2.0), _const("eps", 1e-5)]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["g"]), helper.make_node("Add", ["g", "beta"], ["y"])]
        inits += [_const("gamma", RNG.standard_normal(tail)), _const("beta", RNG.standard_normal(tail))]
    return nodes, inits


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("divide", ["div", "reciprocal"])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("axes", [[-1], [2, 3]])
def test_layer_norm_from_primitives(square, divide, affine, axes):
    nodes, inits = _layer_norm_nodes(square, divide, affine, axes)
    model = _model(nodes, inits, in_shape=(1, 4, 6, 8))
    graph = _check(model, {"recognize_layer_norm": 1})
    assert [op.kind for op in graph.ops] == ["layer_norm"]


def test_layer_norm_spelling_whose_centred_value_is_also_an_output_stays():
    nodes, inits = _layer_norm_nodes("pow", "div", False, [-1])
    model = _model(nodes, inits, in_shape=(1, 4, 6, 8))
    model.graph.output.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    graph = import_model(model)
    assert "recognize_layer_norm" not in canonicalize(graph)
