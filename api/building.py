"""`npuc build` as a function: import, canonicalize, apply the hb_mapper config, the refinement side file and
the qtable, build for the target, write the depfile."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from npuc.api.shapes import InputShapes, resolution_sets, shape_specs
from npuc.compiler.errors import UserError
from npuc.compiler.targets import BuildResult

CONFIG_DEFAULT_TARGET = "bpu"  # an hb_mapper config describes a Horizon build unless the target says otherwise


def build(
    model: str | Path | None,
    target: str | None = None,
    output: str | Path | None = None,
    *,
    chip: str | None = None,
    quant: str | None = None,
    calib: str | Path | None = None,
    weights: str | Path | None = None,
    input_shapes: InputShapes = None,
    options: Mapping[str, Any] | None = None,
    config: str | Path | None = None,
    depfile: str | Path | None = None,
    qtable: str | Path | None = None,
    recalibrate: bool = False,
    output_names: Sequence[str] = (),
) -> BuildResult:
    """Compile `model` for `target` (see `npuc targets`) and write the artifact atomically.

    `input_shapes`: "NAME:D0,D1,..." strings (an input named again starts another resolution) or {name: dims};
    `options`: the target's option keys (`name`, `float_layers`, ...; `npuc targets` lists them); `config`: an
    hb_mapper YAML (model, inputs, calibration data); `depfile`: also write a Makefile dependency line;
    `qtable`: a tpu-mlir qtable whose BF16 layers stay bf16 (default: `<calib>.qtable` when that file exists);
    `recalibrate`: with `config`, calibrate again even when the table in working_dir is up to date;
    `output_names`: end the ONNX graph at these tensors (what follows them is left to the host).
    The result's `notes` are what the CLI prints as `note:` lines."""
    from npuc.api.hbbuild import apply_config
    from npuc.compiler.interp import external_shape
    from npuc.compiler.targets import BuildRequest, check_request, get_target
    from npuc.frontends.hbconfig import load_config
    from npuc.passes.calibration.refinement import load_refinement, refit_constants, side_file, split_as_recorded
    from npuc.passes.rewrite.canonicalize import canonicalize

    options = dict(options or {})
    shapes = shape_specs(input_shapes)
    hb = load_config(Path(config)) if config is not None else None
    if hb is not None:
        model = model or hb.model
        target = target or CONFIG_DEFAULT_TARGET
        shapes = shapes or [f"{n}:{','.join(map(str, s))}" for n, s in hb.input_shapes().items()]
    if model is None or target is None:
        raise UserError("give MODEL and --target T, or --config YAML (which names the model)")
    if recalibrate and hb is None:
        raise UserError("--recalibrate applies to --config builds (they calibrate from cal_data_dir); add --config")
    model, calib = Path(model), Path(calib) if calib is not None else None
    chosen = get_target(target)
    if chosen.build is None:
        raise UserError(f"target '{target}' cannot build yet ({chosen.status}); see `npuc targets`")
    shape_sets = resolution_sets(shapes)
    if len(shape_sets) > 1:
        options["input_shapes_list"] = shape_sets
    if calib is not None and not calib.is_file():
        raise UserError(f"calibration table not found: {calib}; check the path")
    check_request(chosen, options, chip, quant, calib)  # before any work; a config fills its own keys later
    output_names = tuple(output_names)
    if output_names and (options.get("delegate") or model.suffix.lower() != ".onnx"):
        raise UserError(
            "--output-names cuts an ONNX model npuc compiles; a Caffe model or a --delegate build reads "
            "the whole model: cut the ONNX file itself (onnx.utils.extract_model) and build that"
        )

    notes: list[str] = []
    graph = _import(model, weights, shape_sets[0] if shape_sets else None, options, notes, output_names)
    canonicalize(graph)
    if hb is not None:
        hb = hb.bind({n: external_shape(graph, n) for n in graph.inputs})
        output, calib = apply_config(hb, model, chosen.name, options, notes, output, calib, recalibrate)
    refinement = None
    if calib is not None and side_file(calib).is_file():  # `calibrate --refine`: the split and refitted weights
        refinement = load_refinement(side_file(calib))
        graph = split_as_recorded(graph, refinement, where=str(side_file(calib)))
    # names are resolved on the graph the table describes (a split's group tensors are in it)
    qtable_layers = _qtable_layers(graph, chosen, calib, qtable, options, notes)
    _check_float_layers(graph, options.get("float_layers", ()))
    if refinement is not None:  # the layers kept in bf16 keep the model's constants
        graph = refit_constants(graph, refinement, str(side_file(calib)), options.get("float_layers", ()))
        notes.append(f"refined constants from {side_file(calib)}")
    out = Path(output) if output is not None else Path(f"{model.stem}_{chosen.name}")
    request = BuildRequest(
        graph, model, out, chip=chip, quant=quant, calib_table=calib, options=options, output_names=output_names
    )
    result = chosen.build(request)
    result.notes[:0] = notes
    if qtable_layers:
        result.summary["qtable_bf16_layers"] = qtable_layers
    if depfile is not None:
        from npuc.compiler.depfile import onnx_external_files, write_depfile
        from npuc.passes.calibration.qtable import beside

        read = [model, *onnx_external_files(model), weights, config]
        if calib is not None:
            read += [calib, *(f for f in (side_file(calib), beside(calib)) if f.is_file())]
        write_depfile(depfile, result.artifacts, [*read, qtable])
    result.target = chosen.name
    return result


def _import(model: Path, weights: str | Path | None, shapes: dict | None, options: dict, notes: list[str],
            output_names: tuple[str, ...]) -> Any:  # fmt: skip
    if model.suffix.lower() == ".prototxt":
        from npuc.frontends.caffe import import_caffe

        if weights is not None:  # the frontend's input; bm1880 also records where the weights came from
            options["weights"] = str(weights)
        return import_caffe(model, Path(weights) if weights is not None else None, shapes, notes)
    if weights is not None:
        raise UserError("--weights is for a Caffe .prototxt MODEL; an ONNX model carries its own weights")
    from npuc.frontends.onnx import import_onnx

    return import_onnx(model, shapes, notes, output_names)


def _qtable_layers(graph: Any, target: Any, calib: Path | None, qtable: str | Path | None, options: dict,
                   notes: list[str]) -> list[str]:  # fmt: skip
    """The BF16 layers of the qtable (given, or beside the table), added to options["float_layers"]."""
    from npuc.passes.calibration.qtable import beside, bf16_layers

    path = Path(qtable) if qtable is not None else None
    if path is None and calib is not None and beside(calib).is_file():
        path = beside(calib)
        if "float_layers" not in target.options:
            notes.append(f"{path} not used: target '{target.name}' has no float fallback for its layers")
            return []
    if path is None:
        return []
    if "float_layers" not in target.options:
        raise UserError(f"--qtable is not used by target '{target.name}' (it is for cv18xx); remove it")
    layers = bf16_layers(path, {op.name for op in graph.ops} | set(graph.tensors), target.name)
    options["float_layers"] = list(dict.fromkeys([*options.get("float_layers", ()), *layers]))
    notes.append(f"{len(layers)} layer(s) kept in bf16 by {path}")
    return layers


def _check_float_layers(graph: Any, names: Sequence[str]) -> None:
    """Every --float-layers name must be an op or tensor of the (canonicalized) graph."""
    known = {op.name for op in graph.ops} | set(graph.tensors)
    unknown = [n for n in names if n not in known]
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        raise UserError(
            f"--float-layers {shown} match no op or tensor of the model; use names `npuc inspect MODEL` lists"
        )
