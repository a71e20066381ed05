"""LSTM and GRU through the frontend and the float reference, against onnxruntime: both directions, initial
states, clip, GRU's linear_before_reset, batch-first layout (the ONNX node tests cover the defaults)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuc.compiler import interp
from npuc.compiler.errors import UnsupportedError
from npuc.frontends.onnx import import_model

SEQ, BATCH, FEATURES, HIDDEN = 5, 2, 3, 4


def _model(cell: str, direction: str, layout: int = 0, **attrs: object) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(11)
    dirs = 2 if direction == "bidirectional" else 1
    gates = 4 if cell == "LSTM" else 3
    x_shape = (SEQ, BATCH, FEATURES) if layout == 0 else (BATCH, SEQ, FEATURES)
    state = (dirs, BATCH, HIDDEN) if layout == 0 else (BATCH, dirs, HIDDEN)
    inits = {
        "W": rng.standard_normal((dirs, gates * HIDDEN, FEATURES)).astype(np.float32),
        "R": rng.standard_normal((dirs, gates * HIDDEN, HIDDEN)).astype(np.float32),
        "B": rng.standard_normal((dirs, 2 * gates * HIDDEN)).astype(np.float32),
    }
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32), "h0": rng.standard_normal(state).astype(np.float32)}
    inputs = ["X", "W", "R", "B", "", "h0"]
    outputs = ["Y", "Y_h"]
    if cell == "LSTM":
        feeds["c0"] = rng.standard_normal(state).astype(np.float32)
        inputs.append("c0")
        outputs.append("Y_c")
    node = helper.make_node(cell, inputs, outputs, hidden_size=HIDDEN, direction=direction, layout=layout, **attrs)
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in feeds.items()]
    graph = helper.make_graph([node], "rnn", values, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                     for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), feeds


CASES = [
    ("LSTM", "forward", 0, {}),
    ("LSTM", "reverse", 0, {"clip": 1.5}),
    ("LSTM", "bidirectional", 0, {}),
    ("LSTM", "bidirectional", 1, {}),
    ("GRU", "forward", 0, {}),
    ("GRU", "bidirectional", 0, {"linear_before_reset": 1}),
    ("GRU", "reverse", 1, {"clip": 0.8}),
]


@pytest.mark.parametrize("cell, direction, layout, attrs", CASES)
def test_matches_onnxruntime(cell: str, direction: str, layout: int, attrs: dict) -> None:
    model, feeds = _model(cell, direction, layout, **attrs)
    if layout == 0:
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    else:  # onnxruntime has no batch-first kernels: run the sequence-first twin and transpose its results
        twin, _ = _model(cell, direction, 0, **attrs)
        seq_first = {k: v.transpose(1, 0, 2) for k, v in feeds.items()}
        y, *states = ort.InferenceSession(twin.SerializeToString()).run(None, seq_first)
        want = [y.transpose(2, 0, 1, 3), *(s.transpose(1, 0, 2) for s in states)]
    got = interp.run(import_model(model), feeds)
    for name, value in zip(["Y", "Y_h", "Y_c"], want):
        assert got[name].shape == value.shape, name
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


def test_non_default_activations_are_refused() -> None:
    model, _ = _model("GRU", "forward", activations=["Relu", "Tanh"])
    with pytest.raises(UnsupportedError, match=r"activations \['Relu', 'Tanh'\] are not the default"):
        import_model(model)


@pytest.mark.parametrize("cell, direction, layout, attrs", CASES)
@pytest.mark.parametrize("states", ["fed", "zero"])
def test_unrolled_equals_the_recurrent_op(cell: str, direction: str, layout: int, attrs: dict, states: str) -> None:
    """passes/rewrite/recurrent_unroll.py: the same values from matrix products, slices, sigmoid, tanh and arithmetic,
    initial states fed as inputs or constant zeros (which fold away)."""
    from npuc.passes.rewrite.recurrent_unroll import unroll_recurrent

    model, feeds = _model(cell, direction, layout, **attrs)
    if states == "zero":
        for name in ("h0", "c0"):
            if name in feeds:
                value = np.zeros_like(feeds.pop(name))
                model.graph.initializer.append(numpy_helper.from_array(value, name))
                model.graph.input.remove(next(i for i in model.graph.input if i.name == name))
    graph = import_model(model)
    want = interp.run(graph, feeds)
    notes = unroll_recurrent(graph)
    assert not any(op.kind == "recurrent" for op in graph.ops) and len(notes) == 1
    got = interp.run(graph, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
