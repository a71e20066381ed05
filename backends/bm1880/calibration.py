"""BMNet calibration tables (`NetCalibrationParameter`): binary `.pb2`, text `.prototxt`, plain text table.

BMNet's `in_ctable` is the binary protobuf; the `.prototxt` twin and the plain `name threshold rshift`
table carry the same numbers (specs/bm1880.md §3.1). Messages are built from `bmnet_calibration.proto`
at run time by npuc.compiler.protoschema.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.message import DecodeError, EncodeError

from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.fileio import read_limited
from npuc.compiler.protoschema import load_proto

MAX_TABLE_BYTES = 64 << 20  # one threshold per tensor: a few KB in practice

SCHEMA_PATH = Path(__file__).with_name("bmnet_calibration.proto")
TEXT_SUFFIXES = {".prototxt", ".pbtxt", ".txt"}


@lru_cache(maxsize=1)
def calibration_schema():
    """The BMNet calibration message classes (built once; the classes are immutable)."""
    return load_proto(SCHEMA_PATH)


def new_calibration(name: str = ""):
    """An empty `NetCalibrationParameter`."""
    msg = calibration_schema().NetCalibrationParameter()
    if name:
        msg.name = name
    return msg


def _check_complete(msg, source: str):
    if not msg.IsInitialized():
        missing = ", ".join(msg.FindInitializationErrors()[:3])
        raise CorruptFileError(f"{source}: calibration table lacks required fields ({missing}); regenerate the table")
    return msg


def parse_calibration_binary(data: bytes, source: str = "<ctable>"):
    """A `NetCalibrationParameter` from the binary protobuf (`.pb2`)."""
    try:
        msg = calibration_schema().NetCalibrationParameter.FromString(bytes(data))
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise CorruptFileError(
            f"{source}: not a binary BMNet calibration table ({exc}); pass the .pb2 file or use the text format"
        ) from None
    return _check_complete(msg, source)


def parse_calibration_text(text: str, source: str = "<ctable>"):
    """A `NetCalibrationParameter` from protobuf text format (`.prototxt`)."""
    msg = calibration_schema().NetCalibrationParameter()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        raise CorruptFileError(f"{source}:{exc}; fix the calibration table text") from None
    return _check_complete(msg, source)


def calibration_to_binary(msg) -> bytes:
    try:
        return msg.SerializeToString()
    except EncodeError as exc:
        raise ValueError(f"calibration table is incomplete: {exc}") from None


def calibration_to_text(msg) -> str:
    return text_format.MessageToString(msg)


def _is_text(path: Path, fmt: str | None) -> bool:
    if fmt not in (None, "text", "binary"):
        raise UserError(f"unknown calibration table format {fmt!r}; use 'text' or 'binary'")
    return fmt == "text" if fmt else path.suffix.lower() in TEXT_SUFFIXES


def load_calibration(path: str | Path, fmt: str | None = None):
    """Read a table; `fmt` "text"/"binary", or None to decide by suffix (.prototxt/.pbtxt/.txt = text)."""
    path = Path(path)
    data = read_limited(path, "calibration table", MAX_TABLE_BYTES)
    if _is_text(path, fmt):
        try:
            return parse_calibration_text(data.decode("utf-8"), str(path))
        except UnicodeDecodeError:
            raise CorruptFileError(f"{path}: not UTF-8 text; pass fmt='binary' for a .pb2 table") from None
    return parse_calibration_binary(data, str(path))


def save_calibration(msg, path: str | Path, fmt: str | None = None) -> None:
    """Write a table as binary or text (same suffix rule as load_calibration)."""
    path = Path(path)
    if _is_text(path, fmt):
        path.write_text(calibration_to_text(msg), encoding="utf-8")
    else:
        path.write_bytes(calibration_to_binary(msg))


def blob_thresholds(msg) -> dict[str, float]:
    """Blob name -> threshold_y over all layers' blob_param (later layers win on duplicates)."""
    return {blob.name: blob.threshold_y for layer in msg.layer for blob in layer.blob_param}


def layer_right_shifts(msg) -> dict[str, int]:
    """Layer name -> right_shift_width, for the layers that set it."""
    return {layer.name: layer.right_shift_width for layer in msg.layer if layer.HasField("right_shift_width")}


@dataclass(frozen=True)
class PlainTableEntry:
    """One line of BMNet's plain text table: `name threshold rshift`."""

    name: str
    threshold: float
    rshift: int


def parse_plain_table(text: str, source: str = "<table>") -> list[PlainTableEntry]:
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) != 3:
                raise ValueError
            entry = PlainTableEntry(parts[0], float(parts[1]), int(parts[2]))
            if not math.isfinite(entry.threshold):
                raise ValueError
        except ValueError:
            raise CorruptFileError(
                f"{source}:{number}: expected 'name threshold rshift', got {line.strip()!r}; fix the table line"
            ) from None
        entries.append(entry)
    return entries
