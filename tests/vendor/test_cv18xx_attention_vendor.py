"""Transformer blocks on CV18xx in bf16: layer normalization on the TIU (backends/cv18xx/kernels/norm.py) and
MatMul of two activations (attention scores and context), on the vendor simulator with the same bits as
`npuc run`, and close to onnxruntime.

The shapes cover one tile and many (600 rows of 384), a normalized size split over h x w (a 4-D input
normalized over C, H, W), rows that do not fill the lanes, with and without the affine step; for MatMul,
heads as a batch, batch dims that broadcast, K that is not a whole number of column groups (zero-padded on
both sides) and a right matrix tiled by columns.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from metrics import cosine
from onnx import TensorProto, helper, numpy_helper

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.kernels.scientific import reciprocal_tables, rsqrt_tables
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.backends.cv18xx.sim_tiu import bf16_to_f32
from npuc.compiler.numformats.bf16_fp16 import round_to_bf16
from npuc.models.images import model_inputs

from .cv18xx_build_util import build, real_model_shapes
from .cv18xx_sim import run_vendor

CHIPS = ["cv181x", "cv183x"]


def _save(nodes: list, inputs: dict[str, tuple[int, ...]], consts: dict[str, np.ndarray], path: Path) -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _bit_exact_and_close(model: Path, chip: str, feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    out = build(model, None, chip, "bf16", tmp_path / "m.cvimodel")
    theirs = run_vendor(out, feeds)
    ours = run_cvimodel(read_cvimodel(out), feeds)
    want = ort.InferenceSession(str(model)).run(None, feeds)[0]
    (name, value), = theirs.items()  # fmt: skip
    assert np.array_equal(np.asarray(ours[name]).reshape(value.shape).view(np.uint8), value.view(np.uint8))
    assert cosine(value.reshape(want.shape), want) >= 0.9999  # measured 0.99999x on every case


LAYER_NORMS = [  # (input shape, axis, affine)
    ((1, 32, 384), 2, True),  # MiniLM's hidden states
    ((2, 40, 120), 2, False),
    ((1, 70, 64), -1, True),  # 70 rows: a second, partial round of lanes
    ((1, 8, 6, 10), 2, True),  # normalized over H, W
    ((1, 2, 40, 64), 1, True),  # 2560 values per row: h x w = 40 x 64
    ((1, 600, 384), 2, True),  # several row tiles
]


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("shape,axis,affine", LAYER_NORMS, ids=[str(c) for c in LAYER_NORMS])
def test_layer_norm(chip: str, shape: tuple[int, ...], axis: int, affine: bool, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tail = shape[axis:]
    consts = {
        "g": rng.standard_normal(tail).astype(np.float32) if affine else np.ones(tail, np.float32),
        "b": rng.standard_normal(tail).astype(np.float32) if affine else np.zeros(tail, np.float32),
    }
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=axis, epsilon=1e-5)
    model = _save([node], {"x": shape}, consts, tmp_path / "ln.onnx")
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    _bit_exact_and_close(model, chip, {"x": x}, tmp_path)


MATMULS = [
    ((1, 12, 32, 32), (1, 12, 32, 32)),  # 12 heads of 32 tokens
    ((2, 1, 5, 20), (3, 20, 7)),  # broadcast batch dims; K = 20 pads to 24
    ((40, 120), (120, 40)),
    ((1, 3, 70, 9), (1, 3, 9, 300)),
]


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("a_shape,b_shape", MATMULS, ids=[f"{a}x{b}" for a, b in MATMULS])
def test_matmul_of_two_activations(chip: str, a_shape: tuple, b_shape: tuple, tmp_path: Path) -> None:
    model = _save([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a_shape, "b": b_shape}, {},
                  tmp_path / "mm.onnx")  # fmt: skip
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal(a_shape).astype(np.float32), "b": rng.standard_normal(b_shape).astype(np.float32)}
    _bit_exact_and_close(model, chip, feeds, tmp_path)


def _axes(*axes: int) -> np.ndarray:
    return np.array(axes, np.int64)


POOLING = {  # name: (nodes, input shapes, constants); opset 18 (axes as inputs everywhere)
    "sum_over_tokens": ([helper.make_node("ReduceSum", ["a", "ax"], ["y"], keepdims=0)], {"a": (1, 32, 384)},
                        {"ax": _axes(1)}),
    "mean_last_axis": ([helper.make_node("ReduceMean", ["a", "ax"], ["y"])], {"a": (2, 40, 120)}, {"ax": _axes(-1)}),
    "max_two_axes": ([helper.make_node("ReduceMax", ["a", "ax"], ["y"])], {"a": (2, 3, 4, 5)}, {"ax": _axes(1, 2)}),
    "sum_700_rows": ([helper.make_node("ReduceSum", ["a", "ax"], ["y"], keepdims=0)], {"a": (3, 700, 6)},
                     {"ax": _axes(1)}),
    "expand_rows": ([helper.make_node("Expand", ["a", "s"], ["y"])], {"a": (1, 32, 1)}, {"s": _axes(1, 32, 384)}),
    "expand_w": ([helper.make_node("Expand", ["a", "s"], ["y"])], {"a": (1, 1, 4, 1)}, {"s": _axes(2, 3, 4, 5)}),
    "div": ([helper.make_node("Div", ["a", "b"], ["y"])], {"a": (1, 384), "b": (1, 384)}, {}),
    "div_broadcast": ([helper.make_node("Div", ["a", "b"], ["y"])], {"a": (2, 40, 120), "b": (2, 40, 1)}, {}),
    "masked_mean": (  # sentence-transformers' pooling: sum(x * mask) / clip(sum(mask), 1e-9)
        [helper.make_node("Mul", ["a", "m"], ["am"]), helper.make_node("ReduceSum", ["am", "ax"], ["s"], keepdims=0),
         helper.make_node("ReduceSum", ["m", "ax"], ["n"], keepdims=0), helper.make_node("Clip", ["n", "lo"], ["c"]),
         helper.make_node("Div", ["s", "c"], ["y"])],
        {"a": (1, 32, 384), "m": (1, 32, 384)}, {"ax": _axes(1), "lo": np.array(1e-9, np.float32)}),
}  # fmt: skip


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("case", sorted(POOLING))
def test_reduce_expand_and_divide(chip: str, case: str, tmp_path: Path) -> None:
    """Reductions over adjacent axes (one pool window per kept value), broadcast copies and bf16 division by
    the reciprocal's exponent and mantissa lookups."""
    nodes, inputs, consts = POOLING[case]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )  # fmt: skip
    model = tmp_path / f"{case}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), model)
    rng = np.random.default_rng(2)
    feeds = {n: (rng.standard_normal(s) * 4).astype(np.float32) for n, s in inputs.items()}
    if case == "masked_mean":
        feeds["m"] = np.broadcast_to((np.arange(32) < 20).astype(np.float32)[None, :, None], (1, 32, 384)).copy()
    _bit_exact_and_close(model, chip, feeds, tmp_path)


