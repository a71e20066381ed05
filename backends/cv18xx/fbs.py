"""Parser for the FlatBuffers schema subset the cvimodel uses: namespace, enum, struct, table, root_type.

The parsed `Schema` is the single source of truth for both directions of `fbcodec`: field slots, types,
defaults and required flags come from the .fbs text, and a plain dataclass is generated per table/struct.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# name -> (struct format char, byte size); aliases map onto these.
SCALARS: dict[str, tuple[str, int]] = {
    "bool": ("?", 1),
    "byte": ("b", 1),
    "ubyte": ("B", 1),
    "short": ("h", 2),
    "ushort": ("H", 2),
    "int": ("i", 4),
    "uint": ("I", 4),
    "long": ("q", 8),
    "ulong": ("Q", 8),
    "float": ("f", 4),
    "double": ("d", 8),
}
_ALIASES = {
    "int8": "byte",
    "uint8": "ubyte",
    "int16": "short",
    "uint16": "ushort",
    "int32": "int",
    "uint32": "uint",
    "int64": "long",
    "uint64": "ulong",
    "float32": "float",
    "float64": "double",
}
_TOKEN = re.compile(
    r"\s+|//[^\n]*|/\*.*?\*/|([A-Za-z_][A-Za-z0-9_.]*|-?[0-9][0-9.eE+-]*|\"[^\"]*\"|[{}\[\]():;=,])", re.S
)


class SchemaError(ValueError):
    """The .fbs text uses something outside the supported subset or is malformed."""


@dataclass(frozen=True)
class FbType:
    """A field type. kind: scalar | enum | string | struct | table | vector."""

    kind: str
    name: str = ""  # scalar base name, or the referenced enum/struct/table name
    scalar: str = ""  # base scalar of a scalar or enum
    element: FbType | None = None  # element type of a vector

    @property
    def fmt(self) -> str:
        return SCALARS[self.scalar][0]

    @property
    def size(self) -> int:
        return SCALARS[self.scalar][1]


@dataclass(frozen=True)
class FbField:
    name: str
    type: FbType
    slot: int
    default: Any = None
    required: bool = False
    offset: int = 0  # byte offset inside a struct (structs only)


@dataclass
class FbEnum:
    name: str
    scalar: str
    values: dict[str, int]

    def name_of(self, value: int) -> str | None:
        return next((k for k, v in self.values.items() if v == value), None)


@dataclass
class FbObject:
    """A table or struct: its fields in declaration order and the dataclass that holds a decoded value."""

    name: str
    is_struct: bool
    fields: list[FbField]
    size: int = 0  # structs only
    align: int = 1  # structs only
    record: type = field(default=object, repr=False)


@dataclass
class Schema:
    namespace: str
    enums: dict[str, FbEnum]
    objects: dict[str, FbObject]
    root_type: str

    def new(self, type_name: str, **values: Any) -> Any:
        """Create a record of a table/struct with the schema defaults for fields not given."""
        return self.objects[type_name].record(**values)


class _Tokens:
    def __init__(self, text: str) -> None:
        self.toks = [m.group(1) for m in _TOKEN.finditer(text) if m.group(1)]
        consumed = "".join(m.group(0) for m in _TOKEN.finditer(text))
        if len(consumed) != len(text):
            raise SchemaError("unexpected character in schema text")
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def next(self) -> str:
        if self.i >= len(self.toks):
            raise SchemaError("unexpected end of schema")
        self.i += 1
        return self.toks[self.i - 1]

    def expect(self, tok: str) -> None:
        got = self.next()
        if got != tok:
            raise SchemaError(f"expected {tok!r}, got {got!r} (token {self.i})")


def _parse_enum(t: _Tokens) -> FbEnum:
    name = t.next()
    t.expect(":")
    base = t.next()
    scalar = _ALIASES.get(base, base)
    if scalar not in SCALARS or scalar in ("float", "double", "bool"):
        raise SchemaError(f"enum {name}: unsupported underlying type {scalar!r}")
    t.expect("{")
    values: dict[str, int] = {}
    nxt = 0
    while t.peek() != "}":
        key = t.next()
        if t.peek() == "=":
            t.next()
            nxt = int(t.next(), 0)
        values[key] = nxt
        nxt += 1
        if t.peek() == ",":
            t.next()
    t.expect("}")
    return FbEnum(name, scalar, values)


def _parse_type(t: _Tokens) -> tuple[bool, str]:
    if t.peek() == "[":
        t.next()
        inner = t.next()
        t.expect("]")
        return True, inner
    return False, t.next()


def _parse_fields(t: _Tokens) -> list[tuple[str, bool, str, str | None, set[str]]]:
    t.expect("{")
    out = []
    while t.peek() != "}":
        fname = t.next()
        t.expect(":")
        is_vec, tname = _parse_type(t)
        default = None
        if t.peek() == "=":
            t.next()
            default = t.next()
        attrs: set[str] = set()
        if t.peek() == "(":
            t.next()
            while t.peek() != ")":
                attr = t.next()
                if attr == ":":
                    raise SchemaError(f"field {fname}: attribute values (e.g. id) are not supported")
                if attr != ",":
                    attrs.add(attr)
            t.next()
        t.expect(";")
        out.append((fname, is_vec, tname, default, attrs))
    t.expect("}")
    return out


def _scalar_default(ftype: FbType, text: str | None, enums: dict[str, FbEnum]) -> Any:
    if ftype.kind == "enum" and text is not None and text in enums[ftype.name].values:
        return enums[ftype.name].values[text]
    if ftype.scalar == "bool":
        return text in ("true", "1")
    if ftype.scalar in ("float", "double"):
        return float(text) if text is not None else 0.0
    return int(text, 0) if text is not None else 0


def parse_schema(text: str) -> Schema:
    """Parse .fbs text into a Schema; raises SchemaError on anything outside the supported subset."""
    t = _Tokens(text)
    namespace, root = "", ""
    enums: dict[str, FbEnum] = {}
    raw: dict[str, tuple[bool, list]] = {}
    while (tok := t.peek()) is not None:
        t.next()
        if tok == "namespace":
            namespace = t.next()
            t.expect(";")
        elif tok == "enum":
            e = _parse_enum(t)
            enums[e.name] = e
        elif tok in ("table", "struct"):
            name = t.next()
            raw[name] = (tok == "struct", _parse_fields(t))
        elif tok == "root_type":
            root = t.next()
            t.expect(";")
        else:
            raise SchemaError(f"unsupported schema declaration {tok!r}")

    def resolve(is_vec: bool, tname: str) -> FbType:
        if is_vec:
            return FbType("vector", element=resolve(False, tname))
        tname = _ALIASES.get(tname, tname)
        if tname in SCALARS:
            return FbType("scalar", tname, tname)
        if tname == "string":
            return FbType("string")
        if tname in enums:
            return FbType("enum", tname, enums[tname].scalar)
        if tname in raw:
            return FbType("struct" if raw[tname][0] else "table", tname)
        raise SchemaError(f"unknown type {tname!r}")

    objects: dict[str, FbObject] = {}
    for name, (is_struct, fields) in raw.items():
        out: list[FbField] = []
        for slot, (fname, is_vec, tname, default, attrs) in enumerate(fields):
            ftype = resolve(is_vec, tname)
            dflt = _scalar_default(ftype, default, enums) if ftype.kind in ("scalar", "enum") else None
            out.append(FbField(fname, ftype, slot, dflt, "required" in attrs))
        objects[name] = FbObject(name, is_struct, out)
    for obj in objects.values():
        if obj.is_struct:
            _layout_struct(obj, objects)
        obj.record = dataclasses.make_dataclass(
            obj.name, [(f.name, Any, dataclasses.field(default=f.default)) for f in obj.fields]
        )
    if root not in objects or objects[root].is_struct:
        raise SchemaError(f"root_type {root!r} is not a table")
    return Schema(namespace, enums, objects, root)


def _layout_struct(obj: FbObject, objects: dict[str, FbObject]) -> None:
    """Natural alignment, padded to the largest member (nested structs are not needed here)."""
    pos, align, placed = 0, 1, []
    for f in obj.fields:
        if f.type.kind not in ("scalar", "enum"):
            raise SchemaError(f"struct {obj.name}.{f.name}: only scalar struct members are supported")
        size = f.type.size
        pos = (pos + size - 1) // size * size
        placed.append(dataclasses.replace(f, offset=pos))
        pos += size
        align = max(align, size)
    obj.fields = placed
    obj.align = align
    obj.size = (pos + align - 1) // align * align


def load_schema(path: Path) -> Schema:
    return parse_schema(path.read_text(encoding="utf-8"))
