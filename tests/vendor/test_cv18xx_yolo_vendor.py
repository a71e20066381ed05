"""YOLOv8n (Ultralytics export, nudenet 320n) on CV18xx: C2f splits, SiLU, SPPF, nearest upsampling, the DFL
softmax as the runtime's CPU softmax between two TPU routines. bf16 and int8 builds run on the vendor simulator
with the same bits as `npuc run`; the outputs are compared with onnxruntime.

The int8 build is what `npuc calibrate` and `npuc build --calib` give by default: the decode stays in bf16
(the float pattern, passes/calibration/float_patterns.py: boxes (0..320) and class scores (0..1) would share one int8
scale at the final concat), and the threshold method is the one measured best on the network
(passes/calibration/method_choice.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from metrics import box_iou, cosine, yolo_detections

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.models.images import model_inputs
from npuc.passes.calibration.float_patterns import detection_decode

from .cv18xx_build_util import float_graph, real_model_shapes
from .cv18xx_sim import run_vendor

NAME = "yolov8n_320"
MIN_COSINE = {"bf16": 0.9999, "int8": 0.995}


def decode_tail(model: Path) -> list[str]:
    """The ops of the detection head's decode, as the default calibration's qtable lists them."""
    return detection_decode(float_graph(model, real_model_shapes(NAME)))


@pytest.fixture(scope="module")
def yolo(yolo_default) -> tuple[Path, Path, dict[str, np.ndarray]]:  # noqa: ANN001
    """The model, `npuc calibrate`'s default table (and qtable) from photos 1-7, and photo 0 to test on."""
    model, table, feeds = yolo_default
    return model, table, feeds[0]


@pytest.mark.parametrize("chip", ["cv181x", "cv183x"])
@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_yolov8n_runs_bit_exactly_on_the_vendor_simulator(yolo, tmp_path: Path, quant: str, chip: str) -> None:
    """Built as a user builds it: the default calibration's table and qtable (the decode in bf16)."""
    import npuc

    model, table, feed = yolo
    out = tmp_path / f"yolo_{quant}.cvimodel"
    result = npuc.build(model, "cv18xx", out, chip=chip, quant=quant, calib=table if quant == "int8" else None,
                        input_shapes=real_model_shapes(NAME))  # fmt: skip
    if quant == "int8":
        assert result.summary["qtable_bf16_layers"] == decode_tail(model)
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
    # after non-maximum suppression: the float model's detections (one face on the astronaut photo), same
    # classes, boxes overlapping by IoU >= 0.9 (measured int8: 0.91 with the default calibration, 0.71-0.78
    # with a KL table)
    want, found = yolo_detections(reference), yolo_detections(got.reshape(reference.shape))
    assert want and [c for c, _ in found] == [c for c, _ in want]
    assert all(box_iou(a, b) >= 0.9 for (_, a), (_, b) in zip(found, want, strict=True))


def test_feeds_are_real_photos() -> None:
    (feed,) = model_inputs(NAME, 1)
    x = feed["images"]
    assert x.shape == (1, 3, 320, 320) and 0.0 <= x.min() and x.max() <= 1.0 and x.std() > 0.1
