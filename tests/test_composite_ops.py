"""ONNX ops npuc spells in IR primitives (Einsum, LogSoftmax, InstanceNormalization, Tile), checked against
onnxruntime on the forms real models use, beyond the few shapes of the ONNX node tests."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuc.compiler import interp
from npuc.compiler.errors import UnsupportedError
from npuc.frontends.onnx import import_model


def _model(node: onnx.NodeProto, inputs: dict[str, tuple[int, ...]], consts: dict[str, np.ndarray],
           opset: int = 17) -> onnx.ModelProto:  # fmt: skip
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _agree(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    graph = import_model(model)
    got = interp.run(graph, feeds)[graph.outputs[0]]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


EINSUMS = [
    ("bhid,bhjd->bhij", [(2, 4, 8, 16), (2, 4, 8, 16)]),  # attention scores
    ("bhij,bhjd->bhid", [(2, 4, 8, 8), (2, 4, 8, 16)]),  # attention context
    ("bnd,de->bne", [(2, 10, 32), (32, 24)]),  # a linear layer on a constant weight
    ("...d,ed->...e", [(3, 5, 32), (24, 32)]),  # ellipsis, transposed weight
    ("bgnd,gde->bgne", [(2, 4, 6, 8), (4, 8, 12)]),  # grouped linear
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit output
    ("nchw->nhwc", [(1, 3, 4, 5)]),
    ("bij->b", [(2, 3, 4)]),
    ("bi,bj->bij", [(2, 3), (2, 4)]),  # outer product per batch
    ("bik,bk->bi", [(2, 3, 4), (2, 4)]),  # matrix-vector, an index summed inside one operand first
    ("abc,c->a", [(2, 3, 4), (4,)]),
]


@pytest.mark.parametrize("equation,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
@pytest.mark.parametrize("constant_right", [False, True])
def test_einsum_matches_onnxruntime(equation: str, shapes: list[tuple[int, ...]], constant_right: bool) -> None:
    rng = np.random.default_rng(0)
    values = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    consts = {"x1": values.pop("x1")} if constant_right and len(shapes) == 2 else {}
    node = helper.make_node("Einsum", list(values) + list(consts), ["y"], equation=equation)
    _agree(_model(node, {n: v.shape for n, v in values.items()}, consts, opset=12), values)


def test_einsum_diagonal_is_refused_by_name() -> None:
    node = helper.make_node("Einsum", ["x0"], ["y"], equation="ii->i")
    with pytest.raises(UnsupportedError, match="repeats an index"):
        import_model(_model(node, {"x0": (3, 3)}, {}, opset=12))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("opset", [11, 13])
def test_log_softmax_is_stable_on_large_logits(axis: int, opset: int) -> None:
    x = (np.random.default_rng(1).standard_normal((2, 3, 50)) * 400).astype(np.float32)
    node = helper.make_node("LogSoftmax", ["x"], ["y"], axis=axis)
    _agree(_model(node, {"x": x.shape}, {}, opset=opset), {"x": x})


def test_instance_normalization_matches_onnxruntime() -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((2, 6, 7, 9)) * 3 + 1).astype(np.float32)
    consts = {"s": rng.standard_normal(6).astype(np.float32), "b": rng.standard_normal(6).astype(np.float32)}
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)
    _agree(_model(node, {"x": x.shape}, consts), {"x": x})


def test_tile_matches_onnxruntime() -> None:
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    node = helper.make_node("Tile", ["x", "r"], ["y"])
    _agree(_model(node, {"x": x.shape}, {"r": np.array([2, 1, 3], np.int64)}), {"x": x})
