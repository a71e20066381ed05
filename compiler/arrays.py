"""The one reader of .npy / .npz files: every header checked before a byte of data is read or decompressed.

An .npy header is parsed without evaluating code (numpy's literal parser), its dtype must be plain numbers,
and its shape times item size must fit the caller's budget and — for an archive member — agree with the
member's declared size. Archive members are streamed and read up to that size only, so a zip bomb or a
header claiming 1e11 elements is refused before any large allocation. Every failure is a CorruptFileError
(exit 2) naming the file and member.
"""

from __future__ import annotations

import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .errors import CorruptFileError, UserError

MAX_ARRAY_BYTES = 1 << 30  # one file's arrays, all members together (a 1x3x4096x4096 float32 input is 200 MB)
MAX_MEMBERS = 4096
_HEADER_ERRORS = (ValueError, SyntaxError, tokenize.TokenError, OSError, EOFError, zlib.error, zipfile.BadZipFile)
_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def read_npy_stream(f: BinaryIO, where: str, budget: int = MAX_ARRAY_BYTES, size: int | None = None) -> np.ndarray:
    """One .npy array from a stream; `size`: the stream's total length when known (archive members)."""
    try:
        version = np.lib.format.read_magic(f)
        header = _HEADERS.get(version)
        if header is None:
            raise ValueError(f"unsupported .npy version {version}")
        shape, fortran, dtype = header(f)
        offset = f.tell() if size is not None else 0
    except _HEADER_ERRORS as exc:
        raise CorruptFileError(f"{where}: not a .npy array ({_short(exc)}); save it with numpy.save") from None
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biuf":
        raise CorruptFileError(f"{where}: dtype {dtype} is not a plain number type; save float32 arrays")
    if any(d < 0 for d in shape):
        raise CorruptFileError(f"{where}: negative dimension in shape {shape}")
    count = 1
    for d in shape:  # exact integers: no overflow on absurd headers
        count *= int(d)
    nbytes = count * dtype.itemsize
    if nbytes > budget:
        raise CorruptFileError(
            f"{where}: shape {'x'.join(map(str, shape)) or 'scalar'} of {dtype} is {nbytes} bytes, more than the "
            f"{budget}-byte limit; check the file"
        )
    if size is not None and offset + nbytes != size:
        raise CorruptFileError(f"{where}: header promises {nbytes} data bytes but the member holds {size - offset}")
    try:
        data = f.read(nbytes)
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile) as exc:
        raise CorruptFileError(f"{where}: damaged data ({_short(exc)}); re-save it") from None
    if len(data) != nbytes:
        raise CorruptFileError(f"{where}: truncated ({len(data)} of {nbytes} data bytes); re-save it")
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape, order="F" if fortran else "C")


def open_npz(path: Path) -> zipfile.ZipFile:
    """The archive, its member list checked against the budget (declared sizes, before any decompression)."""
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise UserError(f"{path}: file not found; check the path") from None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, NotImplementedError) as exc:
        raise CorruptFileError(f"{path}: not a readable .npz ({_short(exc)}); re-save it with numpy.savez") from None
    members = archive.infolist()
    declared = sum(m.file_size for m in members)
    if len(members) > MAX_MEMBERS or declared > MAX_ARRAY_BYTES:
        archive.close()
        raise CorruptFileError(
            f"{path}: {len(members)} members expanding to {declared} bytes exceed the {MAX_ARRAY_BYTES}-byte limit"
        )
    return archive


def read_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo, where: str) -> np.ndarray:
    try:
        with archive.open(member) as f:
            return read_npy_stream(f, where, MAX_ARRAY_BYTES, size=member.file_size)
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile, NotImplementedError, RuntimeError) as exc:
        raise CorruptFileError(f"{where}: damaged member ({_short(exc)}); re-save it") from None


def member_key(member: zipfile.ZipInfo) -> str:
    return member.filename.removesuffix(".npy")


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Arrays from an .npz (by key) or .npy (one unnamed array, key '')."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"input file not found: {path}; check the path")
    if path.suffix.lower() == ".npy":
        try:
            with path.open("rb") as f:
                return {"": read_npy_stream(f, str(path), size=path.stat().st_size)}
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}; check the file") from None
    with open_npz(path) as archive:
        return {member_key(m): read_member(archive, m, f"{path}[{member_key(m)}]") for m in archive.infolist()}


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:160]
