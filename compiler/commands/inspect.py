"""`npuc inspect PATH`: describe an ONNX model or a vendor artifact."""

from __future__ import annotations

from pathlib import Path

import typer
from npuc.compiler.artifacts import ArtifactOptions, detect
from npuc.frontends.onnx import parse_input_shapes


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect(
        path: Path = typer.Argument(..., help="An .onnx model, a .cvimodel, a .bmodel or a target output folder."),
        disasm: bool = typer.Option(False, "--disasm", help="List the decoded instructions of command buffers."),
        input_shape: list[str] = typer.Option([], "--input-shape", help="Pin an input: NAME:D0,D1,... (ONNX)."),
    ) -> None:
        """Print what a model or artifact contains (ops, shapes, FLOPs; headers, sections, tensors)."""
        options = ArtifactOptions(disasm=disasm, input_shapes=parse_input_shapes(input_shape))
        typer.echo(detect(path).describe(path, options))