@pytest.mark.parametrize("function", ["rsqrt", "reciprocal"])
def test_scientific_tables_give_their_function_of_every_bf16(function: str) -> None:
    """exponent_table[index] * mantissa_table[low byte] for every normal bf16 from 2^-63 to 2^63 (positive
    only for rsqrt), within the bf16 rounding of the mantissa factor."""
    positive = np.arange(64 << 7, 191 << 7, dtype=np.uint16)
    bits = positive if function == "rsqrt" else np.concatenate([positive, positive | 0x8000])
    x = bf16_to_f32(bits).astype(np.float64)
    index = ((bits >> 7) & 0xFF).astype(np.int64) - 64 + np.where(bits >> 15, 128, 0)
    exponent, mantissa = (rsqrt_tables if function == "rsqrt" else reciprocal_tables)()
    got = exponent[index] * round_to_bf16(mantissa)[bits & 0xFF]
    want = 1 / np.sqrt(x) if function == "rsqrt" else 1 / x
    np.testing.assert_allclose(got, want, rtol=2.0**-8)


@pytest.mark.parametrize("chip", CHIPS)
def test_minilm_sentence_embedding_bf16(real_model, chip: str, tmp_path: Path) -> None:
    """paraphrase-MiniLM-L3 whole: the embedding lookup is the runtime's CPU `embedding` routine on int32 ids,
    the attention mask a float32 input (the model only casts it), the -FLT_MAX mask constant saturates to
    bf16's -max, and the masked mean pooling runs on the TPU (broadcast, reduce-sum, reciprocal)."""
    model = real_model("minilm_l3")
    out = build(model, None, chip, "bf16", tmp_path / "minilm.cvimodel", real_model_shapes("minilm_l3"))
    session = ort.InferenceSession(str(model))
    for feed in model_inputs("minilm_l3", 2 if chip == "cv181x" else 1):
        theirs = run_vendor(out, feed)
        ours = run_cvimodel(read_cvimodel(out), feed)
        assert set(theirs) == set(ours) == {"onnx::Shape_422", "461"}  # the echoed ids and mask are left out
        want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True))
        for name, value in theirs.items():
            assert np.array_equal(np.asarray(ours[name]).reshape(value.shape).view(np.uint8), value.view(np.uint8))
            # measured: sentence embedding 0.99994, token embeddings 0.99993
            assert cosine(value.reshape(want[name].shape), want[name]) >= 0.999, name
