"""`-o` that names no writable file or folder is one line and exit 2; folder outputs are swapped in one step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from npuc.compiler.errors import UserError
from npuc.compiler.fileio import _exchange, atomic_write_bytes, atomic_write_tree
from npuc.models.make_models import make_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("out") / "tinycnn.onnx"
    path.write_bytes(make_model("tinycnn").SerializeToString())
    return path


def _build(model: Path, target: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    extra = ["--quant", "bf16"] if target == "cv18xx" else []
    return subprocess.run(
        [sys.executable, "-m", "npuc", "build", str(model), "--target", target, *extra, *args],
        capture_output=True, text=True, check=False, cwd=cwd,
    )  # fmt: skip


@pytest.mark.parametrize(
    "target, output, message",
    [
        ("cv18xx", "/dev/null", "is not a regular file"),
        ("cv18xx", "", "names no file"),
        ("cv18xx", ".", "names no file"),
        ("cv18xx", "{tmp}", "is a folder"),
        ("cv18xx", "/proc/npuc-test.cvimodel", "cannot write /proc/npuc-test.cvimodel"),
        ("cv18xx", "x" * 300, "longer than 255 bytes"),
        ("lyngor", ".", "names no folder"),
        ("lyngor", "/proc/npuc-test", "cannot write /proc/npuc-test"),
        ("dmp", "d" * 300, "longer than 255 bytes"),
        ("dmp", "{tmp}/file.txt", "is a file"),
    ],
)
def test_bad_outputs_are_one_line(model: Path, tmp_path: Path, target: str, output: str, message: str) -> None:
    (tmp_path / "file.txt").write_text("keep")
    before = sorted(os.listdir("/dev"))
    run = _build(model, target, "-o", output.format(tmp=tmp_path), cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("npuc: error: ") and run.stderr.count("\n") == 1 and message in run.stderr
    assert sorted(os.listdir("/dev")) == before  # nothing like /dev/null.cvimodel appears
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"] and (tmp_path / "file.txt").read_text() == "keep"


def test_exchange_swaps_two_folders(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("new")
    (b / "x").write_text("old")
    assert _exchange(a, b)  # Linux: renameat2(RENAME_EXCHANGE)
    assert (b / "x").read_text() == "new" and (a / "x").read_text() == "old"


def test_rebuilding_a_folder_replaces_it_and_leaves_no_temporaries(tmp_path: Path) -> None:
    out = tmp_path / "tree"
    atomic_write_tree(out, {"a.txt": b"1", "sub/b.txt": b"2"})
    atomic_write_tree(out, {"a.txt": b"3"})
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["a.txt"]
    assert (out / "a.txt").read_bytes() == b"3" and sorted(os.listdir(tmp_path)) == ["tree"]


def test_a_failed_write_keeps_the_old_tree(tmp_path: Path) -> None:
    out = tmp_path / "tree"
    atomic_write_tree(out, {"a.txt": b"old"})

    def fail(_: Path) -> None:
        raise UserError("the finishing step failed")

    with pytest.raises(UserError, match="finishing step"):
        atomic_write_tree(out, {"a.txt": b"new"}, finish=fail)
    assert (out / "a.txt").read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["tree"]


def test_temporaries_of_killed_runs_are_cleaned(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".tree.npuc-{int(dead.stdout)}.abc123"
    live = tmp_path / f".tree.npuc-{os.getpid()}.def456"  # a concurrent run of a live process is left alone
    for folder in (stale, live):
        folder.mkdir()
        (folder / "half.bin").write_bytes(b"\0")
    atomic_write_tree(tmp_path / "tree", {"a.txt": b"1"})
    assert sorted(os.listdir(tmp_path)) == sorted(["tree", live.name])


def test_file_output_in_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        atomic_write_bytes(tmp_path / "no" / "x.bin", b"")


@pytest.mark.parametrize("target", ["cv18xx", "lyngor", "dmp"])
def test_every_target_refuses_a_missing_output_folder_alike(model: Path, tmp_path: Path, target: str) -> None:
    """-o is the exact path given; a missing parent folder is refused the same way by every target."""
    run = _build(model, target, "-o", str(tmp_path / "missing" / "out"), cwd=tmp_path)
    assert run.returncode == 2
    assert f"output folder {tmp_path / 'missing'} does not exist" in run.stderr
    assert not (tmp_path / "missing").exists()
