"""ONNX backend node tests through npuc's frontend and float interpreter.

Every case whose nodes are all ops npuc claims runs here, except the documented exclusions below. Inputs
that npuc requires to be constant (shape arguments, pads, scales...: the converters' `const_inputs`) are
baked into the model as initializers first, as a static-shape compiler sees them.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from npuc.compiler import interp
from npuc.frontends.onnx import import_model, opset_of
from npuc.frontends.onnx_ops import find_converter

CLAIMED = {
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Relu",
    "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Add", "Sub", "Mul", "Div",
    "Concat", "Reshape", "Flatten", "Transpose", "Gemm", "MatMul", "Softmax", "BatchNormalization", "Resize",
    "Upsample", "Pad", "Slice", "Split", "Squeeze", "Unsqueeze", "Sum", "Max", "Min", "LRN", "ReduceMean",
    "Erf", "Gelu", "Constant", "ConstantOfShape", "Identity", "Dropout", "Shape", "Gather", "Cast", "Expand",
    "Range", "Sqrt", "Exp", "Log", "Reciprocal", "Neg", "Abs", "LSTM", "GRU", "ReduceSum", "ReduceMax", "ReduceMin",
    "LayerNormalization", "Equal", "Where", "Pow", "LogSoftmax", "InstanceNormalization", "Tile", "Einsum",
}  # fmt: skip

# name pattern → why npuc does not run it. Each pattern must match at least one case (checked below).
EXCLUDED = {
    r"_3d|conv_transpose_3d|convtranspose_3d": "3-D convolution/pooling: NPU targets compute 1-D/2-D windows only",
    r"^test_maxpool_with_argmax": "MaxPool's Indices output is not supported (inference needs only values)",
    r"^test_maxpool_2d_uint8": "uint8 pooling: npuc pools float tensors (integer pooling comes with quantization)",
    r"^test_batchnorm_.*training": "training-mode BatchNormalization: npuc compiles inference graphs",
    r"^test_cast_.*(STRING|FLOAT8|BFLOAT16|INT4|UINT4|FLOAT4|e4m3|e5m2|e8m0|INT2|UINT2)": (
        "string, float8, bfloat16 and 4/2-bit casts: no NPU number format uses them at the graph level"
    ),
    r"^test_range_": "Range with runtime inputs has a data-dependent output shape; npuc folds constant Range only",
    r"^test_constantofshape_.*int_zeros|^test_constantofshape_int_shape_zero": (
        "ConstantOfShape producing an empty tensor: zero-sized tensors are not supported"
    ),
    r"^test_resize_.*antialias": "antialiased Resize is not supported (no NPU target implements it)",
    r"^test_split_zero_size|^test_split_.*empty|^test_slice_start_out_of_bounds|^test_concat.*empty": (
        "zero-sized tensors are not supported"
    ),
    r"^test_castlike_": (
        "CastLike is not a claimed op; its expanded form reads an empty 'like' tensor (zero-sized tensors "
        "are not supported)"
    ),
    r"^test_einsum_batch_diagonal": "Einsum diagonals (an index repeated in one term): npuc converts contractions only",
    r"^test_einsum_batch_matmul_bfloat16": (
        "a bfloat16 graph matmul: npuc's float reference computes in float32 (bf16 is a target number format)"
    ),
    r"^test_training_dropout": "training-mode Dropout: npuc compiles inference graphs",
    r"^test_identity_sequence|^test_identity_opt": "sequence and optional types: npuc compiles tensors only",
    r"^test_reshape_allowzero_reordered": "zero-sized tensors are not supported",
    r"^test_reduce_.*empty_set": "reductions over zero-sized tensors: zero-sized tensors are not supported",
    r"^test_resize_downsample_scales_(linear|cubic)_align_corners": (
        "the reference data disagrees with onnxruntime; npuc is checked against onnxruntime instead "
        "(test_resize_align_corners_matches_onnxruntime)"
    ),
}


# Generating onnx's node cases runs their reference code (~10 s), so collection takes the selected case names
# from this file when it was written for the installed onnx version, and cases are generated at their first
# run; test_selection_file_is_current checks it. Rewrite it with `python tests/test_onnx_node.py --write`.
SELECTION_FILE = Path(__file__).with_name("onnx_node_cases.json")


@functools.lru_cache(maxsize=1)
def _all_cases():
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(load_model_tests(kind="node"))


def _op_types(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node}


def _selected():
    chosen, excluded = [], {}
    for case in _all_cases():
        ops = _op_types(case.model)
        if not ops or not ops <= CLAIMED:
            continue
        reason = next((why for pat, why in EXCLUDED.items() if re.search(pat, case.name)), None)
        if reason:
            excluded[case.name] = reason
        else:
            chosen.append(case)
    return chosen, excluded


def _bake_const_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Turn the graph inputs that a converter's const_inputs depend on into initializers."""
    opset = opset_of(model)
    producer = {out: node for node in model.graph.node for out in node.output}
    pending: list[str] = []
    for node in model.graph.node:
        entry = find_converter(node.op_type, node.domain, opset)
        pending += [node.input[i] for i in (entry.const_inputs if entry else ()) if i < len(node.input)]
    needed: set[str] = set()
    while pending:  # everything the constant arguments are computed from
        name = pending.pop()
        if name and name not in needed:
            needed.add(name)
            pending += list(producer[name].input) if name in producer else []
    baked = needed & set(feeds)
    if not baked:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [vi for vi in out.graph.input if vi.name not in baked]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(feeds[n]), n) for n in sorted(baked))
    return out


