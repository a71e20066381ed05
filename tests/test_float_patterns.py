"""The float patterns calibration applies by default (passes/calibration/float_patterns.py), as tpu-mlir's pattern-match
qtable does: a detector's decode stays bf16, and the default calibrate -> build of YOLOv8n reaches the float
model where plain int8 does not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from metrics import cosine

import npuc
from npuc.frontends.onnx import import_onnx
from npuc.models.fetch import get_model
from npuc.models.images import model_inputs
from npuc.passes.calibration.float_patterns import detection_decode, pattern_layers
from npuc.passes.calibration.qtable import beside, read_qtable
from npuc.passes.rewrite.canonicalize import canonicalize


def _graph(path: Path, name: str):  # noqa: ANN202
    spec = get_model(name)
    graph = import_onnx(path, {spec.input_name: spec.input_shape})
    canonicalize(graph)
    return graph


def test_yolov8_decode_from_the_level_concat(real_model) -> None:  # noqa: ANN001
    graph = _graph(real_model("yolov8n_320"), "yolov8n_320")
    layers = detection_decode(graph)
    by_name = {op.name: op for op in graph.ops}
    joins = [by_name[n] for n in layers if by_name[n].kind == "concat" and len(by_name[n].inputs) == 3]
    assert [{graph.shape(n)[2] for n in j.inputs} for j in joins] == [{1600, 400, 100}]  # the levels, flattened
    assert sum(by_name[n].kind == "conv2d" for n in layers) == 7  # the levels' last box and class convs, DFL
    assert len(layers) == 30 and graph.outputs[0] in by_name[layers[-1]].outputs
    assert {by_name[n].kind for n in layers} >= {"softmax", "split", "concat", "activation", "reshape"}


@pytest.mark.parametrize("name", ["pplcnet_orientation", "ppocrv6_rec_tiny", "mtcnn_rnet"])
def test_other_models_have_no_pattern(real_model, name: str) -> None:  # noqa: ANN001
    assert pattern_layers(_graph(real_model(name), name)) == {}


def test_score_heads_stay_float(real_model) -> None:  # noqa: ANN001
    """PicoDet's four class-score sigmoids and the reshapes/transposes carrying them to the outputs; its box
    heads (no sigmoid) stay int8. Measured (12 calibration documents, 8 held out, worst output cosine): the
    default calibration 0.45 -> 0.81 with them in bf16."""
    graph = _graph(real_model("picodet_layout"), "picodet_layout")
    found = pattern_layers(graph)
    assert list(found) == ["probability output"]
    by_name = {op.name: op for op in graph.ops}
    kinds = [by_name[n].kind for n in found["probability output"]]
    assert kinds.count("activation") == 4 and len(kinds) == 12
    assert {by_name[n].attrs.act.kind for n in found["probability output"] if by_name[n].kind == "activation"} == {
        "sigmoid"
    }


def test_default_calibrate_and_build_reach_the_float_yolov8(real_model, tmp_path: Path) -> None:  # noqa: ANN001
    model = real_model("yolov8n_320")
    feeds = model_inputs("yolov8n_320", 10)
    data = tmp_path / "data"
    data.mkdir()
    for i, feed in enumerate(feeds[:8]):
        np.savez(data / f"{i}.npz", **feed)
    table = tmp_path / "t.txt"
    shape = ["--input-shape", "images:1,3,320,320"]
    run = subprocess.run([sys.executable, "-m", "npuc", "calibrate", str(model), "--data", str(data), "-o", str(table),
                          *shape], capture_output=True, text=True, check=False)  # fmt: skip
    assert run.returncode == 0 and "the detection decode pattern keeps 30 layer(s) in float" in run.stderr
    assert len(read_qtable(beside(table))) == 30
    out = tmp_path / "yolo.cvimodel"
    result = npuc.build(model, "cv18xx", out, calib=table, input_shapes=shape[1:])
    assert len(result.summary["qtable_bf16_layers"]) == 30
    session = ort.InferenceSession(str(model))
    for feed in feeds[8:]:  # photos the calibration did not see; plain int8 measures 0.89-0.91 here
        want = session.run(None, feed)[0]
        got = npuc.run(out, feed)["output0"]
        assert cosine(np.asarray(got).reshape(want.shape), want) >= 0.998
    # opting out leaves plain int8, and takes the earlier qtable away
    run = subprocess.run([sys.executable, "-m", "npuc", "calibrate", str(model), "--data", str(data), "-o", str(table),
                          *shape, "--no-float-patterns"], capture_output=True, text=True, check=False)  # fmt: skip
    assert run.returncode == 0 and f"removed {beside(table)}" in run.stderr and not beside(table).exists()
