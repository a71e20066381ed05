"""The one way a name from a model (node, tensor, graph, --name) enters each kind of generated text.

A model's names are arbitrary strings: newlines, `*/`, quotes, backslashes, `../`, non-ASCII. Each context has
exactly one function here, and every writer goes through it:
- C identifier (`c_identifier`): letters, digits, underscores.
- file name stem (`file_stem`): what a name becomes in the name of a generated file (no separator, no `..`).
- C string literal body (`c_string`), C comment text (`c_comment`).
- Python string literal (`py_string`) for generated scripts.
- a field of a whitespace-separated text table (`table_field`: cali_table, qtable rows): refused, not
  rewritten, when the name cannot be one field (the table is read back by name).
JSON manifests need no function of their own: `json.dumps` escapes every string.
"""

from __future__ import annotations

import json
import re

from .errors import UserError

MAX_IDENTIFIER = 120  # leaves room for suffixes (_gen.cpp, _input0_shift, ...) within a 255-byte file name


def c_identifier(name: str, prefix: str = "Net_") -> str:
    """A C/C++ identifier from any text: every other character becomes `_`, a leading digit (or nothing) gets
    `prefix`, and the result is cut to MAX_IDENTIFIER characters."""
    ident = re.sub(r"[^0-9A-Za-z_]", "_", name)[:MAX_IDENTIFIER]
    return ident if ident and not ident[0].isdigit() else f"{prefix}{ident}"


def file_stem(name: str) -> str:
    """A file name stem from any text: letters, digits, `_`, `-` and inner dots; never empty, never starting
    with a dot (hidden, `.` or `..`), at most MAX_IDENTIFIER characters."""
    stem = re.sub(r"[^0-9A-Za-z_.-]", "_", name)[:MAX_IDENTIFIER]
    return stem if stem and not stem.startswith(".") else f"_{stem}"


def c_string(text: str) -> str:
    """The body of a C string literal for any text: printable ASCII as itself (backslash and quote escaped),
    every other byte of its UTF-8 as a 3-digit octal escape (a hex escape would swallow following digits)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '\\"?':  # `?` too: "??/" is a trigraph for a backslash under -std=c++14
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return "".join(out)


def c_comment(text: str) -> str:
    """Text that stays inside a // or /* */ comment: no line breaks or other control characters, no `*/`, no
    backslash (a trailing one would splice the next source line into a // comment)."""
    clean = "".join(" " if ord(c) < 0x20 or c in "\x7f\u2028\u2029" else c for c in text).replace("\\", "/")
    while "*/" in clean or "??" in clean:  # "??/" is a trigraph: a backslash that splices lines
        clean = clean.replace("*/", "* /").replace("??", "? ?")
    return clean


def py_string(text: str) -> str:
    """A Python string literal (quotes included) for any text: JSON's ASCII-only escaping is valid Python."""
    return json.dumps(text, ensure_ascii=True)


def table_field(name: str, what: str) -> str:
    """`name` as one field of a whitespace-separated text table row, or a UserError when it cannot be one."""
    if not name or re.search(r"\s", name) or name.startswith("#"):
        raise UserError(
            f"tensor name {name[:60]!r} cannot be written into a {what} (its rows are whitespace-separated and "
            "'#' starts a comment); rename the tensor in the model"
        )
    return name
