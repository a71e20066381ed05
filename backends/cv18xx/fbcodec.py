"""One generic FlatBuffers codec driven by a parsed `Schema`: bytes -> records and records -> bytes.

Decoding checks every offset, vtable and vector length against the buffer and raises CorruptFileError, so a
damaged file never reaches an IndexError or struct.error. Encoding uses the `flatbuffers` Builder and emits
objects in the order flatc's generated C++ `Create*` helpers do (children depth-first in field order, then
the table's fields largest first, later fields first), which is how tpu-mlir lays out a cvimodel body.
"""

from __future__ import annotations

import struct
from typing import Any

import flatbuffers
import numpy as np

from npuc.backends.cv18xx.fbs import FbField, FbObject, FbType, Schema
from npuc.compiler.errors import CorruptFileError

_UOFFSET = 4
_STRUCTS: dict[str, struct.Struct] = {}  # little-endian scalar codecs by format character


class _Reader:
    """Bounds-checked view of one buffer; `budget` caps decoded objects so shared subtrees can't explode."""

    def __init__(self, schema: Schema, buf: bytes, where: str) -> None:
        self.schema = schema
        self.buf = buf
        self.where = where
        self.budget = len(buf) // 2 + 64

    def fail(self, what: str, pos: int) -> CorruptFileError:
        return CorruptFileError(
            f"{self.where}: corrupt FlatBuffer at body offset {pos}: {what}; the file is damaged, rebuild it"
        )

    def scalar(self, fmt: str, pos: int) -> Any:
        packer = _STRUCTS.get(fmt) or _STRUCTS.setdefault(fmt, struct.Struct("<" + fmt))
        if pos < 0 or pos + packer.size > len(self.buf):
            raise self.fail(f"{packer.size}-byte value runs past the end ({len(self.buf)} bytes)", pos)
        return packer.unpack_from(self.buf, pos)[0]

    def follow(self, pos: int) -> int:
        """Target of the uoffset stored at pos (always forward, so references cannot form cycles)."""
        target = pos + self.scalar("I", pos)
        if target >= len(self.buf):
            raise self.fail(f"offset points to {target}, past the end", pos)
        return target

    def spend(self, pos: int, n: int = 1) -> None:
        self.budget -= n
        if self.budget < 0:
            raise self.fail("too many objects for the buffer size (shared or looping references)", pos)

    def vector_span(self, pos: int, elem_size: int) -> tuple[int, int]:
        count = self.scalar("I", pos)
        if count * elem_size > len(self.buf) - pos - 4:
            raise self.fail(f"vector of {count} x {elem_size} bytes runs past the end", pos)
        return pos + 4, count

    def string(self, pos: int) -> str:
        start, n = self.vector_span(pos, 1)
        if start + n >= len(self.buf) or self.buf[start + n] != 0:
            raise self.fail("string is not NUL-terminated", pos)
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail("string is not valid UTF-8", pos) from exc

    def struct_value(self, obj: FbObject, pos: int) -> Any:
        if pos + obj.size > len(self.buf):
            raise self.fail(f"struct {obj.name} runs past the end", pos)
        return obj.record(**{f.name: self.scalar(f.type.fmt, pos + f.offset) for f in obj.fields})

    def vector(self, ftype: FbType, pos: int) -> Any:
        el = ftype.element
        assert el is not None
        if el.kind in ("scalar", "enum"):
            start, n = self.vector_span(pos, el.size)
            if el.scalar == "ubyte":
                return bytes(self.buf[start : start + n])
            return list(struct.unpack_from(f"<{n}{el.fmt}", self.buf, start))
        if el.kind == "struct":
            obj = self.schema.objects[el.name]
            start, n = self.vector_span(pos, obj.size)
            self.spend(pos, n)
            return [self.struct_value(obj, start + i * obj.size) for i in range(n)]
        start, n = self.vector_span(pos, _UOFFSET)
        self.spend(pos, n)
        items = (self.follow(start + 4 * i) for i in range(n))
        if el.kind == "string":
            return [self.string(p) for p in items]
        if el.kind == "table":
            return [self.table(self.schema.objects[el.name], p) for p in items]
        raise self.fail(f"unsupported vector element kind {el.kind}", pos)

    def table(self, obj: FbObject, pos: int) -> Any:
        self.spend(pos)
        vt = pos - self.scalar("i", pos)
        vt_size = self.scalar("H", vt)
        tbl_size = self.scalar("H", vt + 2)
        if vt_size < 4 or vt_size % 2 or vt + vt_size > len(self.buf):
            raise self.fail(f"bad vtable size {vt_size} for {obj.name}", vt)
        if tbl_size < 4 or pos + tbl_size > len(self.buf):
            raise self.fail(f"bad table size {tbl_size} for {obj.name}", pos)
        values = {}
        for f in obj.fields:
            voff = self.scalar("H", vt + 4 + 2 * f.slot) if 4 + 2 * f.slot < vt_size else 0
            if voff == 0:
                if f.required:
                    raise self.fail(f"required field {obj.name}.{f.name} is missing", pos)
                continue
            width = self._inline_size(f)
            if voff < 4 or voff + width > tbl_size:
                raise self.fail(f"field {obj.name}.{f.name} lies outside its table", pos)
            values[f.name] = self.field(f, pos + voff)
        return obj.record(**values)

    def _inline_size(self, f: FbField) -> int:
        if f.type.kind in ("scalar", "enum"):
            return f.type.size
        if f.type.kind == "struct":
            return self.schema.objects[f.type.name].size
        return _UOFFSET

    def field(self, f: FbField, pos: int) -> Any:
        kind = f.type.kind
        if kind in ("scalar", "enum"):
            return self.scalar(f.type.fmt, pos)
        if kind == "struct":
            return self.struct_value(self.schema.objects[f.type.name], pos)
        target = self.follow(pos)
        if kind == "string":
            return self.string(target)
        if kind == "vector":
            return self.vector(f.type, target)
        return self.table(self.schema.objects[f.type.name], target)


