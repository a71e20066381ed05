"""The `npuc` command line: a typer app whose commands live in `npuc.cli`.

Exit codes: 0 success, 2 bad input (one line on stderr: what, where, how to fix), 1 internal error.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

import typer

from npuc.compiler.errors import UserError

COMMAND_MODULES = ("targets", "inspect", "run", "build", "calibrate", "compare", "export")  # each registers its name


def _version(value: bool) -> None:
    if value:
        from npuc import __version__

        typer.echo(f"npuc {__version__}")
        raise typer.Exit()


def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print npuc's version and exit."
    ),
) -> None:
    """Compile ONNX models into vendor NPU artifacts, and inspect, run and compare them."""


def build_app(commands: Sequence[str] = COMMAND_MODULES) -> typer.Typer:
    """The typer app with `commands` (modules of npuc.cli, each registering the command of its name)."""
    app = typer.Typer(
        name="npuc",
        help="Compile ONNX models into vendor NPU artifacts, and inspect, run and compare them.",
        no_args_is_help=True,
        add_completion=True,  # `npuc --install-completion` / `--show-completion` for bash, zsh, fish
        pretty_exceptions_enable=False,
        rich_markup_mode=None,  # plain help: rendering it with rich costs ~0.5 s of imports on every --help
    )
    app.callback()(_main)
    for module in commands:
        importlib.import_module(f"npuc.cli.{module}").register(app)
    return app


def fail(message: str, code: int) -> None:
    print(f"npuc: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app and turns exceptions into exit codes.

    typer reports usage errors itself (exit 2); npuc's UserError becomes one line and exit 2; anything else
    is a bug in npuc: one line and exit 1.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    # a command named first needs only its own module: typer converts every registered command's parameters
    # on each call (~0.04 s of a small model's `npuc run`); anything else (--help, --version, a typo) gets all
    commands = args[:1] if args[:1] and args[0] in COMMAND_MODULES else COMMAND_MODULES
    try:
        build_app(commands)(args=args, prog_name="npuc")
    except UserError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except Exception as exc:
        if os.environ.get("NPUC_TRACEBACK") == "1":
            raise
        fail(
            f"internal error: {type(exc).__name__}: {exc}; please report it with the command line and model "
            "(NPUC_TRACEBACK=1 shows the traceback)",
            1,
        )
