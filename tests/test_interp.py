"""The float interpreter (compiler/interp.py): outputs and intermediates, each intermediate freed after its last
reader, graph inputs as outputs, feed checks (shape, dtype, names) and a missing kernel."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from npuc.compiler import ops as O
from npuc.compiler.errors import UserError
from npuc.compiler.interp import run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels import FLOAT_KERNELS


def rand(*shape: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def chain_graph() -> Graph:
    """x -> conv -> relu -> add(const) -> y, plus a second output that is a constant."""
    g = Graph()
    g.add_tensor("x", (1, 2, 4, 4))
    g.inputs = ["x"]
    g.add_const("w", np.full((3, 2, 1, 1), 0.5, np.float32))
    g.add_const("k", np.arange(3, dtype=np.float32).reshape(1, 3, 1, 1))
    g.add_op("conv2d", ["x", "w"], ["c"], O.Conv2d())
    g.add_op("activation", ["c"], ["r"], O.ActivationOp(O.Activation("relu")))
    g.add_op("eltwise", ["r", "k"], ["y"], O.Eltwise("add"))
    g.outputs = ["y", "k"]
    return g


def test_run_returns_outputs_and_keep_all_returns_intermediates() -> None:
    g = chain_graph()
    x = rand(1, 2, 4, 4)
    out = run(g, {"x": x})
    assert sorted(out) == ["k", "y"]
    expected = np.maximum(x.sum(axis=1, keepdims=True) * 0.5, 0) + np.arange(3, dtype=np.float32).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(out["y"], expected, rtol=1e-6)
    np.testing.assert_array_equal(out["k"], [[[[0]], [[1]], [[2]]]])
    everything = run(g, {"x": x}, keep_all=True)
    assert sorted(everything) == ["c", "k", "r", "x", "y"]
    np.testing.assert_array_equal(everything["r"], np.maximum(everything["c"], 0))


def test_run_frees_intermediates_after_last_use() -> None:
    g = chain_graph()
    produced: dict[str, weakref.ref] = {}
    alive_at_add: dict[str, bool] = {}

    def recording(kind: str):
        def kernel(op, inputs):
            if op.kind == "eltwise":
                gc.collect()
                alive_at_add.update({name: ref() is not None for name, ref in produced.items()})
            outs = FLOAT_KERNELS[kind](op, inputs)
            produced.update({name: weakref.ref(v) for name, v in zip(op.outputs, outs, strict=True)})
            return outs

        return kernel

    kernels = {kind: recording(kind) for kind in FLOAT_KERNELS}
    out = run(g, {"x": rand(1, 2, 4, 4)}, kernels=kernels)
    gc.collect()
    # while add runs, conv's output (last read by relu) is already gone; relu's output is its input
    assert alive_at_add == {"c": False, "r": True}
    assert produced["r"]() is None and produced["y"]() is out["y"]


def test_graph_input_can_be_an_output() -> None:
    g = Graph()
    g.add_tensor("x", (2, 3))
    g.inputs = ["x"]
    g.add_op("activation", ["x"], ["y"], O.ActivationOp(O.Activation("tanh")))
    g.outputs = ["x", "y"]
    x = rand(2, 3)
    out = run(g, {"x": x})
    np.testing.assert_array_equal(out["x"], x)
    np.testing.assert_array_equal(out["y"], np.tanh(x))


def test_feed_shape_mismatch_names_input_and_shapes() -> None:
    with pytest.raises(UserError, match=r"input 'x': expected shape \[1, 2, 4, 4\] \(nchw\), given \[1, 2, 4, 5\]"):
        run(chain_graph(), {"x": rand(1, 2, 4, 5)})


def test_feed_dtype_missing_and_unknown_names() -> None:
    g = chain_graph()
    with pytest.raises(UserError, match=r"input 'x': expected dtype float32, given float64"):
        run(g, {"x": np.zeros((1, 2, 4, 4))})
    with pytest.raises(UserError, match="graph input 'x' has no feed"):
        run(g, {})
    with pytest.raises(UserError, match="feed 'z' is not a graph input"):
        run(g, {"x": rand(1, 2, 4, 4), "z": rand(1)})


def test_missing_kernel_is_user_error() -> None:
    with pytest.raises(UserError, match="no kernel for op kind 'conv2d'"):
        run(chain_graph(), {"x": rand(1, 2, 4, 4)}, kernels={})
