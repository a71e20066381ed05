"""BM1880 `.bmodel` containers: read all three the runtime accepts, write the 0xFF55AADD one.

- 0xFF55AADD: magic, u32 proto_len, `bmodel.Model` protobuf, weight area (blobs via `weight_info`).
- 0xFF55AAFF: magic, `bmodel.Model` protobuf to the end of the file (blobs inside `Model.weight`).
- legacy JSON (v0.1.1): u32 json_len, JSON, magic 0x55AAAA55, u64 bin_len, binary (weight, cmdbufs).
Facts: specs/bm1880.md §1. Every reader returns the same `BModel` view.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from google.protobuf.message import DecodeError, EncodeError

from npuc.compiler.errors import CorruptFileError, UnsupportedError
from npuc.compiler.fileio import atomic_write_bytes, read_limited
from npuc.compiler.protoschema import load_proto

MAX_BMODEL_BYTES = 1 << 30  # BM1880 boards have 1 GiB of DDR in all

MAGIC_PROTO_WEIGHTS = 0xFF55AADD
MAGIC_PROTO = 0xFF55AAFF
MAGIC_JSON_BINARY = 0x55AAAA55
CHIP_BM1880 = 1880
FMT_I8 = 4

SCHEMA_PATH = Path(__file__).with_name("bmodel.proto")


@lru_cache(maxsize=1)
def bmodel_schema():
    """The `bmodel` message classes (built once; the classes are immutable)."""
    return load_proto(SCHEMA_PATH)


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a command. Offsets are bytes into the command's neuron area."""

    name: str  # "" for inputs (the format has no input names)
    shape: tuple[int, ...]
    offset: int = 0
    threshold: float = 0.0  # symmetric int8 range: float = q * threshold / 128; 0 = unset
    fmt: int | None = None  # None = unset (int8 implied by BModel.fmt)
    # optional proto fields present in the source file: kept only to rewrite it byte for byte
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Command:
    """One compiled input shape: BMKernel cmdbuf plus its memory needs."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    cmdbuf: bytes
    neuron_size: int
    weight_index: int = 0
    explicit: frozenset[str] = field(default=frozenset(), compare=False)


@dataclass(frozen=True)
class Library:
    """A CPU-op plugin: the same shared library built for the host and for the board."""

    name: str
    lib_x86_64: bytes
    lib_armv8: bytes


@dataclass(frozen=True)
class BModel:
    """Container-independent view of a BM1880 bmodel."""

    net_name: str
    chip: int
    fmt: int
    commands: tuple[Command, ...]
    weights: tuple[bytes, ...] = ()
    libraries: tuple[Library, ...] = ()
    node_num: int = 1
    type: str = "A"
    version: str = "2.1"
    explicit: frozenset[str] = field(default=frozenset(), compare=False)  # optional Model fields present
    # where it was read from: "proto+weights" (0xFF55AADD), "proto" (0xFF55AAFF), "json"
    container: str = field(default="proto+weights", compare=False)

    def command_for_shape(self, shape: tuple[int, ...]) -> Command:
        """The command compiled for this input shape (what bmnet_set_input_shape selects)."""
        for command in self.commands:
            if command.inputs and command.inputs[0].shape == tuple(shape):
                return command
        known = ", ".join("x".join(map(str, c.inputs[0].shape)) for c in self.commands if c.inputs)
        raise UnsupportedError(f"bmodel {self.net_name!r} has no command for input shape {shape}; use one of: {known}")

    def weight_for(self, command: Command) -> bytes:
        return self.weights[command.weight_index] if self.weights else b""


# ---------------------------------------------------------------------------------------------------
# protobuf <-> BModel


def _present(msg, names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(n for n in names if msg.HasField(n))


def _from_proto(msg, weights: tuple[bytes, ...], container: str, source: str) -> BModel:
    if not msg.IsInitialized():
        missing = ", ".join(msg.FindInitializationErrors()[:3])
        raise CorruptFileError(
            f"{source}: bmodel message lacks required fields ({missing}); the file is corrupt or not a BM1880 bmodel"
        )
    if not msg.command:
        raise CorruptFileError(f"{source}: bmodel {msg.net_name!r} has no commands; the file is truncated or corrupt")
    commands = []
    for index, cmd in enumerate(msg.command):
        inputs = tuple(
            TensorInfo(
                "",
                tuple(i.shape.dim),
                i.offset,
                i.threshold,
                i.fmt if i.HasField("fmt") else None,
                _present(i, ("threshold", "fmt", "offset")),
            )
            for i in cmd.input
        )
        outputs = tuple(
            TensorInfo(
                o.name,
                tuple(o.shape.dim),
                o.offset,
                o.threshold,
                o.fmt if o.HasField("fmt") else None,
                _present(o, ("threshold", "fmt")),
            )
            for o in cmd.output
        )
        if weights and cmd.weight_index >= len(weights):
            raise CorruptFileError(
                f"{source}: command {index} uses weight blob {cmd.weight_index} but the "
                f"file has {len(weights)}; the file is corrupt"
            )
        for tensor in inputs + outputs:
            if tensor.offset + tensor.size > cmd.neuron_size:
                raise CorruptFileError(
                    f"{source}: command {index} tensor {tensor.name or 'input'} at offset "
                    f"{tensor.offset} (+{tensor.size}) exceeds neuron_size "
                    f"{cmd.neuron_size}; the file is corrupt"
                )
        commands.append(
            Command(
                inputs,
                outputs,
                bytes(cmd.cmdbuf),
                cmd.neuron_size,
                cmd.weight_index,
                _present(cmd, ("weight_index",)),
            )
        )
    return BModel(
        net_name=msg.net_name,
        chip=msg.chip,
        fmt=msg.fmt,
        commands=tuple(commands),
        weights=weights,
        libraries=tuple(Library(lib.name, bytes(lib.lib_x86_64), bytes(lib.lib_armv8)) for lib in msg.library),
        node_num=msg.node_num,
        type=msg.type,
        version=msg.version,
        explicit=_present(msg, ("node_num", "type", "version")),
        container=container,
    )


def _set_optional(msg, name: str, value, default, explicit: frozenset[str]) -> None:
    """Write an optional field when it was present in the source or differs from its default."""
    if name in explicit or value != default:
        setattr(msg, name, value)


def to_proto(model: BModel, embed_weights: bool):
    """The `bmodel.Model` message; weights go into `Model.weight` or, if not embedded, `weight_info`."""
    msg = bmodel_schema().Model(net_name=model.net_name, chip=model.chip, fmt=model.fmt)
    _set_optional(msg, "node_num", model.node_num, 1, model.explicit)
    for cmd in model.commands:
        out = msg.command.add(cmdbuf=cmd.cmdbuf, neuron_size=cmd.neuron_size)
        for tensor in cmd.inputs:
            item = out.input.add()
            item.shape.dim.extend(tensor.shape)
            _set_optional(item, "threshold", tensor.threshold, 0.0, tensor.explicit)
            _set_optional(item, "fmt", tensor.fmt, None, tensor.explicit)
            _set_optional(item, "offset", tensor.offset, 0, tensor.explicit)
        for tensor in cmd.outputs:
            item = out.output.add(name=tensor.name, offset=tensor.offset)
            item.shape.dim.extend(tensor.shape)
            _set_optional(item, "threshold", tensor.threshold, 0.0, tensor.explicit)
            _set_optional(item, "fmt", tensor.fmt, None, tensor.explicit)
        _set_optional(out, "weight_index", cmd.weight_index, 0, cmd.explicit)
    for lib in model.libraries:
        msg.library.add(name=lib.name, lib_x86_64=lib.lib_x86_64, lib_armv8=lib.lib_armv8)
    _set_optional(msg, "type", model.type, "A", model.explicit)
    _set_optional(msg, "version", model.version, "2.1", model.explicit)
    if embed_weights:
        msg.weight.extend(model.weights)
    else:
        offset = 0
        for blob in model.weights:
            msg.weight_info.add(weight_offset=offset, weight_length=len(blob))
            offset += len(blob)
    return msg


# ---------------------------------------------------------------------------------------------------
# readers


def _parse_model(data: bytes, source: str):
    try:
        return bmodel_schema().Model.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise CorruptFileError(f"{source}: bmodel protobuf does not decode ({exc}); the file is corrupt") from None


def _read_proto_weights(data: bytes, source: str) -> BModel:
    if len(data) < 8:
        raise CorruptFileError(f"{source}: {len(data)} bytes is too short for a bmodel header (8 bytes)")
    (proto_len,) = struct.unpack_from("<I", data, 4)
    if 8 + proto_len > len(data):
        raise CorruptFileError(
            f"{source}: offset 4: proto_len {proto_len} exceeds the file size {len(data)}; the file is truncated"
        )
    msg = _parse_model(data[8 : 8 + proto_len], source)
    area = memoryview(data)[8 + proto_len :]
    blobs = []
    for index, info in enumerate(msg.weight_info):
        if info.weight_offset + info.weight_length > len(area):
            raise CorruptFileError(
                f"{source}: weight_info[{index}] = ({info.weight_offset}, "
                f"{info.weight_length}) is outside the {len(area)}-byte weight area; "
                "the file is truncated or corrupt"
            )
        blobs.append(bytes(area[info.weight_offset : info.weight_offset + info.weight_length]))
    blobs.extend(bytes(b) for b in msg.weight)  # tolerated: blobs left inside the message
    return _from_proto(msg, tuple(blobs), "proto+weights", source)


def _read_proto(data: bytes, source: str) -> BModel:
    msg = _parse_model(data[4:], source)
    if msg.weight_info:
        raise CorruptFileError(f"{source}: a 0xFF55AAFF bmodel cannot use weight_info (no weight area)")
    return _from_proto(msg, tuple(bytes(b) for b in msg.weight), "proto", source)


class _JsonReader:
    """Typed access to the legacy JSON header; every mismatch is a CorruptFileError naming the key."""

    def __init__(self, source: str, binary: bytes) -> None:
        self.source = source
        self.binary = binary

    def fail(self, where: str, what: str) -> CorruptFileError:
        return CorruptFileError(f"{self.source}: JSON header {where}: {what}; the file is corrupt")

    def get(self, obj, key: str, kind: type, where: str):
        if not isinstance(obj, dict) or key not in obj:
            raise self.fail(where, f"missing key {key!r}")
        value = obj[key]
        if not isinstance(value, kind):
            raise self.fail(f"{where}.{key}", f"expected {kind.__name__}")
        return value

    def number(self, obj, key: str, where: str, kind: type = int):
        text = obj.get(key) if isinstance(obj, dict) else None
        try:
            value = kind(text)
            if kind is float:  # thresholds are float32 in the protobuf containers
                (value,) = struct.unpack("<f", struct.pack("<f", value))
                if not math.isfinite(value):
                    raise ValueError
        except (TypeError, ValueError):
            raise self.fail(f"{where}.{key}", f"expected a {kind.__name__} (as a string), got {text!r}") from None
        if kind is int and value < 0:
            raise self.fail(f"{where}.{key}", f"negative value {value}")
        return value

    def ints(self, obj, key: str, where: str, count: int | None = None) -> tuple[int, ...]:
        items = self.get(obj, key, list, where)
        if count is not None and len(items) != count:
            raise self.fail(f"{where}.{key}", f"expected {count} numbers, got {len(items)}")
        return tuple(self.number({key: v}, key, f"{where}[{i}]") for i, v in enumerate(items))

    def span(self, obj, key: str, where: str) -> bytes:
        offset, size = self.ints(obj, key, where, 2)
        if offset + size > len(self.binary):
            raise self.fail(f"{where}.{key}", f"range ({offset}, {size}) outside the {len(self.binary)}-byte binary")
        return self.binary[offset : offset + size]


def _read_json(data: bytes, source: str) -> BModel:
    if len(data) < 4:
        raise CorruptFileError(f"{source}: {len(data)} bytes is too short for a bmodel")
    (json_len,) = struct.unpack_from("<I", data, 0)
    tail = 4 + json_len
    if tail + 12 > len(data):
        raise CorruptFileError(
            f"{source}: not a BM1880 bmodel (unknown magic 0x{json_len:08X}, and as a legacy "
            f"JSON bmodel its json_len {json_len} exceeds the file size {len(data)})"
        )
    (magic,) = struct.unpack_from("<I", data, tail)
    if magic != MAGIC_JSON_BINARY:
        raise CorruptFileError(
            f"{source}: offset {tail}: expected magic 0x{MAGIC_JSON_BINARY:08X} after the "
            f"JSON header, got 0x{magic:08X}; the file is corrupt or not a bmodel"
        )
    (bin_len,) = struct.unpack_from("<Q", data, tail + 4)
    if tail + 12 + bin_len > len(data):
        raise CorruptFileError(
            f"{source}: offset {tail + 4}: bin_len {bin_len} exceeds the file size; the file is truncated"
        )
    try:
        header = json.loads(data[4:tail].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptFileError(f"{source}: JSON header does not parse ({exc}); the file is corrupt") from None
    reader = _JsonReader(source, data[tail + 12 : tail + 12 + bin_len])
    backends = reader.get(header, "backends", list, "$")
    if len(backends) != 1:
        raise UnsupportedError(f"{source}: legacy JSON bmodel with {len(backends)} backends; only 1 is supported")
    backend = backends[0]
    weight = reader.span(header, "weight", "$")
    commands = []
    for v_index, variety in enumerate(reader.get(backend, "varieties", list, "$.backends[0]")):
        where = f"$.backends[0].varieties[{v_index}]"
        neuron_size = reader.number(variety, "neuron_size", where)
        offset = reader.number(variety, "output_offset", where)
        outputs = []
        for o_index, sub in enumerate(reader.get(variety, "sub_outputs", list, where)):
            sub_where = f"{where}.sub_outputs[{o_index}]"
            tensor = TensorInfo(
                reader.get(sub, "name", str, sub_where),
                reader.ints(sub, "shape", sub_where),
                offset,
                reader.number(sub, "threshold", sub_where, float),
                explicit=frozenset({"threshold"}),
            )
            outputs.append(tensor)
            offset += tensor.size  # int8 outputs packed back to back from output_offset
        if offset - reader.number(variety, "output_offset", where) != reader.number(variety, "output_size", where):
            raise reader.fail(f"{where}.output_size", "does not equal the sum of the sub_output sizes")
        # the variety-level threshold is the input's (outputs carry their own)
        inputs = (
            TensorInfo(
                "",
                reader.ints(variety, "shape", where),
                0,
                reader.number(variety, "threshold", where, float),
                explicit=frozenset({"threshold"}),
            ),
        )
        for tensor in inputs + tuple(outputs):
            if tensor.offset + tensor.size > neuron_size:
                raise reader.fail(where, f"tensor at offset {tensor.offset} exceeds neuron_size {neuron_size}")
        commands.append(Command(inputs, tuple(outputs), reader.span(variety, "cmdbuf", where), neuron_size))
    if reader.get(header, "libraries", list, "$"):
        raise UnsupportedError(f"{source}: legacy JSON bmodel with CPU-op libraries is not supported")
    return BModel(
        net_name=reader.get(header, "name", str, "$"),
        chip=reader.number(backend, "target", "$.backends[0]"),
        fmt=FMT_I8,
        commands=tuple(commands),
        weights=(weight,),
        node_num=reader.number(backend, "node_num", "$.backends[0]"),
        version=reader.get(header, "version", str, "$"),
        explicit=frozenset({"node_num", "version"}),
        container="json",
    )


def read_bmodel(data: bytes, source: str = "<bmodel>") -> BModel:
    """Parse any of the three BM1880 bmodel containers (chosen by the leading u32, as the runtime does)."""
    data = bytes(data)
    magic = struct.unpack_from("<I", data, 0)[0] if len(data) >= 4 else None
    if magic == MAGIC_PROTO_WEIGHTS:
        return _read_proto_weights(data, source)
    if magic == MAGIC_PROTO:
        return _read_proto(data, source)
    return _read_json(data, source)


def load_bmodel(path: str | Path) -> BModel:
    """Read a `.bmodel` file."""
    data = read_limited(Path(path), "bmodel", MAX_BMODEL_BYTES)
    return read_bmodel(data, str(path))


# ---------------------------------------------------------------------------------------------------
# writer


def write_bmodel(model: BModel, embed_weights: bool = False) -> bytes:
    """Serialize as the 0xFF55AADD container (what BM1880's `bmodel::save` emits).

    `embed_weights=True` gives the older 0xFF55AAFF container (weights inside the message) instead.
    """
    msg = to_proto(model, embed_weights=embed_weights)
    try:
        payload = msg.SerializeToString()
    except EncodeError as exc:
        raise ValueError(f"bmodel {model.net_name!r} is incomplete: {exc}") from None
    if embed_weights:
        return struct.pack("<I", MAGIC_PROTO) + payload
    return b"".join([struct.pack("<II", MAGIC_PROTO_WEIGHTS, len(payload)), payload, *model.weights])


def save_bmodel(model: BModel, path: str | Path) -> None:
    """Write the 0xFF55AADD container atomically (temp file in the same folder, then rename)."""
    atomic_write_bytes(Path(path), write_bmodel(model))


__all__ = [
    "BModel", "Command", "Library", "TensorInfo", "read_bmodel", "load_bmodel", "write_bmodel",
    "save_bmodel", "to_proto", "bmodel_schema", "MAGIC_PROTO_WEIGHTS", "MAGIC_PROTO", "MAGIC_JSON_BINARY",
]  # fmt: skip
