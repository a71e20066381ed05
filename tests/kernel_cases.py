"""The float kernel tests' harness: one-op ONNX models run by onnxruntime / onnx.reference against hand-built
IR graphs run by npuc's interpreter, and the tolerance."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from npuc.compiler.interp import run
from npuc.compiler.ir import Graph

RTOL = 1e-5


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
