"""npuc's Python API: what the CLI commands do, for scripts (`import npuc; npuc.build(...)`).

Every function raises `npuc.UserError` (bad input, one line) instead of exiting, and writes exactly what the
command writes: `npuc build m.onnx --target T ...` and `npuc.build("m.onnx", "T", ...)` give the same bytes.
The CLI (cli/) parses flags into these arguments and prints the results.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.targets import BuildResult

CONFIG_DEFAULT_TARGET = "bpu"  # an hb_mapper config describes a Horizon build unless the target says otherwise
InputShapes = Sequence[str] | Mapping[str, Sequence[int]] | None
QUANT_ALIASES = {"float16": "fp16"}  # spellings a target accepts for the same format


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
) -> BuildResult:
    """Compile `model` for `target` (see `npuc targets`) and write the artifact atomically.

    `input_shapes`: "NAME:D0,D1,..." strings (an input named again starts another resolution) or {name: dims};
    `options`: the target's option keys (`name`, `float_layers`, ...; `npuc targets` lists them); `config`: an
    hb_mapper YAML (model, inputs, calibration data); `depfile`: also write a Makefile dependency line;
    `qtable`: a tpu-mlir qtable whose BF16 layers stay bf16 (default: `<calib>.qtable` when that file exists);
    `recalibrate`: with `config`, calibrate again even when the table in working_dir is up to date.
    The result's `notes` are what the CLI prints as `note:` lines."""
    from npuc.api.hbbuild import apply_config
    from npuc.compiler.interp import external_shape
    from npuc.compiler.targets import BuildRequest, check_request, get_target
    from npuc.frontends.hbconfig import load_config
    from npuc.passes.calibration.refinement import apply_refinement, load_refinement, side_file
    from npuc.passes.rewrite.canonicalize import canonicalize

    options = dict(options or {})
    shapes = _shape_specs(input_shapes)
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
    shape_sets = _shape_sets(shapes)
    if len(shape_sets) > 1:
        options["input_shapes_list"] = shape_sets
    if calib is not None and not calib.is_file():
        raise UserError(f"calibration table not found: {calib}; check the path")
    check_request(chosen, options, chip, quant, calib)  # before any work; a config fills its own keys later

    notes: list[str] = []
    graph = _import(model, weights, shape_sets[0] if shape_sets else None, options, notes)
    canonicalize(graph)
    if hb is not None:
        hb = hb.bind({n: external_shape(graph, n) for n in graph.inputs})
        output, calib = apply_config(hb, model, chosen.name, options, notes, output, calib, recalibrate)
    if calib is not None and side_file(calib).is_file():  # `calibrate --refine`: the split and refitted weights
        graph = apply_refinement(graph, load_refinement(side_file(calib)), where=str(side_file(calib)))
        notes.append(f"refined constants from {side_file(calib)}")
    # names are resolved on the graph the table describes (a split's group tensors are in it)
    qtable_layers = _qtable_layers(graph, chosen, calib, qtable, options, notes)
    _check_float_layers(graph, options.get("float_layers", ()))
    out = Path(output) if output is not None else Path(f"{model.stem}_{chosen.name}")
    request = BuildRequest(graph, model, out, chip=chip, quant=quant, calib_table=calib, options=options)
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


def inspect(path: str | Path, disasm: bool = False, input_shapes: InputShapes = None) -> str:
    """The description `npuc inspect` prints of a model or artifact."""
    from npuc.compiler.artifacts import ArtifactOptions, detect

    shapes = _as_shape_dict(input_shapes)
    return detect(Path(path)).describe(Path(path), ArtifactOptions(disasm=disasm, input_shapes=shapes))


def run(path: str | Path, feeds: Mapping[str, np.ndarray], input_shapes: InputShapes = None) -> dict[str, np.ndarray]:
    """Run an ONNX model on the float reference, or an artifact on npuc's simulator from its bytes."""
    from npuc.compiler.artifacts import ArtifactOptions, detect

    kind = detect(Path(path))
    if kind.run is None:
        raise UserError(f"{path}: npuc cannot run {kind.name} artifacts yet; `npuc inspect` reads them")
    return kind.run(Path(path), dict(feeds), ArtifactOptions(input_shapes=_as_shape_dict(input_shapes)))


class CheckResult(dict):
    """(target, format) -> the gaps `check` found there, and how many ops the canonical graph has."""

    def __init__(self, op_count: int) -> None:
        super().__init__()
        self.op_count = op_count


