"""The `npuc` command line, the top layer: `app.py` holds the typer app and the entry point; each other module
has `register(app)`, is listed in `npuc.cli.app.COMMAND_MODULES`, and calls the Python API (npuc.api)."""
