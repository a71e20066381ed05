"""YOLOv8n (Ultralytics export, nudenet 320n) on CV18xx: C2f splits, SiLU, SPPF, nearest upsampling, the DFL
softmax as the runtime's CPU softmax between two TPU routines. bf16 and int8 builds run on the vendor simulator
with the same bits as `npuc run`; the outputs are compared with onnxruntime.

The int8 build keeps the box/score decode in bf16, as `npuc calibrate` does by default (its float pattern,
passes/float_patterns.py): boxes (0..320) and class scores (0..1) share one int8 scale at the final concat
otherwise, and a KL threshold of that concat clips the boxes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from metrics import cosine
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.models.images import model_inputs
from npuc.passes.float_patterns import detection_decode

from .cv18xx_build_util import build, float_graph, real_model_shapes, real_model_table
from .cv18xx_sim import run_vendor

NAME = "yolov8n_320"
MIN_COSINE = {"bf16": 0.9999, "int8": 0.995}


def decode_tail(model: Path) -> list[str]:
    """The ops of the detection head's decode, as the default calibration's qtable lists them."""
    return detection_decode(float_graph(model, real_model_shapes(NAME)))


@pytest.fixture(scope="module")
def yolo(real_model, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    model = real_model(NAME)
    folder = tmp_path_factory.mktemp("yolo")
    table, feeds = real_model_table(NAME, model, folder, samples=8)
    return model, table, feeds[0]


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_yolov8n_runs_bit_exactly_on_the_vendor_simulator(yolo, tmp_path: Path, quant: str) -> None:
    model, table, feed = yolo
    options = {"float_layers": decode_tail(model)} if quant == "int8" else {}
    out = build(model, table if quant == "int8" else None, "cv181x", quant, tmp_path / f"yolo_{quant}.cvimodel",
                real_model_shapes(NAME), **options)  # fmt: skip
    cvimodel = read_cvimodel(out)
    routines = cvimodel.body.programs[0].routines
    assert [r.cpu_routine.function_section for r in routines if r.cpu_routine is not None][-1] == "softmax"
    assert len(cvimodel.cmdbufs()) == 2  # the DFL softmax splits the TPU program in two
    ours = run_cvimodel(cvimodel, feed)
    theirs = run_vendor(out, feed)
    reference = ort.InferenceSession(str(model)).run(None, feed)[0]
    (name,) = theirs
    got = ours[name].reshape(theirs[name].shape)
    assert np.array_equal(got.view(np.uint8), theirs[name].view(np.uint8))
    assert cosine(got.reshape(reference.shape), reference) >= MIN_COSINE[quant]


def test_feeds_are_real_photos() -> None:
    (feed,) = model_inputs(NAME, 1)
    x = feed["images"]
    assert x.shape == (1, 3, 320, 320) and 0.0 <= x.min() and x.max() <= 1.0 and x.std() > 0.1