def _feeds(case, data_set) -> dict[str, np.ndarray]:
    inputs, _ = data_set
    names = [vi.name for vi in case.model.graph.input if vi.name not in {t.name for t in case.model.graph.initializer}]
    return {name: _array(value) for name, value in zip(names, inputs, strict=False)}


def _array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def _selection_now() -> dict:
    chosen, excluded = _selected()
    return {"onnx": onnx.__version__, "run": [c.name for c in chosen], "excluded": sorted(excluded)}


def _selection() -> tuple[list[str], dict[str, str]]:
    """(names of the cases to run, excluded name -> why), from SELECTION_FILE when it fits the installed onnx."""
    saved = json.loads(SELECTION_FILE.read_text()) if SELECTION_FILE.exists() else {}
    if saved.get("onnx") != onnx.__version__:
        saved = _selection_now()
    why = lambda name: next(w for pat, w in EXCLUDED.items() if re.search(pat, name))  # noqa: E731
    return saved["run"], {name: why(name) for name in saved["excluded"]}


CASES, EXCLUSIONS = _selection()


def _case(name: str):
    return next(c for c in _all_cases() if c.name == name)


def test_node_case_count():
    print(f"\nONNX node tests through npuc: {len(CASES)} run, {len(EXCLUSIONS)} excluded")
    for name, why in sorted(EXCLUSIONS.items()):
        print(f"  excluded {name}: {why}")
    assert len(CASES) >= 250


def test_selection_file_is_current():
    """The names collection used are the selection the installed onnx gives today."""
    now = _selection_now()
    assert (CASES, sorted(EXCLUSIONS)) == (now["run"], now["excluded"]), (
        "the ONNX node-case selection changed; rewrite it: python tests/test_onnx_node.py --write"
    )


def test_every_exclusion_pattern_is_used():
    unused = [pat for pat in EXCLUDED if not any(re.search(pat, name) for name in EXCLUSIONS)]
    assert not unused, f"exclusion patterns that match no case (remove them): {unused}"


def _run_case(case, data_set) -> tuple[list[str], dict[str, np.ndarray]]:
    feeds = _feeds(case, data_set)
    graph = import_model(_bake_const_inputs(case.model, feeds))
    return graph.outputs, interp.run(graph, {name: feeds[name] for name in graph.inputs})


@pytest.mark.parametrize(
    "name",
    [
        "test_resize_downsample_scales_linear_align_corners",
        "test_resize_downsample_scales_cubic_align_corners",
    ],
)
def test_resize_align_corners_matches_onnxruntime(name):
    import onnxruntime as ort

    case = _case(name)
    outputs, results = _run_case(case, case.data_sets[0])
    session = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, _feeds(case, case.data_sets[0]))[0]
    np.testing.assert_allclose(results[outputs[0]], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_node(name):
    case = _case(name)
    for data_set in case.data_sets:
        outputs, results = _run_case(case, data_set)
        expected = data_set[1]
        assert len(outputs) == len(expected)
        for name, want in zip(outputs, expected, strict=True):
            got = results[name]
            want = _array(want)
            assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
            if want.dtype.kind in "fc":
                np.testing.assert_allclose(got, want, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-6))
            else:
                np.testing.assert_array_equal(got, want)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    SELECTION_FILE.write_text(json.dumps(_selection_now(), indent=1) + "\n")
    print(f"wrote {SELECTION_FILE}")
