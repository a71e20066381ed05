"""`npuc export MODEL --target T --qdq [--form exact|plain] -o out.onnx [--calib TABLE | --calib-data DIR]`:
npuc's quantization of MODEL for target T as a QDQ ONNX that onnxruntime runs (what each target's model
represents: passes/export/qdq.py). The exact form (the default for every target) reproduces npuc's int8 arithmetic
bit for bit with integer ops (passes/export/qdq_exact.py; bm1880's lowering, per-layer shifts or per-channel gains as
`--option weight_scale` and the build's default choose: backends/bm1880/qdq.py); the plain form is pure QDQ."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from npuc.cli.options import split_names
from npuc.compiler.errors import UserError

if TYPE_CHECKING:
    from npuc.compiler.ir import Graph
    from npuc.passes.calibration.calitable import CalibrationTable


def export_qdq(
    model: Path,
    target: str,
    output: Path,
    calib: Path | None = None,
    calib_data: list[str] | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    method: str = "kl",
    float_layers: tuple[str, ...] = (),
    form: str | None = None,
    options: dict[str, Any] | None = None,
) -> Path:
    """Import, canonicalize, take or make the table, write the QDQ model atomically; returns `output`.
    `form`: "exact" or "plain" (None: the target's default, passes.export.qdq.default_form); `options`: the
    target's export options (`--option`)."""
    from npuc.compiler.fileio import atomic_write_bytes
    from npuc.compiler.targets import get_target
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.export.qdq import qdq_for_target
    from npuc.passes.rewrite.canonicalize import canonicalize

    get_target(target)  # an unknown name fails with the list of targets
    graph = import_onnx(model, input_shapes or None)
    canonicalize(graph)
    table = _table(model, graph, calib, calib_data, method)
    onnx_model = qdq_for_target(graph, target, table, float_layers, model_path=model, form=form, options=options)
    atomic_write_bytes(output, onnx_model.SerializeToString(deterministic=True))
    return output


def _table(
    model: Path, graph: Graph, calib: Path | None, calib_data: list[str] | None, method: str
) -> CalibrationTable:
    from npuc.compiler.interp import external_shape
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate
    from npuc.passes.calibration.calitable import read_table

    if (calib is None) == (not calib_data):
        raise UserError("give exactly one of --calib TABLE and --calib-data DIR (int8 needs thresholds)")
    if calib is not None:
        if not calib.is_file():
            raise UserError(f"calibration table not found: {calib}; check the path")
        return read_table(calib)
    shapes = {n: external_shape(graph, n) for n in graph.inputs}
    return calibrate(model, calib_data, options=CalibrationOptions(method=method), input_shapes=shapes).table


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export(
        model: Path = typer.Argument(..., help="The ONNX model (float)."),
        target: str = typer.Option(..., "--target", "-t", help="Whose quantization to export (see `npuc targets`)."),
        qdq: bool = typer.Option(False, "--qdq", help="Write a QuantizeLinear/DequantizeLinear ONNX (required)."),
        output: Path = typer.Option(
            None, "--output", "-o", help="The .onnx to write (default <model>_<target>_qdq.onnx)."
        ),
        calib: Path = typer.Option(None, "--calib", help="Calibration table (tpu-mlir cali_table)."),
        calib_data: list[str] = typer.Option([], "--calib-data", help="Samples to calibrate on (folder/files)."),
        method: str = typer.Option("kl", "--method", help="Calibration method with --calib-data: kl, max, ..."),
        input_shape: list[str] = typer.Option([], "--input-shape", help="Pin an input: NAME:D0,D1,..."),
        float_layers: str = typer.Option(None, "--float-layers", help="Comma-separated ops kept in float."),
        form: str = typer.Option(
            None, "--form", help="exact (integer ops, bit-exact with npuc; default where available) or plain QDQ."
        ),
        option: list[str] = typer.Option(
            [], "--option", help="Target option KEY=VALUE as `npuc build` takes it (bm1880: weight_scale)."
        ),
    ) -> None:
        """Export MODEL as TARGET quantizes it, as a QDQ ONNX model onnxruntime runs.

        Example: npuc export model.onnx --target cv18xx --calib model.cali_table --qdq -o model_int8.onnx
        """
        from npuc.cli.options import parse_options
        from npuc.frontends.onnx import parse_input_shapes

        if not qdq:
            raise UserError("npuc export writes QDQ ONNX only; add --qdq")
        out = output or Path(f"{model.stem}_{target}_qdq.onnx")
        layers = tuple(split_names(float_layers))
        export_qdq(model, target, out, calib, calib_data, parse_input_shapes(input_shape), method, layers, form,
                   parse_options(option))  # fmt: skip
        typer.echo(f"wrote {out}")
