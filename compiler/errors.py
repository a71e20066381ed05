"""Error types that the CLI maps to exit codes: UserError → 2 (bad input), anything else → 1 (internal)."""

from __future__ import annotations

import re

# line breaks and other control characters, which names and text quoted from a damaged file may hold
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


class UserError(Exception):
    """Bad input from the user: a one-line message saying what is wrong, where, and how to fix it. Control
    characters quoted into it (a node name with a newline, a parser's multi-line report) are shown as Python
    escapes (`\\n`, `\\r`), so the message stays one line whatever the file held."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        message = _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(message))
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UnsupportedError(UserError):
    """The model uses something npuc (or the chosen target) cannot compile."""


class CorruptFileError(UserError):
    """An input artifact or model file is malformed (truncated, wrong magic, offsets out of range)."""
