"""An NHWC model input (a TensorFlow-style export: the input, then a transpose to NCHW) on cv18xx.

The input is fed as the model declares it, NHWC, and the TPU transposes it right after the step that makes it
TPU data: the CPU quant routine's int8 output, the TPU's bf16 conversion, or the int8 input itself with
--quant-input. Each way, `npuc run` equals the vendor simulator bit for bit, and equals the build of the same
network fed NCHW (the transpose moves bytes and nothing else).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.models.make_models import make_model
from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate
from npuc.passes.calibration.calitable import write_table

from .cv18xx_build_util import build
from .cv18xx_sim import run_vendor

NHWC = (1, 16, 16, 8)
WAYS = {"int8": ("int8", {}), "int8_quant_input": ("int8", {"quant_input": True}), "bf16": ("bf16", {})}


def _nchw_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same network without its leading transpose: an NCHW input."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    graph = twin.graph
    first = graph.node[0]
    assert first.op_type == "Transpose"
    for node in graph.node[1:]:
        node.input[:] = ["input" if name == first.output[0] else name for name in node.input]
    graph.node.remove(first)
    dims = graph.input[0].type.tensor_type.shape.dim
    for dim, size in zip(dims, (NHWC[0], NHWC[3], NHWC[1], NHWC[2])):
        dim.dim_value = size
    return twin


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, list[np.ndarray]]:
    """(NHWC model, NCHW twin, a table valid for both, NHWC feeds)."""
    folder = tmp_path_factory.mktemp("nhwc")
    nhwc, nchw = folder / "nhwc_input.onnx", folder / "nchw_twin.onnx"
    model = make_model("nhwc_input")
    onnx.save(model, nhwc)
    onnx.save(_nchw_twin(model), nchw)
    rng = np.random.default_rng(3)
    feeds = [rng.standard_normal(NHWC).astype(np.float32) for _ in range(6)]
    samples = []
    for i, x in enumerate(feeds[:4]):
        samples.append(folder / f"s{i}.npz")
        np.savez(samples[-1], input=x)
    table = folder / "table.txt"
    write_table(calibrate(nhwc, samples, options=CalibrationOptions(method="max")).table, table)
    return nhwc, nchw, table, feeds


def _input_record(model) -> object:
    prog = model.body.programs[0]
    return next(t for t in prog.tensor_map if t.name == prog.input_tensors[0])


def _feed(x: np.ndarray, options: dict, model) -> np.ndarray:
    if not options.get("quant_input"):
        return x
    scale = _input_record(model).quant.qscale  # the int8 input is round(x * qscale)
    return np.clip(np.round(x * scale), -128, 127).astype(np.int8)


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
@pytest.mark.parametrize("way", WAYS)
def test_nhwc_input_equals_vendor_and_the_nchw_build(models, way: str, chip: str, tmp_path: Path) -> None:
    nhwc, nchw, table, feeds = models
    quant, options = WAYS[way]
    calib = table if quant == "int8" else None
    ours_path = build(nhwc, calib, chip, quant, tmp_path / "nhwc.cvimodel", **options)
    twin_path = build(nchw, calib, chip, quant, tmp_path / "nchw.cvimodel", **options)
    model = read_cvimodel(ours_path)
    assert tuple(_input_record(model).shape.dim[:4]) == NHWC
    for x in feeds[4:]:
        fed = _feed(x, options, model)
        ours = run_cvimodel(model, {"input": fed})["output"]
        vendor = run_vendor(ours_path, {"input": fed})["output"].reshape(ours.shape)
        twin = run_cvimodel(read_cvimodel(twin_path), {"input": np.ascontiguousarray(fed.transpose(0, 3, 1, 2))})
        assert np.array_equal(ours.view(np.uint8), np.ascontiguousarray(vendor).view(np.uint8))
        assert np.array_equal(ours, twin["output"])
        assert len(np.unique(ours)) > 50  # a real result (int8 after ReLU: at most 128 values)