def decode(schema: Schema, buf: bytes, where: str = "flatbuffer", root: str | None = None) -> Any:
    """Decode a whole FlatBuffer into records of the schema (absent fields take their schema default)."""
    reader = _Reader(schema, bytes(buf), where)
    if len(buf) < 8:
        raise reader.fail(f"buffer of {len(buf)} bytes is too short", 0)
    return reader.table(schema.objects[root or schema.root_type], reader.follow(0))


class _Writer:
    def __init__(self, schema: Schema, child_order: dict[str, tuple[str, ...]]) -> None:
        self.schema = schema
        self.child_order = child_order
        self.b = flatbuffers.Builder(1024)

    def value(self, ftype: FbType, value: Any) -> int:
        """Serialize an out-of-line value (string, vector, table) and return its offset."""
        if ftype.kind == "string":
            return self.b.CreateString(value)
        if ftype.kind == "table":
            return self.table(self.schema.objects[ftype.name], value)
        return self.vector(ftype, value)

    def vector(self, ftype: FbType, items: Any) -> int:
        el = ftype.element
        assert el is not None
        if el.kind in ("scalar", "enum"):
            # struct's format char doubles as the numpy dtype char ("?" bool, "b"/"B" bytes, "q" int64, ...)
            if isinstance(items, (bytes, bytearray)):
                return self.b.CreateNumpyVector(np.frombuffer(items, dtype="<" + el.fmt))
            return self.b.CreateNumpyVector(np.array(items, dtype="<" + el.fmt))
        if el.kind == "struct":
            obj = self.schema.objects[el.name]
            self.b.StartVector(obj.size, len(items), obj.align)
            for item in reversed(items):
                self.struct_inline(obj, item)
            return self.b.EndVector()
        offsets = [self.value(el, item) for item in items]
        self.b.StartVector(_UOFFSET, len(offsets), _UOFFSET)
        for off in reversed(offsets):
            self.b.PrependUOffsetTRelative(off)
        return self.b.EndVector()

    def struct_inline(self, obj: FbObject, value: Any) -> int:
        self.b.Prep(obj.align, obj.size)
        end = obj.size
        for f in reversed(obj.fields):
            self.b.Pad(end - f.offset - f.type.size)
            self.b.Prepend(_FLAGS[f.type.scalar], getattr(value, f.name))
            end = f.offset
        self.b.Pad(end)
        return self.b.Offset()

    def table(self, obj: FbObject, value: Any) -> int:
        present = [f for f in obj.fields if getattr(value, f.name) is not None]
        missing = [f.name for f in obj.fields if f.required and getattr(value, f.name) is None]
        if missing:
            raise ValueError(f"{obj.name}: required field(s) {missing} not set")
        rank = {name: i for i, name in enumerate(self.child_order.get(obj.name, ()))}
        out_of_line = [f for f in present if f.type.kind in ("string", "vector", "table")]
        out_of_line.sort(key=lambda f: rank.get(f.name, len(rank) + f.slot))
        children = {f.slot: self.value(f.type, getattr(value, f.name)) for f in out_of_line}
        self.b.StartObject(len(obj.fields))
        for f in sorted(reversed(present), key=lambda f: -self._sort_size(f)):
            v = getattr(value, f.name)
            if f.slot in children:
                self.b.PrependUOffsetTRelativeSlot(f.slot, children[f.slot], 0)
            elif f.type.kind == "struct":
                self.b.PrependStructSlot(f.slot, self.struct_inline(self.schema.objects[f.type.name], v), 0)
            else:
                self.b.PrependSlot(_FLAGS[f.type.scalar], f.slot, v, f.default)
        return self.b.EndObject()

    @staticmethod
    def _sort_size(f: FbField) -> int:
        # flatc sorts scalars by size; offsets and structs count as 4-byte fields.
        return f.type.size if f.type.kind in ("scalar", "enum") else _UOFFSET


_FLAGS = {
    "bool": flatbuffers.number_types.BoolFlags,
    "byte": flatbuffers.number_types.Int8Flags,
    "ubyte": flatbuffers.number_types.Uint8Flags,
    "short": flatbuffers.number_types.Int16Flags,
    "ushort": flatbuffers.number_types.Uint16Flags,
    "int": flatbuffers.number_types.Int32Flags,
    "uint": flatbuffers.number_types.Uint32Flags,
    "long": flatbuffers.number_types.Int64Flags,
    "ulong": flatbuffers.number_types.Uint64Flags,
    "float": flatbuffers.number_types.Float32Flags,
    "double": flatbuffers.number_types.Float64Flags,
}


def encode(
    schema: Schema,
    value: Any,
    root: str | None = None,
    child_order: dict[str, tuple[str, ...]] | None = None,
) -> bytes:
    """Serialize a record tree (the root table's record) into FlatBuffer bytes.

    child_order maps a table name to the order its strings/vectors/sub-tables are serialized in (fields not
    listed follow in declaration order); it only moves bytes around, the decoded value is the same.
    """
    w = _Writer(schema, child_order or {})
    w.b.Finish(w.table(schema.objects[root or schema.root_type], value))
    return bytes(w.b.Output())
