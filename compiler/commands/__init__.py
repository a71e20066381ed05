"""CLI commands; each module has `register(app)` and is listed in `npuc.compiler.cli.COMMAND_MODULES`."""
