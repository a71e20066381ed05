"""Real deployment cvimodels built by others with tpu-mlir v1.21 (../shared/golden/cv18xx_public/): npuc's
simulator gives the vendor simulator's outputs bit for bit on the same seeded input, read in place."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from golden import GOLDEN_ROOT

from npuc.backends.cv18xx.container import DTYPES, read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel

from .cv18xx_sim import run_vendor

PUBLIC = GOLDEN_ROOT / "cv18xx_public"
EXACT = [
    "cls_attribute_gender_age_glass_mask_112_112_INT8_cv181x",  # attribute classifier
    "cls_keypoint_hand_gesture_1_42_INT8_cv181x",  # matmul layouts
    "keypoint_face_v2_64_64_INT8_cv181x",
    "mbv2_det_person_256_384_INT8_cv181x",
    "recognition_license_plate_24_96_MIX_cv181x",  # int8 + bf16, TPU softmax (exponent-index lookups)
    "scrfd_det_face_432_768_INT8_cv181x",  # CPU interp (nearest)
    "topformer_seg_person_face_vehicle_384_640_INT8_cv181x",  # CPU argmax_v3, two outputs
    "yolov8n_det_coco80_640_640_INT8_cv181x",
    "yolov8n_det_hand_mv3_384_640_INT8_cv181x",  # grouped convs split over lanes: filters in the result's lanes
]


def seeded_feeds(path: Path, seed: int = 7) -> dict[str, np.ndarray]:
    """A uniform random input per model input, in the stored dtype's range (float inputs in [-1, 1])."""
    prog = read_cvimodel(path).body.programs[0]
    tensors = {t.name: t for t in prog.tensor_map}
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in prog.input_tensors:
        t = tensors[name]
        shape, dtype = tuple(t.shape.dim[:4]), np.dtype(DTYPES[t.dtype])
        if dtype.kind == "f":
            feeds[name] = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        else:
            info = np.iinfo(dtype)
            feeds[name] = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    return feeds


def test_every_public_model_is_listed() -> None:
    assert sorted(p.stem for p in PUBLIC.glob("*.cvimodel")) == sorted(EXACT)


@pytest.mark.parametrize("stem", EXACT)
def test_npuc_simulator_equals_vendor_bit_for_bit(stem: str) -> None:
    path = PUBLIC / f"{stem}.cvimodel"
    feeds = seeded_feeds(path)
    theirs = run_vendor(path, feeds)
    ours = run_cvimodel(read_cvimodel(path), feeds)
    assert list(ours) == list(theirs) and theirs
    for name, value in theirs.items():
        got = ours[name].reshape(value.shape)
        assert got.dtype == value.dtype, name
        assert np.array_equal(got.view(np.uint8), value.view(np.uint8)), name
