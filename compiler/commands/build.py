"""`npuc build MODEL --target T`: frontend → canonicalize → the target's backend → artifact on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_bytes
from npuc.compiler.interp import external_shape
from npuc.compiler.targets import BuildRequest, check_request, get_target
from npuc.frontends.hbcalib import calibrate_config
from npuc.frontends.hbconfig import HbConfig, load_config
from npuc.frontends.onnx import import_onnx, parse_input_shapes
from npuc.passes.calitable import write_table
from npuc.passes.canonicalize import canonicalize
from npuc.passes.refinement import apply_refinement, load_refinement, side_file


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UserError(f"bad --option '{text}': write KEY=VALUE, e.g. --option parallel_mode=MP")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _parse_numbers(text: str, flag: str) -> list[float]:
    """'127.5' or '123.675,116.28,103.53' as a list of floats (one value or one per channel)."""
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"bad {flag} '{text}': give a number or comma-separated numbers, e.g. {flag} 127.5") from None


def _shape_sets(specs: list[str]) -> list[dict[str, tuple[int, ...]]]:
    """Repeated --input-shape values for the same input start a new set (one per resolution)."""
    sets: list[dict[str, tuple[int, ...]]] = []
    for spec in specs:
        ((name, shape),) = parse_input_shapes([spec]).items()
        if not sets or name in sets[-1]:
            sets.append({})
        sets[-1][name] = shape
    return sets


CONFIG_DEFAULT_TARGET = "bpu"  # an hb_mapper config describes a Horizon build unless --target says otherwise


def _apply_config(
    hb: HbConfig,
    model: Path,
    target: str,
    options: dict[str, Any],
    notes: list[str],
    output: Path | None,
    calib: Path | None,
) -> tuple[Path, Path | None]:
    """Fill what the command line left open from the config: name, output, inputs, calibration table."""
    options.setdefault("name", hb.output_prefix)
    options.setdefault("march", hb.march)
    options["hb_inputs"] = hb.inputs
    notes.extend(f"{hb.source.name}: {line}" for line in hb.ignored)
    if output is None or (calib is None and hb.cal_data_dir is not None):
        hb.working_dir.mkdir(parents=True, exist_ok=True)
    if calib is None and hb.cal_data_dir is not None:
        calib = hb.working_dir / f"{hb.output_prefix}_cali_table.txt"
        write_table(calibrate_config(hb, model), calib)
        notes.append(f"calibrated on {hb.cal_data_dir} ({hb.calib_method[0]}): {calib}")
    return output or hb.working_dir / f"{hb.output_prefix}_{target}", calib


def _check_float_layers(graph: Any, names: list[str]) -> None:
    """Every --float-layers name must be an op or tensor of the (canonicalized) graph."""
    known = {op.name for op in graph.ops} | set(graph.tensors)
    unknown = [n for n in names if n not in known]
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        raise UserError(
            f"--float-layers {shown} match no op or tensor of the model; use names `npuc inspect MODEL` lists"
        )


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build(
        model: Path = typer.Argument(None, help="The ONNX model to compile (optional with --config)."),
        target: str = typer.Option(None, "--target", "-t", help="Target name (see `npuc targets`; bpu with --config)."),
        output: Path = typer.Option(None, "--output", "-o", help="Artifact path (default: <model>_<target>)."),
        chip: str = typer.Option(None, "--chip", help="Chip of the target family."),
        quant: str = typer.Option(None, "--quant", help="Number format (target-specific, e.g. int8, bf16, fp16)."),
        calib: Path = typer.Option(None, "--calib", help="Calibration table (tpu-mlir cali_table)."),
        weights: Path = typer.Option(None, "--weights", help="Caffe weights (.caffemodel) for a .prototxt MODEL."),
        opt: str = typer.Option(None, "--opt", help="bm1880 layer groups: none, layer-group, layer-group-weight."),
        input_shape: list[str] = typer.Option(
            [], "--input-shape", help="NAME:D0,D1,...; repeat an input for several resolutions."
        ),
        name: str = typer.Option(None, "--name", help="Network name in generated sources."),
        mean: str = typer.Option(None, "--mean", help="Input mean: one number or R,G,B (targets that convert)."),
        scale: str = typer.Option(None, "--scale", help="Input scale: one number or R,G,B, applied after --mean."),
        color: str = typer.Option(None, "--color", help="Channel order of the runtime input: rgb or bgr."),
        convert: str = typer.Option(None, "--convert", help="Input convert policy (dmp: div_255, minus_128, ...)."),
        input_dtype: str = typer.Option(None, "--input-dtype", help="Data type the runtime is fed."),
        delegate: bool = typer.Option(False, "--delegate", help="Emit a vendor build script instead (lyngor)."),
        float_layers: str = typer.Option(
            None, "--float-layers", help="Comma-separated op or tensor names kept in the fallback format."
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
    ) -> None:
        """Compile MODEL for a target and write the artifact atomically."""
        hb = load_config(config) if config is not None else None
        if hb is not None:
            model = model or hb.model
            target = target or CONFIG_DEFAULT_TARGET
            if not input_shape:
                input_shape = [f"{n}:{','.join(map(str, s))}" for n, s in hb.input_shapes().items()]
        if model is None or target is None:
            raise UserError("give MODEL and --target T, or --config YAML (which names the model)")
        chosen = get_target(target)
        if chosen.build is None:
            raise UserError(f"target '{target}' cannot build yet ({chosen.status}); see `npuc targets`")
        shape_sets = _shape_sets(input_shape)
        options: dict[str, Any] = dict(_parse_option(o) for o in option)
        if name is not None:
            options["name"] = name
        for key, text in (("mean", mean), ("scale", scale)):
            if text is not None:
                options[key] = _parse_numbers(text, f"--{key}")
        for key, text in (("color", color), ("convert", convert)):
            if text is not None:
                options[key] = text
        if input_dtype is not None:
            options["input_dtype"] = input_dtype
        if delegate:
            options["delegate"] = True
        if float_layers:
            options["float_layers"] = [n.strip() for n in float_layers.split(",") if n.strip()]
        for flag, value in (("quant_input", quant_input), ("quant_output", quant_output)):
            if value:
                options[flag] = True
        if no_layer_group:
            options["layer_group"] = False
        if len(shape_sets) > 1:
            options["input_shapes_list"] = shape_sets
        if calib is not None and not calib.is_file():
            raise UserError(f"calibration table not found: {calib}; check the path")
        if opt is not None:
            options["opt"] = opt
        # what the chosen target would ignore is an error, before any work (the config fills its own later)
        check_request(chosen, options, chip, quant, calib if hb is None or calib is not None else None)

        notes: list[str] = []
        if model.suffix.lower() == ".prototxt":
            from npuc.frontends.caffe import import_caffe

            if weights is not None:  # the frontend's input; bm1880 also records where the weights came from
                options["weights"] = str(weights)
            graph = import_caffe(model, weights, shape_sets[0] if shape_sets else None, notes)
        else:
            if weights is not None:
                raise UserError("--weights is for a Caffe .prototxt MODEL; an ONNX model carries its own weights")
            graph = import_onnx(model, shape_sets[0] if shape_sets else None, notes)
        canonicalize(graph)
        _check_float_layers(graph, options.get("float_layers", ()))
        if hb is not None:
            hb = hb.bind({n: external_shape(graph, n) for n in graph.inputs})
            output, calib = _apply_config(hb, model, chosen.name, options, notes, output, calib)
        if calib is not None and side_file(calib).is_file():  # `calibrate --refine`: refitted weights
            graph = apply_refinement(graph, load_refinement(side_file(calib)), where=str(side_file(calib)))
            notes.append(f"refined constants from {side_file(calib)}")
        out = output or Path(f"{model.stem}_{chosen.name}")
        request = BuildRequest(graph, model, out, chip=chip, quant=quant, calib_table=calib, options=options)
        result = chosen.build(request)

        if depfile is not None:
            deps = " ".join(str(p) for p in [model, calib, config] if p is not None)
            atomic_write_bytes(depfile, f"{' '.join(str(a) for a in result.artifacts)}: {deps}\n".encode())
        if as_json:
            summary = {"target": chosen.name, "artifacts": [str(a) for a in result.artifacts], **result.summary}
            typer.echo(json.dumps(summary, indent=2, default=str))
            return
        for note in [*notes, *result.notes]:
            typer.echo(f"note: {note}")
        for artifact in result.artifacts:
            typer.echo(f"wrote {artifact}")
        for key, value in result.summary.items():
            typer.echo(f"  {key}: {value}")
