"""Validating parsed JSON/YAML against a JSON Schema (draft 2020-12) before any of it is used.

Each format keeps its schema as data in the module that reads it; `check` turns the first violation into one
line naming the file, the field path and the value. `jsonschema` is imported on first use: the CLI's `--help`
never loads it.
"""

from __future__ import annotations

from typing import Any

from .errors import CorruptFileError

MAX_SHOWN = 40  # characters of an offending value quoted in the message


def shown(value: Any) -> str:
    """A short repr of a value for an error line (a damaged file may hold megabytes in one field)."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


_VALIDATORS: dict[int, tuple[dict[str, Any], Any]] = {}  # id(schema) -> (schema kept alive, its validator)


def _validator(schema: dict[str, Any]) -> Any:
    """The compiled validator of a schema, made once per process."""
    entry = _VALIDATORS.get(id(schema))
    if entry is None:
        import jsonschema

        entry = _VALIDATORS[id(schema)] = (schema, jsonschema.Draft202012Validator(schema))
    return entry[1]


def field_path(parts: Any) -> str:
    """`a.b[2].c` from a jsonschema error path."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def violation(data: Any, schema: dict[str, Any]) -> str | None:
    """The first violation as "field.path = value what-is-wrong", or None when `data` conforms."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator(schema).iter_errors(data))
    if error is None:
        return None
    path = field_path(error.absolute_path)
    keyword, expected = error.validator, error.validator_value
    if keyword == "required":  # name the field, not the whole object that lacks it
        missing = [k for k in expected if isinstance(error.instance, dict) and k not in error.instance]
        return f"{_join(path, missing[0] if missing else expected)} is missing"
    if keyword == "additionalProperties" and isinstance(error.instance, dict):
        extra = _unknown_keys(error.instance, error.schema)
        return f"{_join(path, extra[0] if extra else '?')} is not a field of this format"
    return f"{path} = {shown(error.instance)} {_reason(error)}"


def _join(path: str, key: Any) -> str:
    return str(key) if path == "(top level)" else f"{path}.{key}"


def _unknown_keys(instance: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    import re

    known, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    return [k for k in instance if k not in known and not any(re.search(p, k) for p in patterns)]


def _reason(error: Any) -> str:
    """What was expected, short: the schema keyword and its value rather than jsonschema's full sentence
    (which repeats the whole offending value)."""
    keyword, expected = error.validator, error.validator_value
    if isinstance(error.schema, dict) and "description" in error.schema:  # the schema's own words for a union
        return f"is not {error.schema['description']}"
    if keyword == "type":
        return f"is not of type {expected if isinstance(expected, str) else ' or '.join(expected)}"
    if keyword in ("enum", "const"):  # the empty choices (null, "") of optional keys go unsaid
        shown_choices = [str(v) for v in (expected if keyword == "enum" else [expected]) if v not in (None, "")]
        return f"is not one of {', '.join(shown_choices)}"
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        return f"breaks {keyword} {expected}"
    if keyword == "pattern":
        return f"does not match {expected}"
    return f"breaks {keyword} {shown(expected)}"


def check(
    data: Any, schema: dict[str, Any], where: str, fix: str = "regenerate the file", error: type = CorruptFileError
) -> Any:
    """`data` unchanged if it conforms to `schema`; else `error` (a UserError) with one line: where, field
    path, value, expectation and `fix`."""
    found = violation(data, schema)
    if found is None:
        return data
    raise error(f"{where}: {found}; {fix}")
