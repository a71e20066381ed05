"""What a target would ignore is refused: flags and --option keys it does not read, chips and number formats
it does not have, a table it does not use, --float-layers names that match nothing (one line, exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from samples import random_samples

from npuc.compiler.targets import all_targets
from npuc.models.make_models import make_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("options") / "tinycnn.onnx"
    path.write_bytes(make_model("tinycnn").SerializeToString())
    (path.parent / "t.txt").write_text("# a table that is never read\n")
    return path


CASES = [
    (["--target", "cv18xx", "--quant", "bf16", "--mean", "127"], "--mean describes the uint8 frame of fused prepro"),
    (["--target", "cv18xx", "--quant", "bf16", "--color", "bgr"], "--color describes the uint8 frame of fused prepro"),
    (["--target", "cv18xx", "--quant", "bf16", "--pixel-format", "nv21"], "--pixel-format describes the uint8 frame"),
    (["--target", "cv18xx", "--quant", "bf16", "--input-dtype", "float16"], "--input-dtype float16 is not a cv18xx in"),
    (["--target", "dmp", "--pixel-format", "nv21"], "--pixel-format is not used by target 'dmp' (it is for cv18xx)"),
    (["--target", "cv18xx", "--quant", "bf16", "--convert", "div_255"], "--convert is not used by target 'cv18xx'"),
    (["--target", "cv18xx", "--quant", "bf16", "--option", "nosuch=1"], "--option nosuch is not used by target"),
    (["--target", "cv18xx", "--quant", "bf16", "--float-layers", "nosuch"], "'nosuch' match no op or tensor"),
    (["--target", "cv18xx", "--quant", "fp16"], "--quant fp16 is not a number format of target 'cv18xx' (it is for"),
    (["--target", "dmp", "--chip", "dv800"], "--chip dv800 is not a chip of target 'dmp'; use one of dv700"),
    (["--target", "dmp", "--quant", "bf16"], "--quant bf16 is not a number format of target 'dmp' (it is for cv18xx)"),
    (["--target", "lyngor", "--calib", "{dir}/t.txt"], "--calib is not used by target 'lyngor'"),
    (["--target", "lyngor", "--quant-output"], "--quant-output is not used by target 'lyngor' (it is for bpu, cv18xx)"),
    (["--target", "dmp", "--weights", "{dir}/t.txt"], "--weights is for a Caffe .prototxt MODEL"),
]  # fmt: skip


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a[1:3]) + " " + a[-2] for a, _ in CASES])
def test_ignored_inputs_are_errors(model: Path, tmp_path: Path, args: list[str], message: str) -> None:
    args = [a.format(dir=model.parent) for a in args]
    run = subprocess.run(
        [sys.executable, "-m", "npuc", "build", str(model), *args, "-o", str(tmp_path / "out")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_every_target_declares_what_it_reads() -> None:
    for target in all_targets():
        assert target.quants and target.options and set(target.chips), target.name
    by_name = {t.name: t for t in all_targets()}
    assert {n for n, t in by_name.items() if t.uses_calib} == {"bm1880", "bpu", "cv18xx"}


def test_cv180x_builds_say_when_they_need_cpu_functions(model: Path, tmp_path: Path) -> None:
    """The cv180x runtime has no CPU functions: an int8 build's CPU quant routine is said, --quant-input not."""
    import npuc

    data = random_samples(tmp_path / "data", (1, 3, 32, 32), 3)
    table = tmp_path / "t.txt"
    npuc.calibrate(model, [data], table)
    plain = npuc.build(model, "cv18xx", tmp_path / "a.cvimodel", chip="cv180x", calib=table)
    assert any("the cv180x runtime has no CPU functions, and this model needs 1 (quant)" in n for n in plain.notes)
    fed = npuc.build(model, "cv18xx", tmp_path / "b.cvimodel", chip="cv180x", calib=table,
                     options={"quant_input": True})  # fmt: skip
    other = npuc.build(model, "cv18xx", tmp_path / "c.cvimodel", chip="cv181x", calib=table)
    assert not any("CPU functions" in n for n in [*fed.notes, *other.notes])


def test_a_table_made_for_another_model_is_one_line_exit_2(model: Path, tmp_path: Path) -> None:
    """A table whose rows name none of the model's tensors: exit 2 and nothing written; --allow-partial-table
    builds (those ops in bf16) and says so in a note."""
    import npuc

    other = tmp_path / "other.onnx"
    other.write_bytes(make_model("resnet_stem_tall").SerializeToString())
    table = tmp_path / "tinycnn.txt"
    npuc.calibrate(model, [random_samples(tmp_path / "data", (1, 3, 32, 32), 3)], table)
    cmd = [sys.executable, "-m", "npuc", "build", str(other), "--target", "cv18xx", "--calib", str(table)]
    run = subprocess.run([*cmd, "-o", str(tmp_path / "a.cvimodel")], capture_output=True, text=True, check=False)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "the calibration table was made for another model" in run.stderr and "--allow-partial-table" in run.stderr
    assert not (tmp_path / "a.cvimodel").exists()
    run = subprocess.run([*cmd, "--allow-partial-table", "-o", str(tmp_path / "b.cvimodel")], capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert run.returncode == 0 and "note: calibration table: " in run.stdout, run.stdout
    assert "tensor(s) without a threshold" in run.stdout and "Warning" not in run.stderr  # a note, not a warning


@pytest.mark.parametrize("value", ["no", "2", "yes please"])
def test_boolean_target_options_refuse_other_words(tmp_path: Path, value: str) -> None:
    """`--option transpose_weight=no` must not count as true (a non-empty string); one line, exit 2."""
    model = tmp_path / "m.onnx"
    model.write_bytes(make_model("tinycnn").SerializeToString())
    run = subprocess.run(
        [sys.executable, "-m", "npuc", "build", str(model), "--target", "dmp", "-o", str(tmp_path / "o"),
         "--option", f"transpose_weight={value}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and "give true or false" in run.stderr and not (tmp_path / "o").exists()


def test_uint8_input_without_pixel_format_says_which_frame(model: Path, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "npuc", "build", str(model), "--target", "cv18xx", "--quant", "bf16", "--input-dtype",
         "uint8", "-o", str(tmp_path / "m.cvimodel")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "note: --input-dtype uint8 without --pixel-format: the input takes a rgb_planar frame" in run.stdout
