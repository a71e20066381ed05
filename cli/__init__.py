"""The `npuc` command line, the top layer: `app.py` builds the typer app (`build_app`) and holds the entry point;
each other module has `register(app)`, is listed in `npuc.cli.app.COMMAND_MODULES`, and calls the Python API
(npuc.api)."""
