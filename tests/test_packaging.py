"""The wheel: built without packaging warnings, declaring what pictures need (Pillow for headers, OpenCV for
decoding and resizing), and complete: installed on its own (dependencies from the test environment), it
calibrates a model on JPEG photos."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("source") / "npuc"  # setuptools builds in the source tree: a copy of it
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "out", "*.egg-info",
                                                                "__pycache__", ".*_cache"))  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", str(source), "--no-deps", "-w", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = out.glob("npuc-*.whl")
    return path, done.stdout + done.stderr


def test_the_wheel_declares_its_picture_dependencies_and_builds_cleanly(wheel: tuple[Path, str]) -> None:
    path, log = wheel
    with zipfile.ZipFile(path) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line.split(":", 1)[1].strip().lower() for line in archive.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:") and "extra ==" not in line]  # fmt: skip
    names = {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for r in requires}
    assert {"pillow", "opencv-python-headless", "onnx", "numpy"} <= names
    # what setuptools says about the project's configuration (`BuildBackendWarning: project.license as a TOML
    # table is deprecated`, packages that "would be ignored"); pip's and the index's notes are not ours
    warnings = re.findall(r".*\b\w+Warning: .*|.*would be ignored.*", log)
    assert not warnings, warnings[:5]


def test_the_installed_wheel_calibrates_on_jpeg_photos(wheel: tuple[Path, str], tmp_path: Path) -> None:
    from PIL import Image

    path, _ = wheel
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), "-q", str(path)],
                   check=True, capture_output=True)  # fmt: skip
    photos = tmp_path / "photos"
    photos.mkdir()
    y, x = np.mgrid[0:120, 0:160]
    for i in range(3):
        rgb = np.stack([(x * (i + 1) + y * c) % 256 for c in range(3)], -1).astype(np.uint8)
        Image.fromarray(rgb).save(photos / f"{i}.jpg", quality=90)
    env = {**os.environ, "PYTHONPATH": str(site)}  # the wheel's npuc, not the repository's
    code = "import npuc, sys; print(npuc.__file__); from npuc.models.make_models import make_all; " \
           "make_all(sys.argv[1], ['tinycnn'])"  # fmt: skip
    where = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], env=env, cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert where.startswith(str(site))
    table = tmp_path / "t.txt"
    done = subprocess.run(
        [sys.executable, "-m", "npuc", "calibrate", str(tmp_path / "m" / "tinycnn.onnx"), "--data", str(photos),
         "--mean", "127.5", "--scale", "0.0078125", "--keep-aspect-ratio", "-o", str(table)],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "keep_aspect_ratio=yes" in table.read_text()
