"""`npuc calibrate --on-bad-sample fail|skip`: every sample is read once before the first pass; a damaged one
stops the run naming its path (default, nothing written) or is left out with a note."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from samples import random_samples

from npuc.models.make_models import make_model


def _npuc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npuc", *args], capture_output=True, text=True, check=False)


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    model = tmp_path / "m.onnx"
    model.write_bytes(make_model("tinycnn").SerializeToString())
    data = random_samples(tmp_path / "data", (1, 3, 32, 32), 3)
    bad = data / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0" + np.random.default_rng(0).bytes(200))  # a JPEG header, then noise
    return model, data, bad


def test_a_damaged_sample_stops_the_run_naming_its_path(tmp_path: Path) -> None:
    model, data, bad = _setup(tmp_path)
    run = _npuc("calibrate", str(model), "--data", str(data), "-o", str(tmp_path / "t.txt"))
    assert run.returncode == 2
    (line,) = [x for x in run.stderr.splitlines() if x.strip()]
    assert str(bad) in line and "--on-bad-sample skip" in line
    assert not (tmp_path / "t.txt").exists()


def test_skip_leaves_it_out_with_a_note(tmp_path: Path) -> None:
    model, data, bad = _setup(tmp_path)
    run = _npuc("calibrate", str(model), "--data", str(data), "-o", str(tmp_path / "t.txt"), "--on-bad-sample", "skip",
                "--method", "kl")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert f"skipped {bad}" in run.stderr
    clean = tmp_path / "clean"
    clean.mkdir()
    for p in sorted(data.glob("*.npy")):
        (clean / p.name).write_bytes(p.read_bytes())
    assert _npuc("calibrate", str(model), "--data", str(clean), "-o", str(tmp_path / "c.txt"),
                 "--method", "kl").returncode == 0  # fmt: skip
    rows = lambda p: [x for x in p.read_text().splitlines() if not x.startswith("#")]  # noqa: E731
    assert rows(tmp_path / "t.txt") == rows(tmp_path / "c.txt")  # the table of the usable samples


def test_unknown_policy_and_nothing_usable(tmp_path: Path) -> None:
    model, data, bad = _setup(tmp_path)
    run = _npuc("calibrate", str(model), "--data", str(data), "-o", str(tmp_path / "t.txt"), "--on-bad-sample", "x")
    assert run.returncode == 2 and "choose fail or skip" in run.stderr
    run = _npuc("calibrate", str(model), "--data", str(bad), "-o", str(tmp_path / "t.txt"), "--on-bad-sample", "skip")
    assert run.returncode == 2 and "none of the 1 samples can be used" in run.stderr
