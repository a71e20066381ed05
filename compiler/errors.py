"""Error types that the CLI maps to exit codes: UserError → 2 (bad input), anything else → 1 (internal)."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: a one-line message saying what is wrong, where, and how to fix it."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UnsupportedError(UserError):
    """The model uses something npuc (or the chosen target) cannot compile."""


class CorruptFileError(UserError):
    """An input artifact or model file is malformed (truncated, wrong magic, offsets out of range)."""
