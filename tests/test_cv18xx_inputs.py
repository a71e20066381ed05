"""Integer model inputs on cv18xx (backends/cv18xx/inputs.py), the runtime's CPU `embedding` routine as the
simulator runs it, and bf16 constants beyond the bf16 range."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuc.backends.cv18xx.inputs import settle_integer_inputs
from npuc.backends.cv18xx.sim_cpu import cpu_embedding
from npuc.compiler.errors import UserError
from npuc.compiler.numformats.bf16_fp16 import BF16_MAX, constant_to_bf16
from npuc.frontends.onnx import import_model


def _graph(nodes: list, outputs: list[str]):  # noqa: ANN202
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.INT64, (1, 8)) for n in ("ids", "mask")],
        [
            helper.make_tensor_value_info(n, TensorProto.INT64 if n == "ids_out" else TensorProto.FLOAT, None)
            for n in outputs
        ],  # fmt: skip
        [numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")],
    )
    return import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_ids_stay_integer_masks_become_float_echoes_go() -> None:
    graph = _graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["emb"]),
            helper.make_node("Unsqueeze", ["mask", "axis"], ["m3"]),
            helper.make_node("Cast", ["m3"], ["mf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["emb", "mf"], ["y"]),
            helper.make_node("Identity", ["ids"], ["ids_out"]),
            helper.make_node("Constant", [], ["axis"], value=numpy_helper.from_array(np.array([2], np.int64))),
        ],
        ["y", "ids_out"],
    )
    notes = settle_integer_inputs(graph)
    assert graph.outputs == ["y"]
    assert graph.tensors["ids"].dtype == "int64" and graph.tensors["mask"].dtype == "float32"
    assert not any(op.kind == "cast" for op in graph.ops)
    assert any("'ids_out'" in n or "ids_out" in n for n in notes) and any("'mask'" in n for n in notes)


def test_an_integer_input_used_otherwise_is_refused_by_name() -> None:
    graph = _graph([helper.make_node("Add", ["ids", "mask"], ["y"])], ["y"])
    with pytest.raises(UserError, match="integer input 'ids' feeds op"):
        settle_integer_inputs(graph)


def test_embedding_copies_rows_and_refuses_an_index_outside_the_table() -> None:
    table = np.arange(24, dtype=np.uint16).reshape(6, 4, 1, 1)
    ids = np.array([[5, 0, 2]], np.int32)
    (rows,) = cpu_embedding({}, [ids, table], [(np.dtype(np.uint16), (1, 3, 4, 1))])
    assert rows.reshape(3, 4).tolist() == [[20, 21, 22, 23], [0, 1, 2, 3], [8, 9, 10, 11]]
    with pytest.raises(UserError, match="index 6 is outside the table's 6 rows"):
        cpu_embedding({}, [np.array([[6]], np.int32), table], [(np.dtype(np.uint16), (1, 1, 4, 1))])


def test_constants_beyond_bf16_saturate_with_their_sign() -> None:
    got = constant_to_bf16(np.float32([-3.4028235e38, 3.4028235e38, -1.0, np.inf, -np.inf, 1e-3]))
    assert got.tolist() == [-BF16_MAX, BF16_MAX, -1.0, BF16_MAX, -BF16_MAX, np.float32(0.00099945068359375)]
