"""`--depfile` for build and calibrate: every file read is a prerequisite (the model and its external data, the
table with its qtable and refine side file, each calibration sample and list), paths escaped for make."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
from samples import random_samples

from npuc.compiler.depfile import make_escape, onnx_external_files
from npuc.models.make_models import make_model


def _npuc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npuc", *args], capture_output=True, text=True, check=False)


def _rule(path: Path) -> tuple[list[str], list[str]]:
    """(targets, prerequisites) of a one-rule depfile, unescaping make's backslash-space."""
    text = path.read_text()
    assert text.endswith("\n") and text.count("\n") == 1
    left, right = text.rstrip("\n").split(": ", 1)
    split = lambda s: [w.replace("\0", " ") for w in s.replace("\\ ", "\0").split()]  # noqa: E731
    return split(left), split(right)


def test_make_escape() -> None:
    assert make_escape("a b/c#d$e") == "a\\ b/c\\#d$$e"


def test_calibrate_and_build_depfiles_name_every_input(tmp_path: Path) -> None:
    folder = tmp_path / "with space"
    folder.mkdir()
    model = folder / "m.onnx"
    proto = make_model("tinycnn")
    onnx.save(proto, str(model), save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=0)  # fmt: skip
    assert onnx_external_files(model) == [folder / "m.data"]
    samples = random_samples(folder / "samples", (1, 3, 32, 32), 4)
    table = folder / "t.txt"
    run = _npuc("calibrate", str(model), "--data", str(samples), "-o", str(table), "--depfile", str(folder / "c.d"))
    assert run.returncode == 0, run.stderr
    targets, deps = _rule(folder / "c.d")
    assert targets[0] == str(table)
    assert deps[:2] == [str(model), str(folder / "m.data")]
    assert deps[2:] == [str(p) for p in sorted(samples.iterdir())]
    layer = next(n.output[0] for n in proto.graph.node if n.op_type == "Relu")
    (folder / "t.txt.qtable").write_text(f"{layer} BF16\n")  # a qtable beside the table is read by the build
    run = _npuc("build", str(model), "--target", "cv18xx", "--calib", str(table), "-o", str(folder / "m.cvimodel"),
                "--depfile", str(folder / "b.d"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    targets, deps = _rule(folder / "b.d")
    assert targets == [str(folder / "m.cvimodel")]
    assert deps == [str(model), str(folder / "m.data"), str(table), str(folder / "t.txt.qtable")]
    assert "\\ " in (folder / "b.d").read_text()  # the space in the folder name is escaped
