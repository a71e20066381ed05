"""The merge_transpose_axes rewrite: a >4-D transpose becomes a 4-D one over merged axes, same values."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuc.compiler import interp
from npuc.frontends.onnx import import_model
from npuc.passes.rewrite.canonicalize import canonicalize, merged_transpose


def _model(nodes: list, inits: list, in_shape: tuple[int, ...]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _shape(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(shape, np.int64), name)


def _rewritten(model: onnx.ModelProto, in_shape: tuple[int, ...]):
    """(canonicalized graph, its output, onnxruntime's output of the original) on one random input."""
    graph = import_model(model)
    fired = canonicalize(graph)
    x = np.random.default_rng(3).standard_normal(in_shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return graph, fired, interp.run(graph, {"x": x})["y"], want


@pytest.mark.parametrize(
    ("shape", "perm", "merged", "merged_perm"),
    [
        ((1, 2, 4, 16, 16), (0, 2, 1, 3, 4), (2, 4, 256), (1, 0, 2)),
        ((2, 3, 4, 5, 6), (0, 1, 4, 2, 3), (6, 20, 6), (0, 2, 1)),
        ((1, 3, 1, 5, 7, 1), (0, 3, 4, 2, 5, 1), (3, 35), (1, 0)),  # unit axes do not split a run
        ((2, 3, 4, 5, 6), (4, 3, 2, 1, 0), (2, 3, 4, 5, 6), (4, 3, 2, 1, 0)),  # nothing merges
        ((3, 4, 5, 6, 7), (0, 1, 2, 3, 4), (2520,), (0,)),  # the identity is one axis
    ],
)
def test_merged_transpose_axes(shape, perm, merged, merged_perm) -> None:
    assert merged_transpose(shape, perm) == (merged, merged_perm)
    x = np.arange(int(np.prod(shape))).reshape(shape)
    np.testing.assert_array_equal(x.transpose(perm).ravel(), x.reshape(merged).transpose(merged_perm).ravel())


def test_channel_shuffle_becomes_a_4d_transpose_of_the_same_tensors() -> None:
    """ShuffleNet: reshape to [1,g,c/g,h,w], swap the group axes, reshape back; tensor names survive."""
    nodes = [
        helper.make_node("Reshape", ["x", "s5"], ["grouped"]),
        helper.make_node("Transpose", ["grouped"], ["shuffled"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["shuffled", "s4"], ["y"]),
    ]
    model = _model(nodes, [_shape("s5", (1, 2, 4, 16, 16)), _shape("s4", (1, 8, 16, 16))], (1, 8, 16, 16))
    graph, fired, got, want = _rewritten(model, (1, 8, 16, 16))
    assert fired["merge_transpose_axes"] == 1
    assert [(op.kind, op.outputs) for op in graph.ops] == [
        ("reshape", ["grouped"]),
        ("transpose", ["shuffled"]),
        ("reshape", ["y"]),
    ]
    assert graph.shape("grouped") == (1, 2, 4, 256) and graph.ops[1].attrs.perm == (0, 2, 1, 3)
    assert graph.shape("shuffled") == (1, 4, 2, 256)
    np.testing.assert_array_equal(got, want)
    x = np.random.default_rng(3).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(got[0, [0, 1, 2, 7]], x[0, [0, 4, 1, 7]])  # channel 2i+j reads 4j+i


def test_lone_6d_transpose_gets_reshapes_and_keeps_the_output_name() -> None:
    in_shape = (2, 3, 1, 4, 5, 6)
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 4, 5, 2, 1, 3])]
    graph, fired, got, want = _rewritten(_model(nodes, [], in_shape), in_shape)
    assert fired["merge_transpose_axes"] == 1
    assert [op.kind for op in graph.ops] == ["reshape", "transpose", "reshape"]
    assert graph.shape(graph.ops[1].inputs[0]) == (1, 2, 12, 30) and graph.ops[1].attrs.perm == (0, 1, 3, 2)
    assert graph.outputs == ["y"] and got.shape == (2, 5, 6, 1, 3, 4)
    np.testing.assert_array_equal(got, want)


def test_unmergeable_5d_transpose_is_left_alone() -> None:
    in_shape = (2, 3, 4, 5, 6)
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[4, 3, 2, 1, 0])]
    graph, fired, got, want = _rewritten(_model(nodes, [], in_shape), in_shape)
    assert "merge_transpose_axes" not in fired
    assert [(op.kind, op.attrs.perm) for op in graph.ops] == [("transpose", (4, 3, 2, 1, 0))]
    np.testing.assert_array_equal(got, want)
