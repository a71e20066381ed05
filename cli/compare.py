"""`npuc compare MODEL --target cv18xx (--calib TABLE | --calib-data DIR) --data DIR [--auto-mixed COS]
[--sensitivity] [--json]`.

For every sample in DIR (.npz keyed by input name, or .npy for a one-input model) the model runs on
onnxruntime (float) and on the quantized reference interpreter; `--auto-mixed COS` searches the fewest layers
to keep in bf16 for an output cosine of COS; `--sensitivity` measures each int8 layer alone in int8 (and with
`--auto-mixed`, the search tries the layers in that order). The comparison and the search live in
passes/calibration/compare.py, the sensitivity in sensitivity.py there.
"""

from __future__ import annotations

import json
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from npuc.cli.options import (
    TableColor,
    TableKeepAspect,
    TableLayout,
    TableMean,
    TablePadType,
    TablePadValue,
    TableResize,
    TableScale,
    preprocess,
    progress_bar,
)
from npuc.compiler.defaults import DEFAULT_MAX_FLOAT_LAYERS
from npuc.compiler.errors import UserError

if TYPE_CHECKING:
    from npuc.passes.calibration.compare import Agreement, CompareReport, MixedResult


def _text(report: CompareReport, mixed: MixedResult | None) -> str:
    def row(a: Agreement) -> str:
        top1 = "" if a.top1_agreement is None else f"  top1 {a.top1_agreement:.3f}"
        return f"  {a.name:<32} cos {a.cosine:.6f}  sqnr {a.sqnr_db:7.2f} dB  max err {a.max_abs_error:.6g}{top1}"

    lines = [f"{report.samples} sample(s)"]
    if report.float_layers:
        lines.append(f"float layers: {', '.join(report.float_layers)}")
    lines += ["outputs:", *map(row, report.outputs), "layers (worst first):", *map(row, report.layers)]
    if mixed is not None:
        verdict = "reached" if mixed.reached else "NOT reached"
        lines.append(
            f"auto-mixed {mixed.target}: {verdict}; int8 cosine {mixed.int8_cosine:.6f}; {mixed.reason}; "
            f"float layers: {', '.join(mixed.float_layers) or '(none)'}"
        )
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare(
        model: Annotated[Path, typer.Argument(help="The float .onnx model.")],
        data: Annotated[
            Path, typer.Option("--data", help="Folder, sample file (.npz/.npy/.jpg/.png) or .txt list, as calibrate.")
        ],
        calib: Annotated[
            Path | None, typer.Option("--calib", help="Calibration table (tpu-mlir cali_table format).")
        ] = None,
        calib_data: Annotated[
            list[str] | None, typer.Option("--calib-data", help="Calibrate (kl) on this folder/list instead.")
        ] = None,
        target: Annotated[str, typer.Option("--target", help="Target whose quantized arithmetic to use.")] = "cv18xx",
        quant: Annotated[str, typer.Option("--quant", help="int8 or bf16.")] = "int8",
        float_layer: Annotated[
            list[str] | None, typer.Option("--float-layer", help="Keep this op or tensor in bf16.")
        ] = None,
        qtable: Annotated[
            Path | None,
            typer.Option(
                "--qtable",
                help="tpu-mlir qtable: its BF16 layers stay bf16 (default: <calib>.qtable if present, as build).",
            ),  # fmt: skip
        ] = None,
        mixed_target: Annotated[
            float | None, typer.Option("--auto-mixed", help="Find the fewest float layers for this output cosine.")
        ] = None,
        max_float: Annotated[
            int, typer.Option("--max-float-layers", help="Bound of the --auto-mixed search.")
        ] = DEFAULT_MAX_FLOAT_LAYERS,
        sensitivity: Annotated[
            bool,
            typer.Option("--sensitivity", help="Rank the int8 layers by the outputs with each alone in int8."),
        ] = False,
        write_qtable: Annotated[
            Path | None,
            typer.Option(
                "--write-qtable",
                help="Write the qtable's and the --auto-mixed layers as a tpu-mlir qtable (e.g. <calib>.qtable, "
                "which build reads).",
            ),  # fmt: skip
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
        input_shape: Annotated[
            list[str] | None, typer.Option("--input-shape", help="Pin an input: NAME:D0,D1,... (dynamic dims).")
        ] = None,
        mean: TableMean = None,
        scale: TableScale = None,
        color: TableColor = None,
        resize: TableResize = None,
        layout: TableLayout = None,
        keep_aspect_ratio: TableKeepAspect = None,
        pad_value: TablePadValue = None,
        pad_type: TablePadType = None,
    ) -> None:
        """Per-output and per-layer agreement of the quantized reference with onnxruntime float.

        Example: npuc compare model.onnx --calib model.cali_table --data photos/ --json
        """
        from npuc.frontends.onnx import parse_input_shapes
        from npuc.passes.calibration.compare import auto_mixed, load_comparison
        from npuc.passes.calibration.qtable import write_qtable as write_qtable_file
        from npuc.passes.calibration.sensitivity import layer_sensitivity, sensitivity_lines

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            shapes = parse_input_shapes(input_shape or []) or None
            given = {"mean": mean, "scale": scale, "color": color, "resize": resize, "layout": layout,
                     "keep_aspect_ratio": keep_aspect_ratio, "pad_value": pad_value, "pad_type": pad_type}  # fmt: skip
            pre = preprocess(mean or "0", scale or "1", color or "rgb", resize, layout or "nchw",
                             bool(keep_aspect_ratio), pad_value or 0, pad_type or "center")  # fmt: skip
            set_here = [name for name, value in given.items() if value is not None]  # else the table's, if any
            comparison = load_comparison(model, calib, data, target, quant, calib_data or (), shapes, pre, set_here,
                                         qtable)  # fmt: skip
        for warning in caught:  # e.g. table rows naming no tensor of this model: one line each, then go on
            typer.echo(f"npuc: warning: {' '.join(str(warning.message).split())}", err=True)
        if comparison.qtable is not None:
            kept = len(comparison.base_float)
            typer.echo(f"npuc: note: {kept} layer(s) kept in bf16 by {comparison.qtable}", err=True)
        if mixed_target is not None and float_layer:
            raise UserError("--auto-mixed chooses the float layers itself; drop --float-layer")
        if write_qtable is not None and mixed_target is None:
            raise UserError("--write-qtable writes what --auto-mixed finds; add --auto-mixed COS")
        ranked = None
        if sensitivity:  # minutes on a large model: a bar on a terminal
            progress, bar = progress_bar()
            with bar or nullcontext():
                ranked = layer_sensitivity(comparison, float_layers=float_layer or (), progress=progress)
        mixed = None
        if mixed_target is None:
            report = comparison.evaluate(float_layer or ())
        else:  # with --sensitivity, the search tries the layers in its order
            order = None if ranked is None else [s.layer for s in ranked]
            mixed = auto_mixed(comparison, mixed_target, max_float, order=order)
            report = mixed.report
        if as_json:
            payload = {
                "samples": report.samples,
                "float_layers": report.float_layers,
                "outputs": [a.public() for a in report.outputs],
                "layers": [a.public() for a in report.layers],
            }
            if mixed is not None:
                payload["auto_mixed"] = mixed.public()
            if ranked is not None:
                payload["sensitivity"] = [s.public() for s in ranked]
            typer.echo(json.dumps(payload, indent=2))
        else:
            typer.echo(_text(report, mixed))
            if ranked is not None:
                typer.echo("\n".join(sensitivity_lines(ranked)))
        if mixed is not None and not mixed.reached:
            raise UserError(f"--auto-mixed {mixed.target}: {mixed.reason}; lower the target or recalibrate")
        if write_qtable is not None:
            layers = [*comparison.base_float, *mixed.float_layers]
            how = "by int8 sensitivity" if sensitivity else "by local loss"
            write_qtable_file(write_qtable, layers, comments=[
                f"npuc compare --auto-mixed {mixed.target} ({how}, on {report.samples} sample(s)): {mixed.reason}",
                f"{len(comparison.base_float)} layer(s) from {comparison.qtable}" if comparison.qtable else
                "no qtable before the search",
            ])  # fmt: skip
            typer.echo(f"npuc: wrote {write_qtable}: {len(layers)} layer(s) in bf16", err=True)
