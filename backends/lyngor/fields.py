"""A small JSON field-table codec: one table of `Field`s both writes a manifest object and reads/validates one.

A `Kind` pairs an encoder (Python value → JSON value, e.g. a shape tuple → the string "(1, 128)") with a
decoder that checks the JSON value's type and spelling and returns the Python value, raising a one-line
`UserError` that names the file and the field path. Nested objects are `obj(table)`; maps with generated
keys ("datai0", "apu_0:1", "res2") are `keyed(pattern, table)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from npuc.compiler.errors import CorruptFileError

Encoder = Callable[[Any], Any]
Decoder = Callable[[Any, str], Any]  # (json value, "file: field.path") -> python value


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


def _typed(name: str, check: Callable[[Any], bool]) -> Kind:
    def decode(value: Any, where: str) -> Any:
        if not check(value):
            raise bad(where, f"expected {name}, found {type(value).__name__} {_short(value)}", "rebuild the tree")
        return value

    return Kind(name, lambda v: v, decode)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


STR = _typed("string", lambda v: isinstance(v, str))
BOOL = _typed("boolean", lambda v: isinstance(v, bool))
INT = _typed("integer", _is_int)
POS_INT = _typed("integer >= 1", lambda v: _is_int(v) and v >= 1)
UINT = _typed("integer >= 0", lambda v: _is_int(v) and v >= 0)
NULL = _typed("null", lambda v: v is None)
ANY = Kind("any JSON value", lambda v: v, lambda v, where: v)
DIGITS = _typed("string of digits", lambda v: isinstance(v, str) and v.isdigit())
INT_LIST = _typed("list of integers >= 0", lambda v: isinstance(v, list) and all(_is_int(x) and x >= 0 for x in v))
STR_LIST = _typed("list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
INT_LIST_LIST = _typed(
    "list of integer lists",
    lambda v: isinstance(v, list) and all(isinstance(x, list) and all(_is_int(d) for d in x) for x in v),
)


def multiple_of(n: int) -> Kind:
    return _typed(f"integer multiple of {n}", lambda v: _is_int(v) and v >= 0 and v % n == 0)


def enum(*choices: Any) -> Kind:
    def decode(value: Any, where: str) -> Any:
        if type(value) is not type(choices[0]) or value not in choices:
            raise bad(where, f"{_short(value)} is not one of {list(choices)}", "rebuild the tree")
        return value

    return Kind(f"one of {list(choices)}", lambda v: v, decode, choices=choices)


def optional(kind: Kind) -> Kind:
    """`kind` or JSON null."""

    def decode(value: Any, where: str) -> Any:
        return None if value is None else kind.decode(value, where)

    return Kind(f"{kind.name} or null", lambda v: None if v is None else kind.encode(v), decode, kind.table)


# ---- shapes as the Lyngor documents print them -------------------------------------------------------------

_TUPLE_SHAPE = re.compile(r"^\((?:\d+(?:, \d+)*,?)?\)$")
_LIST_SHAPE = re.compile(r"^\[(?:\d+(?:, \d+)*)?\]$")


def _shape_numbers(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\d+", text))


def _shape_kind(name: str, pattern: re.Pattern[str], render: Callable[[tuple[int, ...]], str]) -> Kind:
    def decode(value: Any, where: str) -> tuple[int, ...]:
        if not isinstance(value, str) or not pattern.match(value):
            raise bad(where, f"expected a shape string like {render((1, 128))!r}, found {_short(value)}", "rebuild")
        return _shape_numbers(value)

    return Kind(name, lambda shape: render(tuple(int(d) for d in shape)), decode)


# Python tuple text, as in top_graph.json: "(1, 128)" (a 1-D shape prints "(5,)").
TUPLE_SHAPE = _shape_kind("shape string '(d0, d1, ...)'", _TUPLE_SHAPE, lambda s: str(tuple(s)))
# Python list text: "[1, 64, 64, 3]".
LIST_SHAPE = _shape_kind("shape string '[d0, d1, ...]'", _LIST_SHAPE, lambda s: str(list(s)))
_INT_LIST_TEXT = re.compile(r"^\[\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\]$")
# a list of integers printed into a string, as apu.json's sub_image_size: "[16128640]" (spacing as Lyngor prints it)
INT_LIST_TEXT = _shape_kind("string holding an integer list '[n0, n1, ...]'", _INT_LIST_TEXT, lambda s: str(list(s)))
SHAPE_EX = Kind(
    "shape array [d0, d1, ...]",
    lambda shape: [int(d) for d in shape],
    lambda v, where: tuple(INT_LIST.decode(v, where)),
)


def list_of(kind: Kind) -> Kind:
    def decode(value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise bad(where, f"expected a list, found {type(value).__name__}", "rebuild the tree")
        return [kind.decode(item, f"{where}[{i}]") for i, item in enumerate(value)]

    return Kind(f"list of {kind.name}", lambda items: [kind.encode(x) for x in items], decode)


# ---- nested objects ----------------------------------------------------------------------------------------


def obj(table: Table) -> Kind:
    return Kind("object", lambda values: encode(table, values), lambda v, where: decode(table, v, where), table)


def keyed(pattern: str, table: Table | None, value_kind: Kind | None = None) -> Kind:
    """A JSON object whose keys match `pattern` (full match); each value is `table` (or `value_kind`)."""
    regex = re.compile(pattern)
    inner = value_kind or obj(table or ())

    def enc(values: dict[str, Any]) -> dict[str, Any]:
        for key in values:
            if not regex.fullmatch(key):
                raise ValueError(f"key {key!r} does not match {pattern!r}")
        return {key: inner.encode(v) for key, v in values.items()}

    def dec(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise bad(where, f"expected an object, found {type(value).__name__}", "rebuild the tree")
        out = {}
        for key, item in value.items():
            if not regex.fullmatch(key):
                raise bad(where, f"key {key!r} is not of the form {pattern!r}", "rebuild the tree")
            out[key] = inner.decode(item, f"{where}.{key}")
        return out

    return Kind(f"object keyed {pattern}", enc, dec, inner.table, key_pattern=pattern)


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


def decode(table: Table, value: Any, where: str, strict: bool = True) -> dict[str, Any]:
    """Validate a JSON object against `table` and return its decoded values.

    strict: unknown keys are errors (npuc's own files); otherwise they pass through undecoded (a vendor
    file may carry fields the documentation does not list).
    """
    if not isinstance(value, dict):
        raise bad(where, f"expected a JSON object, found {type(value).__name__}", "rebuild the tree")
    out: dict[str, Any] = {}
    for f in table:
        path = f"{where}.{f.name}" if where else f.name
        if f.name not in value:
            if f.required:
                raise bad(where or "object", f"field {f.name!r} is missing", "rebuild the tree")
            continue
        out[f.name] = f.kind.decode(value[f.name], path)
    extra = [k for k in value if k not in out and k not in {f.name for f in table}]
    if extra and strict:
        raise bad(where or "object", f"unknown field {extra[0]!r}", "this file was not written by npuc's table")
    for key in extra:
        out[key] = value[key]
    return out


def field_names(table: Sequence[Field]) -> list[str]:
    return [f.name for f in table]
