"""File output that never leaves a partial artifact: write beside the target, then rename."""

from __future__ import annotations

import errno
import glob
import io
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .errors import UserError


def read_limited(path: Path, what: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`, or a one-line UserError. The size is checked on the
    open file (a link to /dev/zero is refused as a device) and the read stops one byte past that size, so a file
    growing meanwhile never costs more than `max_bytes` of memory."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise UserError(f"{path}: not a regular file (a device, pipe or folder); pass the {what} file")
            if info.st_size > max_bytes:
                raise UserError(f"{path}: {info.st_size} bytes is too large for a {what} (at most {max_bytes})")
            data = f.read(info.st_size + 1)  # read(n) reserves n bytes: ask for what the file holds, plus one
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}; check the path") from None
    if len(data) > info.st_size:
        raise UserError(f"{path}: the {what} grew while it was read; read it again once it is complete")
    return data


def read_text_file(path: Path, what: str, max_bytes: int) -> str:
    """A UTF-8 text input of at most `max_bytes` (`what`: "calibration table", ...), or a one-line UserError."""
    data = read_limited(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: byte {exc.start} is not UTF-8 text; pass a tpu-mlir {what}") from None


def check_output_file(path: Path) -> Path:
    """An output file path that names a file (not a folder, device or nothing) in an existing folder."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise UserError(f"-o {str(path)!r} names no file; give a file path such as out/model.bin")
    _check_name_length(path)
    if path.is_dir():
        raise UserError(f"-o {path} is a folder; give a file path inside it, such as {path / 'model'}")
    if path.exists() and not path.is_file():
        raise UserError(f"-o {path} is not a regular file (a device or pipe); give a file path")
    if not path.parent.is_dir():
        raise UserError(f"output folder {path.parent} does not exist; create it or choose another -o")
    return path


NAME_MAX = 255  # bytes in one path component on Linux file systems


def _check_name_length(path: Path) -> None:
    if len(os.fsencode(path.name)) > NAME_MAX:
        raise UserError(f"-o {path.name[:40]}...: the name is longer than {NAME_MAX} bytes; choose a shorter -o")


def _cannot_write(path: Path, exc: OSError) -> UserError:
    reason = exc.strerror or type(exc).__name__
    return UserError(f"cannot write {path}: {reason}; choose a writable folder for -o and shorter names (-o, --name)")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = check_output_file(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", dir=path.parent)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are meant to be shared
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _cannot_write(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_tree(
    output: Path,
    files: dict[str, bytes],
    finish: Callable[[Path], None] | None = None,
    what: str = "this target",
) -> None:
    """Write `files` (relative path -> bytes) into a temporary folder beside `output`, run `finish(tmp)`, then
    swap the folder into place; a failure at any point leaves `output` as it was."""
    output = Path(output)
    if output.name in ("", ".", ".."):
        raise UserError(f"-o {str(output)!r} names no folder; give a new or existing output folder such as out/model")
    _check_name_length(output)
    if not output.parent.is_dir():
        raise UserError(f"output folder {output.parent} does not exist; create it or choose another -o")
    if output.exists() and not output.is_dir():
        raise UserError(f"{output} is a file; {what} writes a folder, choose another -o")
    _remove_stale_temps(output)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(output, os.getpid()), dir=output.parent))
    except OSError as exc:
        raise _cannot_write(output, exc) from None
    try:
        for rel, data in sorted(files.items()):
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            os.chmod(path, 0o644)
        if finish is not None:
            finish(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; artifacts are meant to be shared
        if output.exists() and _exchange(tmp, output):
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old tree
        elif output.exists():  # no atomic exchange here: a kill between the renames leaves the old tree in tmp
            old = tmp.with_name(tmp.name + ".old")
            os.replace(output, old)
            os.replace(tmp, output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _cannot_write(output, exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE), so `b` is never missing; False where the
    system has no such call."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # kernel or file system without it
        return False
    raise OSError(err, os.strerror(err), str(b))


def _temp_prefix(output: Path, pid: int) -> str:
    return f".{output.name[:64]}.npuc-{pid}."


def _remove_stale_temps(output: Path) -> None:
    """Temporary folders of earlier runs for this output whose process is gone (killed mid-write)."""
    for stale in output.parent.glob(f".{glob.escape(output.name[:64])}.npuc-*"):
        pid = stale.name[len(f".{output.name[:64]}.npuc-") :].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())
