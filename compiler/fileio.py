"""File output that never leaves a partial artifact: write beside the target, then rename."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .errors import UserError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"output folder {path.parent} does not exist; create it or choose another -o")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_tree(
    output: Path,
    files: dict[str, bytes],
    finish: Callable[[Path], None] | None = None,
    what: str = "this target",
    make_parent: bool = False,
) -> None:
    """Write `files` (relative path -> bytes) into a temporary folder beside `output`, run `finish(tmp)`, then
    swap the folder into place; a failure at any point leaves `output` as it was."""
    output = Path(output)
    if make_parent:
        output.parent.mkdir(parents=True, exist_ok=True)
    if not output.parent.is_dir():
        raise UserError(f"output folder {output.parent} does not exist; create it or choose another -o")
    if output.exists() and not output.is_dir():
        raise UserError(f"{output} is a file; {what} writes a folder, choose another -o")
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        for rel, data in sorted(files.items()):
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            os.chmod(path, 0o644)
        if finish is not None:
            finish(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; artifacts are meant to be shared
        old = None
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
            os.replace(output, old / output.name)
        os.replace(tmp, output)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())
