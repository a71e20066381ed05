"""Reading ONNX files: the whole model, with external data confined to the model's folder (`load_model`), or only
its structure, the initializers skipped in the protobuf bytes and never read (`load_structure`)."""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from npuc.compiler.errors import UserError


def load_model(path: str | Path) -> onnx.ModelProto:
    """Read an ONNX file, with external data that must live inside the model's folder."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"model file not found: {path}; check the path")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise UserError(
            f"{path} is not a readable ONNX model ({short_reason(exc)}); the file is truncated or of another format"
        ) from None
    if not model.graph.output or not model.opset_import:
        raise UserError(f"{path} is not an ONNX model (no graph outputs or opset); pass a .onnx file")
    _load_external_data(model, path.parent.resolve(), path)
    return model


_GRAPH_FIELD = 7  # ModelProto.graph
_INITIALIZER_FIELDS = (5, 15)  # GraphProto.initializer, sparse_initializer


def _varint(buf: mmap.mmap | bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(buf: mmap.mmap | bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start, payload start, end) of each protobuf field in buf[start:end]."""
    pos = start
    while pos < end:
        key, at = _varint(buf, pos)
        wire = key & 7
        if wire == 0:
            _, stop = _varint(buf, at)
        elif wire in (1, 5):
            stop = at + (8 if wire == 1 else 4)
        elif wire == 2:
            size, at = _varint(buf, at)
            stop = at + size
        else:
            raise ValueError(f"protobuf wire type {wire}")
        if stop > end:
            raise ValueError("protobuf field runs past its message")
        yield key >> 3, pos, at, stop
        pos = stop


def _without_initializers(buf: mmap.mmap | bytes) -> bytes:
    """The serialized model minus its graph's initializers; their bytes are skipped, never read."""
    out = bytearray()
    for number, start, payload, stop in _fields(buf, 0, len(buf)):
        if number != _GRAPH_FIELD:
            out += buf[start:stop]
            continue
        graph = bytearray()
        for inner, a, _, b in _fields(buf, payload, stop):
            if inner not in _INITIALIZER_FIELDS:
                graph += buf[a:b]
        out += _encode_varint(_GRAPH_FIELD << 3 | 2) + _encode_varint(len(graph)) + graph
    return bytes(out)


def load_structure(path: str | Path) -> onnx.ModelProto:
    """The model's graph without its initializers (nodes, inputs, outputs, value infos): what a pass that only
    follows names needs, without reading the weights into memory."""
    path = Path(path)
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return onnx.ModelProto.FromString(_without_initializers(buf))
    except (ValueError, IndexError, OSError, DecodeError):  # not plain protobuf: the full reader says why
        return onnx.load(str(path), load_external_data=False)


def _load_external_data(model: onnx.ModelProto, base: Path, path: Path) -> None:
    for tensor in external_data_helper._get_all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        target = (base / location).resolve()
        if not location or Path(location).is_absolute() or not target.is_relative_to(base):
            raise UserError(
                f"{path}: tensor '{tensor.name}' points to external data '{location}' outside the model's "
                f"folder {base}; move the data file next to the model"
            )
        if not target.is_file():
            raise UserError(f"{path}: external data file '{location}' of tensor '{tensor.name}' is missing")
    try:
        external_data_helper.load_external_data_for_model(model, str(base))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read external data ({short_reason(exc)})") from None


def short_reason(exc: BaseException) -> str:
    """What an error message quotes of `exc`: its first line, at most 160 characters, or its type's name."""
    return str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
