"""`npuc run --input photo.jpg`: the picture prepared exactly as `npuc calibrate` prepares it (same options)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from npuc.models.make_models import make_model
from npuc.passes.calibration.preprocess import InputSpec, Preprocess, load_sample


def test_run_takes_a_picture_with_calibrates_preprocessing(tmp_path: Path) -> None:
    import skimage.data
    from PIL import Image

    model = tmp_path / "m.onnx"
    model.write_bytes(make_model("tinycnn").SerializeToString())
    picture = tmp_path / "astronaut.png"
    Image.fromarray(skimage.data.astronaut()).save(picture)
    pre = Preprocess(mean=(127.5,), scale=(0.0078125,), color="bgr", resize=(40, 40))
    feed = load_sample(picture, [InputSpec("input", (1, 3, 32, 32), np.dtype(np.float32))], pre)
    np.savez(tmp_path / "x.npz", **feed)
    common = [sys.executable, "-m", "npuc", "run", str(model)]
    flags = ["--mean", "127.5", "--scale", "0.0078125", "--color", "bgr", "--resize", "40,40"]
    via_picture = subprocess.run([*common, "--input", str(picture), *flags, "-o", str(tmp_path / "a.npz")],
                                 capture_output=True, text=True, check=False)  # fmt: skip
    via_array = subprocess.run([*common, "--input", str(tmp_path / "x.npz"), "-o", str(tmp_path / "b.npz")],
                               capture_output=True, text=True, check=False)  # fmt: skip
    assert via_picture.returncode == 0 and via_array.returncode == 0, via_picture.stderr + via_array.stderr
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
