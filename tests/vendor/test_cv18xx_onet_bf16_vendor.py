"""MTCNN O-Net in bf16 on cv183x over 31 real face crops: bit-exact against the vendor simulator, close to
onnxruntime.

The crops are scikit-image's LFW faces 16..46 (the ones bench/vs_tpumlir.py scores, prepared as the face
pipeline feeds O-Net). The FC layers are TIU matrix multiplies: their float32 sums are rounded toward zero in
the TIU's order (position 0 of every K column group, then position 1, ..., the bias last;
compiler/toward_zero.accumulate_products). A simulator that summed them exactly and rounded once gave
the box output (dense_5) one bf16 ulp off the vendor's on crops 25 and 37, so this test fails on it.

Measured over the 31 crops, cosine of each output to onnxruntime float (worst crop): dense_5 (box) 0.999982,
dense_6 (landmarks) 0.999996, softmax_2 (face probability) 0.9999999998.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel

from .cv18xx_build_util import build
from .cv18xx_sim import run_vendor

CROPS = range(16, 47)
# output -> lowest cosine to onnxruntime over the crops (measured minimum, rounded down)
MIN_COSINE = {"dense_5": 0.99995, "dense_6": 0.99999, "softmax_2": 0.999999}


@pytest.fixture(scope="module")
def runs(real_model, tmp_path_factory) -> list[tuple[dict, dict, dict]]:  # noqa: ANN001
    """(npuc's simulator, the vendor simulator, onnxruntime) outputs for each crop of one cv183x bf16 build."""
    from npuc.models.images import face_crops, preprocess

    model = real_model("mtcnn_onet")
    path = build(model, None, "cv183x", "bf16", tmp_path_factory.mktemp("onet_bf16") / "onet.cvimodel")
    cvimodel = read_cvimodel(path)
    session = ort.InferenceSession(str(model))
    names = [o.name for o in session.get_outputs()]
    crops = face_crops()
    results = []
    for i in CROPS:
        feed = {"input_3": preprocess(crops[i], "mtcnn_onet")}
        results.append((run_cvimodel(cvimodel, feed), run_vendor(path, feed),
                        dict(zip(names, session.run(None, feed)))))  # fmt: skip
    return results


def test_onet_bf16_equals_vendor_bit_for_bit(runs) -> None:  # noqa: ANN001
    differing = []
    for i, (ours, vendor, _) in zip(CROPS, runs, strict=True):
        assert set(ours) == set(vendor) == set(MIN_COSINE)
        for name, value in ours.items():
            theirs = vendor[name].reshape(value.shape)
            assert value.dtype == theirs.dtype == np.float32
            if not np.array_equal(value.view(np.uint32), theirs.view(np.uint32)):
                differing.append((i, name, np.flatnonzero(value.ravel() != theirs.ravel()).tolist()))
    assert differing == []  # (crop, output, element indices) that differ


def test_onet_bf16_follows_onnxruntime(runs) -> None:  # noqa: ANN001
    for name, floor in MIN_COSINE.items():
        cosines = []
        for ours, _, reference in runs:
            a, b = ours[name].ravel().astype(np.float64), reference[name].ravel().astype(np.float64)
            cosines.append(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        assert min(cosines) >= floor, (name, min(cosines))
    # the face crops are faces: the bf16 face probability agrees with float on every crop within 1e-3
    faces = np.array([ours["softmax_2"].ravel()[1] for ours, _, _ in runs])
    floats = np.array([reference["softmax_2"].ravel()[1] for _, _, reference in runs])
    assert np.all(np.abs(faces - floats) < 1e-3)
    assert np.median(floats) > 0.9