def check(
    model: str | Path,
    target: str = "all",
    *,
    quant: str | None = None,
    chip: str | None = None,
    input_shapes: InputShapes = None,
) -> CheckResult:
    """Every op of an ONNX `model` that `target` ("all": every target that builds) cannot run, per number format.

    Each (target, quant) pair gets a trial build into a temporary folder, on a throwaway max-abs table from one
    seeded random sample where the format needs one; its per-op loops record each failing op instead of stopping
    (compiler/coverage.py). An empty list: the whole model builds. A `Gap` whose `op` is None stops the model as
    a whole (its input shape, an option)."""
    import tempfile

    from npuc.compiler.coverage import Gap, GapsFound, collecting
    from npuc.compiler.targets import BuildRequest, all_targets, check_request, get_target
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.rewrite.canonicalize import canonicalize

    model = Path(model)
    if model.suffix.lower() != ".onnx":
        raise UserError(f"{model}: --target checks an ONNX model; convert it first or build it directly")
    if target == "all":  # --quant / --chip narrow "all" to the targets that have them
        chosen = [t for t in all_targets() if t.build is not None]
        chosen = [t for t in chosen if (quant is None or quant in t.quants) and (chip is None or chip in t.chips)]
        if not chosen:
            raise UserError(f"no target has {' and '.join(f for f in (quant, chip) if f)}; see `npuc targets`")
    else:
        chosen = [get_target(target)]
        check_request(chosen[0], {}, chip, quant, None)
    shapes = _as_shape_dict(input_shapes) or None
    graph = import_onnx(model, shapes, [])
    canonicalize(graph)
    found = CheckResult(op_count=len(graph.ops))
    with tempfile.TemporaryDirectory(prefix="npuc-check-") as scratch:
        table = None
        for t in chosen:
            if t.build is None:
                raise UserError(f"target '{t.name}' cannot build yet ({t.status}); see `npuc targets`")
            for q in [quant] if quant else list(dict.fromkeys(QUANT_ALIASES.get(q, q) for q in t.quants)) or [None]:
                if t.uses_calib and q not in ("bf16", "fp16", "float32") and table is None:
                    table = _probe_table(model, shapes, Path(scratch))
                out = Path(scratch) / f"{t.name}_{q}"
                request = BuildRequest(
                    copy.deepcopy(graph), model, out, chip=chip, quant=q,
                    calib_table=table if t.uses_calib else None,
                )  # fmt: skip
                with collecting() as gaps:
                    try:
                        t.build(request)
                    except GapsFound:
                        pass
                    except UserError as exc:
                        gaps.append(Gap(None, None, str(exc)))
                found[(t.name, q or "")] = list(gaps)
    return found


def _probe_table(model: Path, shapes: dict | None, folder: Path) -> Path:
    """A max-abs calibration table from one seeded random sample: numbers only a coverage check may use."""
    from npuc.compiler.fileio import save_npz
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate, plan_calibration
    from npuc.passes.calibration.calitable import write_table

    rng = np.random.default_rng(0)
    sample = {
        spec.name: rng.standard_normal(spec.shape).astype(spec.dtype)
        if np.dtype(spec.dtype).kind == "f"
        else np.ones(spec.shape, spec.dtype)  # token ids, masks: 1 is valid for both
        for spec in plan_calibration(model, shapes).inputs
    }
    save_npz(folder / "probe.npz", sample)
    result = calibrate(model, [folder / "probe.npz"], options=CalibrationOptions(method="max"), input_shapes=shapes)
    write_table(result.table, folder / "probe_table.txt")
    return folder / "probe_table.txt"


@dataclass
class Calibrated:
    """What `calibrate` did: the run's result, and what to tell the user (`notes` and the held-out `report`
    always, `details` on a terminal)."""

    result: Any  # passes.calibration.calibrate.CalibrationResult
    notes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    report: list[str] = field(default_factory=list)  # accuracy on samples no threshold saw (--method auto)

    def record(self, table: str | Path | None) -> dict[str, Any]:
        """The machine-readable summary (`npuc calibrate --json`); `table`: the path written, if any."""
        from npuc.compiler.version import VERSION

        made = self.result.table
        return {
            "npuc": VERSION,
            "table": str(table) if table is not None else None,
            "method": made.method if made is not None else None,
            "samples": self.result.samples,
            "notes": list(self.notes),
            "details": list(self.details),
            "report": list(self.report),
        }


HELD_OUT_SHARE = 5  # --target-cos measures on the last fifth of the samples (at least one)


