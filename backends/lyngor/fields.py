"""A small JSON field-table codec: one table of `Field`s both writes a manifest object and reads/validates one.

A `Kind` pairs an encoder (Python value → JSON value, e.g. a shape tuple → the string "(1, 128)") with a
decoder that turns the JSON value back into the Python value. Decoding trusts types and spellings: a manifest
is checked against its JSON Schema (`schemas.py`) before it is decoded. Nested objects are `obj(table)`; maps
with generated keys ("datai0", "apu_0:1", "res2") are `keyed(pattern, table)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npuc.compiler.errors import CorruptFileError

Encoder = Callable[[Any], Any]
Decoder = Callable[[Any], Any]  # json value (schema-checked) -> python value


@dataclass(frozen=True)
class Kind:
    name: str  # what the doc calls the type, for error messages and schema tests
    encode: Encoder
    decode: Decoder
    table: tuple[Field, ...] | None = None  # nested fields (obj / keyed kinds)
    key_pattern: str | None = None  # keyed kinds: regex every key must match
    choices: tuple[Any, ...] | None = None  # enum kinds


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    doc: str = ""
    required: bool = True


Table = tuple[Field, ...]


def bad(where: str, what: str, fix: str) -> CorruptFileError:
    return CorruptFileError(f"{where}: {what}; {fix}")


def _plain(name: str) -> Kind:
    """A JSON value used as it is (its type and range are the schema's)."""
    return Kind(name, lambda v: v, lambda v: v)


STR = _plain("string")
BOOL = _plain("boolean")
POS_INT = _plain("integer >= 1")
UINT = _plain("integer >= 0")
ANY = _plain("any JSON value")
DIGITS = _plain("string of digits")
INT_LIST = _plain("list of integers >= 0")


def multiple_of(n: int) -> Kind:
    return _plain(f"integer multiple of {n}")


def enum(*choices: Any) -> Kind:
    return Kind(f"one of {list(choices)}", lambda v: v, lambda v: v, choices=choices)


def optional(kind: Kind) -> Kind:
    """`kind` or JSON null."""
    return Kind(
        f"{kind.name} or null",
        lambda v: None if v is None else kind.encode(v),
        lambda v: None if v is None else kind.decode(v),
        kind.table,
    )


# ---- shapes as the Lyngor documents print them -------------------------------------------------------------


def _shape_numbers(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\d+", text))


def _shape_kind(name: str, render: Callable[[tuple[int, ...]], str]) -> Kind:
    return Kind(name, lambda shape: render(tuple(int(d) for d in shape)), _shape_numbers)


# Python tuple text, as in top_graph.json: "(1, 128)" (a 1-D shape prints "(5,)").
TUPLE_SHAPE = _shape_kind("shape string '(d0, d1, ...)'", lambda s: str(tuple(s)))
# Python list text: "[1, 64, 64, 3]".
LIST_SHAPE = _shape_kind("shape string '[d0, d1, ...]'", lambda s: str(list(s)))
# a list of integers printed into a string, as apu.json's sub_image_size: "[16128640]" (spacing as Lyngor prints it)
INT_LIST_TEXT = _shape_kind("string holding an integer list '[n0, n1, ...]'", lambda s: str(list(s)))
SHAPE_EX = Kind(
    "shape array [d0, d1, ...]",
    lambda shape: [int(d) for d in shape],
    tuple,
)


def list_of(kind: Kind) -> Kind:
    return Kind(
        f"list of {kind.name}", lambda items: [kind.encode(x) for x in items], lambda v: [kind.decode(x) for x in v]
    )


# ---- nested objects ----------------------------------------------------------------------------------------


def obj(table: Table) -> Kind:
    return Kind("object", lambda values: encode(table, values), lambda v: decode(table, v), table)


def keyed(pattern: str, table: Table | None, value_kind: Kind | None = None) -> Kind:
    """A JSON object whose keys match `pattern` (full match); each value is `table` (or `value_kind`)."""
    regex = re.compile(pattern, re.DOTALL)  # a model input name may hold a newline
    inner = value_kind or obj(table or ())

    def enc(values: dict[str, Any]) -> dict[str, Any]:
        for key in values:
            if not regex.fullmatch(key):
                raise ValueError(f"key {key!r} does not match {pattern!r}")
        return {key: inner.encode(v) for key, v in values.items()}

    return Kind(
        f"object keyed {pattern}", enc, lambda v: {key: inner.decode(item) for key, item in v.items()}, inner.table,
        key_pattern=pattern,
    )  # fmt: skip


def encode(table: Table, values: dict[str, Any]) -> dict[str, Any]:
    """The JSON object for `values`, keys in table order. A missing required field is a programming error."""
    unknown = set(values) - {f.name for f in table}
    if unknown:
        raise ValueError(f"fields {sorted(unknown)} are not in the table")
    out: dict[str, Any] = {}
    for f in table:
        if f.name in values:
            out[f.name] = f.kind.encode(values[f.name])
        elif f.required:
            raise ValueError(f"required field {f.name!r} has no value")
    return out


def decode(table: Table, value: dict[str, Any]) -> dict[str, Any]:
    """The decoded values of a JSON object the schema admitted; fields the table does not list (a vendor file
    may carry some) pass through as they are."""
    out = {key: item for key, item in value.items()}
    for f in table:
        if f.name in value:
            out[f.name] = f.kind.decode(value[f.name])
    return out
