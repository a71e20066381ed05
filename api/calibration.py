"""`npuc calibrate` and `npuc calibrate merge` as functions: the table and every file written beside it (side
file, qtable, BMNet's table, statistics, depfile), and what to tell the user."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuc.api.shapes import InputShapes, as_shape_dict
from npuc.compiler.errors import UserError


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
    histogram: str = "global",
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
    (passes/calibration/fit_choice.py). `histogram`: "global" (default: one histogram range per tensor, the
    table independent of the sample order) or "tpu-mlir" (its sample-by-sample histogram, folders read in
    its order: the same samples give tpu-mlir's own table)."""
    from npuc.compiler.defaults import DEFAULT_BUDGET, DEFAULT_TARGET_COS
    from npuc.passes.calibration import calibrate as calib
    from npuc.passes.calibration import calibration_run as steps
    from npuc.passes.calibration.calitable import write_table
    from npuc.passes.calibration.compare import DEFAULT_MAX_FLOAT_LAYERS
    from npuc.passes.calibration.histogram import DEFAULT_BINS
    from npuc.passes.calibration.preprocess import IMAGE_SUFFIXES, Preprocess, list_samples, screen_samples
    from npuc.passes.calibration.refinement import Refinement, save_refinement, side_file
    from npuc.passes.calibration.stats_file import load_stats
    from npuc.passes.calibration.stats_file import save_stats as write_stats

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
        refine=refine, refine_samples=refine_samples, split_channels=split_channels, histogram=histogram,
    )  # fmt: skip
    if options.histogram == "tpu-mlir":  # its histogram follows the sample order: read folders in tpu-mlir's
        data, samples = list_samples(data, samples, folder_order="tpu-mlir"), None
    pre = preprocess or Preprocess()
    shapes = as_shape_dict(input_shapes)
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
    auto_run = None
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
        if auto_run.copies_note:
            done.notes.append(auto_run.copies_note)
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
    if split_channels > 1 and fitted and not range_only and result.table is not None and not result.groupings:
        done.notes.append(steps.unsplit_note(model, shapes, split_channels))
    if samples is not None and result.samples < samples:
        done.notes.append(f"--samples {samples} but only {result.samples} found; used all")
    if result.skipped:  # tensors a converter created: no row in the table
        shown = ", ".join(result.skipped[:5]) + (", ..." if len(result.skipped) > 5 else "")
        done.notes.append(f"{len(result.skipped)} IR tensor(s) have no ONNX tensor to observe: {shown}")
    if save_stats is not None:
        write_stats(result.stats, save_stats)
    bf16_layers = list(dict.fromkeys(n for found in patterns.values() for n in found))  # what the build keeps
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
        calibrated = [f for f in usable if f not in held_out]  # held_out: a handful of paths
        lines, bf16_layers = steps.write_qtable_beside(model, result.table, output, shapes, patterns, held_out, pre,
                                                       target_cos, max_float_layers or DEFAULT_MAX_FLOAT_LAYERS,
                                                       explicit_target, refinement, calibrated)  # fmt: skip
        done.notes += lines
    if auto_run is not None:  # the closing report runs the table as the build will: side file, qtable
        done.report = steps.report_lines(steps.closing_report(model, result.table, auto_run.report_files, pre, shapes,
                                                              refinement, bf16_layers))  # fmt: skip
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
    from npuc.passes.calibration.stats_file import save_stats as write_stats

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
