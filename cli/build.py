"""`npuc build MODEL --target T`: frontend → canonicalize → the target's backend → artifact on disk."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from npuc.cli.options import parse_options, split_names
from npuc.compiler.errors import UserError


def _parse_numbers(text: str, flag: str) -> list[float]:
    """'127.5' or '123.675,116.28,103.53' as a list of floats (one value or one per channel)."""
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"bad {flag} '{text}': give a number or comma-separated numbers, e.g. {flag} 127.5") from None


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build(
        model: Path = typer.Argument(None, help="The ONNX model to compile (optional with --config)."),
        target: str = typer.Option(None, "--target", "-t", help="Target name (see `npuc targets`; bpu with --config)."),
        output: Path = typer.Option(None, "--output", "-o", help="Artifact path (default: <model>_<target>)."),
        chip: str = typer.Option(
            None, "--chip", help="Chip of the target family (default: cv18xx cv181x; the others have one chip)."
        ),
        quant: str = typer.Option(
            None, "--quant", help="Number format (default: int8 for cv18xx, bm1880, bpu; fp16 for dmp, lyngor)."
        ),
        calib: Path = typer.Option(None, "--calib", help="Calibration table (tpu-mlir cali_table)."),
        weights: Path = typer.Option(None, "--weights", help="Caffe weights (.caffemodel) for a .prototxt MODEL."),
        opt: str = typer.Option(
            None, "--opt", help="bm1880 layer groups: none, layer-group (default), layer-group-weight."
        ),
        input_shape: list[str] = typer.Option(
            [], "--input-shape", help="NAME:D0,D1,...; repeat an input for several resolutions."
        ),
        output_names: str = typer.Option(
            None, "--output-names", help="Comma-separated ONNX tensors to end the graph at (the rest is the host's)."
        ),
        name: str = typer.Option(None, "--name", help="Network name in generated sources."),
        mean: str = typer.Option(None, "--mean", help="Input mean: one number or R,G,B (targets that convert)."),
        scale: str = typer.Option(None, "--scale", help="Input scale: one number or R,G,B, applied after --mean."),
        color: str = typer.Option(None, "--color", help="Channel order of the runtime input: rgb or bgr."),
        convert: str = typer.Option(None, "--convert", help="Input convert policy (dmp: div_255, minus_128, ...)."),
        input_dtype: str = typer.Option(None, "--input-dtype", help="Data type the runtime is fed."),
        pixel_format: str = typer.Option(
            None,
            "--pixel-format",
            help="cv18xx uint8 frame: rgb_planar, bgr_packed, gray, nv21, ... (fused preprocess).",
        ),
        aligned_input: bool = typer.Option(False, "--aligned-input", help="cv18xx frame rows/planes VPSS-aligned."),
        delegate: bool = typer.Option(False, "--delegate", help="Emit a vendor build script instead (lyngor)."),
        float_layers: str = typer.Option(
            None, "--float-layers", help="Comma-separated op or tensor names kept in the fallback format."
        ),
        qtable: Path = typer.Option(
            None, "--qtable", help="tpu-mlir qtable: its BF16 layers stay bf16 (default: <calib>.qtable if present)."
        ),
        allow_partial_table: bool = typer.Option(
            False, "--allow-partial-table", help="Use a calibration table that lacks many of the model's tensors."
        ),
        quant_input: bool = typer.Option(False, "--quant-input", help="Feed the model int8 instead of float32."),
        quant_output: bool = typer.Option(False, "--quant-output", help="Return int8 outputs, not float32."),
        no_layer_group: bool = typer.Option(False, "--no-layer-group", help="One layer at a time through gmem."),
        option: list[str] = typer.Option([], "--option", help="Target option KEY=VALUE (JSON values allowed)."),
        depfile: Path = typer.Option(None, "--depfile", help="Write a Makefile dependency line here."),
        as_json: bool = typer.Option(False, "--json", help="Print a machine-readable summary."),
        config: Path = typer.Option(
            None, "--config", help="hb_mapper-style YAML: model, inputs, preprocessing, calibration data."
        ),
        recalibrate: bool = typer.Option(
            False, "--recalibrate", help="With --config: calibrate again even if the table in working_dir is current."
        ),
    ) -> None:
        """Compile MODEL for a target and write the artifact atomically.

        Example: npuc build model.onnx --target cv18xx --chip cv181x --calib model.cali_table -o model.cvimodel
        """
        options = parse_options(option)
        if name is not None:
            options["name"] = name
        for key, text in (("mean", mean), ("scale", scale)):
            if text is not None:
                options[key] = _parse_numbers(text, f"--{key}")
        for key, text in (("color", color), ("convert", convert)):
            if text is not None:
                options[key] = text
        for key, text in (("input_dtype", input_dtype), ("pixel_format", pixel_format)):
            if text is not None:
                options[key] = text
        if delegate:
            options["delegate"] = True
        if float_layers:
            options["float_layers"] = split_names(float_layers)
        switches = (("quant_input", quant_input), ("quant_output", quant_output),
                    ("allow_partial_table", allow_partial_table), ("aligned_input", aligned_input))  # fmt: skip
        for flag, value in switches:
            if value:
                options[flag] = True
        if no_layer_group:
            options["layer_group"] = False
        if opt is not None:
            options["opt"] = opt
        from npuc.api import building

        result = building.build(model, target, output, chip=chip, quant=quant, calib=calib, weights=weights,
                           input_shapes=input_shape, options=options, config=config, depfile=depfile,
                           qtable=qtable, recalibrate=recalibrate,
                           output_names=split_names(output_names))  # fmt: skip
        if as_json:
            typer.echo(json.dumps(result.record(), indent=2, default=str))
            return
        for note in result.notes:
            typer.echo(f"note: {note}")
        for artifact in result.artifacts:
            typer.echo(f"wrote {artifact}")
        for key, value in result.summary.items():
            typer.echo(f"  {key}: {value}")