def calibrate(
    model: str | Path,
    data: Sequence[str | Path],
    output: str | Path | None = None,
    *,
    method: str = "auto",
    percentile: float = 99.99,
    batch: int = 1,
    bins: int | None = None,
    tune: int = 0,
    refine: str = "",
    refine_samples: int = 100,
    split_channels: int = 0,
    preprocess: Any = None,
    input_shapes: InputShapes = None,
    samples: int | None = None,
    ranges: str | Path | None = None,
    range_only: bool = False,
    save_stats: str | Path | None = None,
    bmnet: str | Path | None = None,
    jobs: int | None = None,
    ray: str | None = None,
    target_cos: float | None = None,
    max_float_layers: int | None = None,
    float_patterns: bool = True,
    budget: float | None = None,
    fit: bool = True,
    depfile: str | Path | None = None,
    on_bad_sample: str = "fail",
    progress: Any = None,
) -> Calibrated:
    """Calibrate `model` on `data` (folders, sample files, .txt lists) and write what `npuc calibrate` writes:
    the tpu-mlir table at `output`, `<output>.refine.npz` (`refine`, `split_channels`), `<output>.qtable` (the
    float patterns, `target_cos`), BMNet's table (`bmnet`), mergeable statistics (`save_stats`).
    `depfile`: a Makefile rule from the files written to every file read (model, its external data, each
    sample, lists, `ranges`). `on_bad_sample`: "fail" (default) or "skip" a sample that cannot be read,
    decided before the first pass. `budget`: seconds of each of `--method auto`'s searches (default 30; estimated
    by a fixed cost model, so the same inputs give the same table on any machine; 0: one method for all, no fit).
    `fit`: `--method auto` also tries the channel split, tune step and weight refit
    (passes/calibration/fit_choice.py)."""
    from npuc.compiler.defaults import DEFAULT_BUDGET, DEFAULT_TARGET_COS
    from npuc.passes.calibration import calibrate as calib
    from npuc.passes.calibration import calibration_run as steps
    from npuc.passes.calibration.calitable import write_table
    from npuc.passes.calibration.compare import DEFAULT_MAX_FLOAT_LAYERS
    from npuc.passes.calibration.histogram import DEFAULT_BINS, load_stats
    from npuc.passes.calibration.histogram import save_stats as write_stats
    from npuc.passes.calibration.preprocess import IMAGE_SUFFIXES, Preprocess, list_samples, screen_samples
    from npuc.passes.calibration.refinement import Refinement, save_refinement, side_file

    model = Path(model)
    output, save_stats, bmnet = (Path(p) if p is not None else None for p in (output, save_stats, bmnet))
    if (refine or split_channels > 1) and output is None:
        raise UserError("--refine / --split-channels write a file beside the table; give -o TABLE")
    if output is None and save_stats is None and bmnet is None:
        raise UserError("nothing to write; give -o TABLE, --bmnet TABLE and/or --save-stats FILE")
    if range_only and (save_stats is None or output is not None):
        raise UserError("--range-only writes statistics only; give --save-stats FILE and no -o")
    _check_folders((output, "-o"), (save_stats, "--save-stats"), (bmnet, "--bmnet"))
    if budget is not None and not 0 <= budget <= 86400:
        raise UserError(f"--budget {budget}: give the per-tensor search's seconds, 0..86400 (0 turns it off)")
    auto = method == "auto"  # measured choice among the methods (passes/calibration/method_choice.py) on a plain table
    fitted = bool(tune or refine or split_channels > 1 or range_only)
    options = calib.CalibrationOptions(
        method="kl" if auto else method, percentile=percentile, batch=batch, bins=bins or DEFAULT_BINS, tune=tune,
        refine=refine, refine_samples=refine_samples, split_channels=split_channels,
    )  # fmt: skip
    pre = preprocess or Preprocess()
    shapes = _as_shape_dict(input_shapes)
    steps.check_batchable(model, shapes, options)  # before the long passes
    done = Calibrated(None)
    # what this run writes is never one of its samples (a table written into the sample folder, then rerun)
    written = {p.resolve() for p in (output, save_stats, bmnet) if p is not None}
    written |= {side_file(p).resolve() for p in (output,) if p is not None}
    listed = [f for f in list_samples(data, samples) if f.resolve() not in written]
    usable, skipped = screen_samples(listed, calib.plan_calibration(model, shapes or None).inputs, pre, on_bad_sample)
    done.notes += skipped
    if len(usable) != len(list_samples(data, samples)):
        data, samples = usable, None
    held_out: list[Path] = []
    refinement = None  # the side file's split and refit, when --method auto keeps its fitted candidate
    if target_cos is not None and not 0 <= target_cos <= 1:
        raise UserError(f"--target-cos {target_cos}: give an output cosine in (0, 1], e.g. 0.99 (0 turns it off)")
    # --method auto sets its own report part apart, and --target-cos (on by default) searches on it
    searched_on_report = auto and not fitted and output is not None and target_cos != 0
    explicit_target = bool(target_cos)
    if searched_on_report and explicit_target and len(usable) < 10:
        searched_on_report = False  # too few for a report part: the target gets the last fifth, as with a method
    if target_cos and not searched_on_report:
        if output is None or refine or split_channels > 1 or range_only:
            raise UserError("--target-cos searches over a plain table: give -o TABLE, without --refine, "
                            "--split-channels or --range-only")  # fmt: skip
        files = usable
        if len(files) < 2:
            raise UserError(f"--target-cos needs at least 2 samples (one to calibrate, one to measure); "
                            f"found {len(files)}")  # fmt: skip
        count = max(1, len(files) // HELD_OUT_SHARE)
        data, held_out, samples = files[:-count], files[-count:], None
    run = functools.partial(calib.calibrate, model, pre=pre, options=options, input_shapes=shapes, progress=progress,
                            jobs=jobs, ray_address=ray)  # fmt: skip
    frozen = load_stats(ranges) if ranges is not None else None
    # the layers the float patterns keep in bf16: the method choice measures with them, the qtable lists them
    patterns = steps.pattern_layers_of(model, shapes, float_patterns and (output is not None or (auto and not fitted)))
    if auto and not fitted:
        search = DEFAULT_BUDGET if budget is None else budget
        may_fit = (
            ""
            if fit and output is not None and bmnet is None
            else "--no-fit"
            if not fit
            else "it needs -o TABLE for its side file, and --bmnet the unsplit model"
        )
        auto_run = steps.calibrate_auto(run, model, data, samples, frozen, pre, shapes, patterns, options, search,
                                        may_fit)  # fmt: skip
        result, patterns, refinement = auto_run.result, auto_run.patterns, auto_run.refinement()
        done.details += [auto_run.choice.summary(), auto_run.fit.summary()]
        done.report = steps.report_lines(auto_run.closing)
        if searched_on_report:
            target_cos = target_cos or DEFAULT_TARGET_COS
            held_out = auto_run.report_files
            if not held_out:
                done.notes.append(f"--target-cos {target_cos} not searched: it needs 10 or more samples to set a "
                                  "held-out part apart")  # fmt: skip
    else:
        result = run(data, limit=samples, ranges=frozen, range_only=range_only, keep_histograms=save_stats is not None)
        if auto and not range_only:
            done.notes.append("--tune, --refine and --split-channels start from KL thresholds (--method auto "
                              "measures plain tables only); give --method to start from another")  # fmt: skip
    done.result = result
    if samples is not None and result.samples < samples:
        done.notes.append(f"--samples {samples} but only {result.samples} found; used all")
    if result.skipped:  # tensors a converter created: no row in the table
        shown = ", ".join(result.skipped[:5]) + (", ..." if len(result.skipped) > 5 else "")
        done.notes.append(f"{len(result.skipped)} IR tensor(s) have no ONNX tensor to observe: {shown}")
    if save_stats is not None:
        write_stats(result.stats, save_stats)
    if output is not None and result.table is not None:
        if any(f.suffix.lower() in IMAGE_SUFFIXES for f in usable):  # how pictures became tensors, for later reads
            result.table.preprocess = pre.spec()
        write_table(result.table, output)
        constants = result.refinement.constants if result.refinement is not None else {}
        if constants or result.groupings:
            save_refinement(side_file(output), Refinement(constants, result.groupings))
            done.details.append(
                f"split {len(result.groupings)} channel runs, refined {len(constants)} constants: {side_file(output)}"
            )
        elif side_file(output).exists():  # a build would apply it to this table
            side_file(output).unlink()
            done.notes.append(f"removed {side_file(output)}, made for an earlier table")
        done.notes += steps.write_qtable_beside(model, result.table, output, shapes, patterns, held_out, pre,
                                                target_cos, max_float_layers or DEFAULT_MAX_FLOAT_LAYERS,
                                                explicit_target, refinement)  # fmt: skip
    if bmnet is not None and result.table is not None:
        from npuc.backends.bm1880.export_table import write_bmnet_table

        write_bmnet_table(model, result.table, shapes, bmnet)
    if depfile is not None:
        steps.write_calibration_depfile(Path(depfile), model, data, samples, ranges, [output, save_stats, bmnet])
    rate = result.samples / max(result.seconds, 1e-9)
    done.details.append(
        f"calibrated {len(result.stats.tensors)} tensors on {result.samples} samples "
        f"({result.table.method if result.table is not None and auto else options.method_label()}, "
        f"{rate:.1f} samples/s)"
    )
    return done


def merge_calibration(
    stats: Sequence[str | Path],
    output: str | Path | None = None,
    *,
    save_stats: str | Path | None = None,
    method: str = "kl",
    percentile: float = 99.99,
) -> Any:
    """`npuc calibrate merge`: shards' statistics into one table (the single run's) and/or one statistics file.
    Returns the table (None when only statistics are written)."""
    from npuc.passes.calibration.calibrate import CalibrationOptions, merge_stats_files, stats_to_table
    from npuc.passes.calibration.calitable import write_table
    from npuc.passes.calibration.histogram import save_stats as write_stats

    output, save_stats = (Path(p) if p is not None else None for p in (output, save_stats))
    if output is None and save_stats is None:
        raise UserError("nothing to write; give -o TABLE and/or --save-stats FILE")
    _check_folders((output, "-o"), (save_stats, "--save-stats"))
    merged = merge_stats_files(stats)
    if save_stats is not None:
        write_stats(merged, save_stats)
    if output is None:
        return None
    table = stats_to_table(merged, CalibrationOptions(method=method, percentile=percentile, bins=merged.bins))
    write_table(table, output)
    return table


def _check_folders(*outputs: tuple[Path | None, str]) -> None:
    """Fail before hours of calibration rather than after, when an output cannot be written."""
    for path, flag in outputs:
        if path is not None and not path.resolve().parent.is_dir():
            raise UserError(f"{flag} {path}: folder {path.parent} does not exist; create it or choose another path")


# ---- helpers -----------------------------------------------------------------------------------------------


def _shape_specs(shapes: InputShapes) -> list[str]:
    if shapes is None:
        return []
    if isinstance(shapes, Mapping):
        return [f"{name}:{','.join(str(int(d)) for d in dims)}" for name, dims in shapes.items()]
    return list(shapes)


def _as_shape_dict(shapes: InputShapes) -> dict[str, tuple[int, ...]]:
    from npuc.frontends.onnx import parse_input_shapes

    return parse_input_shapes(_shape_specs(shapes))


def _shape_sets(specs: list[str]) -> list[dict[str, tuple[int, ...]]]:
    """Repeated shapes for the same input start a new set (one per resolution)."""
    from npuc.frontends.onnx import parse_input_shapes

    sets: list[dict[str, tuple[int, ...]]] = []
    for spec in specs:
        ((name, shape),) = parse_input_shapes([spec]).items()
        if not sets or name in sets[-1]:
            sets.append({})
        sets[-1][name] = shape
    return sets


def _import(model: Path, weights: str | Path | None, shapes: dict | None, options: dict, notes: list[str]) -> Any:
    if model.suffix.lower() == ".prototxt":
        from npuc.frontends.caffe import import_caffe

        if weights is not None:  # the frontend's input; bm1880 also records where the weights came from
            options["weights"] = str(weights)
        return import_caffe(model, Path(weights) if weights is not None else None, shapes, notes)
    if weights is not None:
        raise UserError("--weights is for a Caffe .prototxt MODEL; an ONNX model carries its own weights")
    from npuc.frontends.onnx import import_onnx

    return import_onnx(model, shapes, notes)


def _qtable_layers(graph: Any, target: Any, calib: Path | None, qtable: str | Path | None, options: dict,
                   notes: list[str]) -> list[str]:  # fmt: skip
    """The BF16 layers of the qtable (given, or beside the table), added to options["float_layers"]."""
    from npuc.passes.calibration.qtable import beside, read_qtable

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
    modes = read_qtable(path)
    known = {op.name for op in graph.ops} | set(graph.tensors)
    unknown = [n for n in modes if n not in known]
    if unknown:
        raise UserError(
            f"{path}: layer '{unknown[0]}' ({len(unknown)} of {len(modes)}) matches no op or tensor of the model; "
            "was it made for another model? Rerun `npuc calibrate --target-cos` for this one"
        )
    other = sorted({m for m in modes.values() if m not in ("BF16", "INT8")})
    if other:
        raise UserError(f"{path}: mode {other[0]} has no {target.name} form; keep layers in BF16 or INT8")
    layers = [n for n, m in modes.items() if m == "BF16"]
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
