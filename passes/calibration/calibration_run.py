"""What `npuc calibrate` does around the statistics pass (api/calibration.py calls these): the `--method auto`
flow (its sample split, the method and per-tensor choices, the closing report), the qtable written beside the
table (float patterns and --target-cos) and the depfile. BMNet's table: backends/bm1880/export_table.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METHOD_FOLDS = 5  # the method choice's cross-validation folds (SampleSplit)
WIDE_SAMPLES = 32  # calibration samples that join the held-out ones to judge the mixed-precision choices


def pattern_layers_of(model: Path, shapes: dict, enabled: bool) -> dict[str, list[str]]:
    """Pattern name -> the op names it keeps in float, on the canonical IR (none when `enabled` is false)."""
    if not enabled:
        return {}
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.calibration.float_patterns import pattern_layers
    from npuc.passes.rewrite.canonicalize import canonicalize

    graph = import_onnx(model, shapes or None, [])
    canonicalize(graph)
    return pattern_layers(graph)


@dataclass
class AutoCalibration:
    """What `--method auto` made: the run's result (table, and the refit and split when the fitted candidate
    won), the choices, the report samples, the pattern layers still in the graph."""

    result: Any
    choice: Any
    fit: Any
    report_files: list[Path]
    patterns: dict[str, list[str]]
    copies_note: str = ""  # report samples that are near copies of table samples (near_copies.py), said aloud

    def refinement(self) -> Any:
        """The side file's content when the fitted candidate was kept, else None."""
        return self.fit.refinement() if self.fit is not None else None


def check_batchable(model: Path, shapes: dict, options: Any) -> None:
    """--refine / --split-channels run their samples as one batch: refused before any pass when the model's
    tensors are not all sample-first (a sequence-first RNN), unless one sample at a time was asked for."""
    from npuc.compiler.errors import UserError
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.quantization.qsim import batch_first
    from npuc.passes.rewrite.canonicalize import canonicalize

    if not (options.refine or options.split_channels > 1) or options.refine_samples == 1:
        return
    graph = import_onnx(model, shapes or None, [])
    canonicalize(graph)
    if not batch_first(graph):
        raise UserError(f"--refine / --split-channels fit {options.refine_samples} samples as one batch, but not "
                        "every tensor of this model has the sample axis first (a sequence-first RNN, packed attention "
                        "heads); add --refine-samples 1")  # fmt: skip


def unsplit_note(model: Path, shapes: dict, k: int) -> str:
    """What `--split-channels K` tells the user when it split nothing: the runs it found (whose channels fell
    into one group) or the first reasons it took none."""
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.calibration.channel_split import find_runs
    from npuc.passes.rewrite.canonicalize import canonicalize

    graph = import_onnx(model, shapes or None, [])
    canonicalize(graph)
    plan = find_runs(graph)
    if plan.runs:
        why = f"the channel peaks of its {len(plan.runs)} run(s) fell into one group each"
    elif plan.skipped:
        shown = "; ".join(f"{conv}: {reason}" for conv, reason in plan.skipped[:3])
        why = f"no conv starts a channel run ({shown}{'; ...' if len(plan.skipped) > 3 else ''})"
    else:
        why = "the model has no conv that mixes channels"
    return f"--split-channels {k} split nothing: {why}; the table is the unsplit one"


@dataclass
class SampleSplit:
    """How `--method auto` uses its samples (see calibrate_auto)."""

    report: list  # set apart for the closing report and --target-cos
    used: list  # the table's
    folds: list[list]  # the method choice's cross-validation folds of `used`
    fit: list  # what the fitted candidate fits
    judges: list  # what judges it

    @classmethod
    def of(cls, files: list) -> SampleSplit:
        from npuc.passes.calibration.fit_choice import FIT_MIN_SAMPLES

        report = files[2::5] if len(files) >= 10 else []
        used = [f for f in files if f not in report]
        folds = [used[i::METHOD_FOLDS] for i in range(min(METHOD_FOLDS, len(used)))]
        # the fitted candidate is judged on the last two folds when the others leave enough to fit, else on the last
        last = 2 if len(folds) > 2 and len(used) - sum(map(len, folds[-2:])) >= FIT_MIN_SAMPLES else 1
        judges = [f for fold in folds[-last:] for f in fold] if len(folds) > 1 else used  # one: what it fits
        return cls(report, used, folds, [f for f in used if f not in judges] or used, judges)

    def may_fit(self) -> bool:
        from npuc.passes.calibration.fit_choice import FIT_MIN_JUDGES, FIT_MIN_SAMPLES

        return len(self.folds) > 1 and len(self.judges) >= FIT_MIN_JUDGES and len(self.fit) >= FIT_MIN_SAMPLES


def samples_to_fit() -> int:
    """The fewest samples with which --method auto tries the fitted candidate."""
    return next(n for n in range(1, 1000) if SampleSplit.of(list(range(n))).may_fit())


def calibrate_auto(run: Any, model: Path, data: Any, limit: int | None, frozen: Any, pre: Any, shapes: dict,
                    patterns: dict[str, list[str]], options: Any, budget: float,
                    may_fit: str = "") -> AutoCalibration:  # fmt: skip
    """`--method auto` (passes/calibration/method_choice.py, passes/calibration/fit_choice.py). With 10 or more samples
    every fifth from the third on is set apart for the closing report and stays out of the table. The rest fall
    into METHOD_FOLDS folds (every fifth sample); the method is chosen by cross-validation over them (each fold
    judges the tables of the others), then the per-tensor search runs on the chosen method's table over all of
    them (scored on up to 8 of them, spread). The table is made from all but the report samples. Then the fitted
    candidate (split, tune, refit) is fitted on the samples of all folds but the last one or two and judged on
    theirs (SampleSplit); `may_fit` non-empty: why it may not be tried (the summary says so)."""
    from dataclasses import replace
    from functools import reduce

    from npuc.passes.calibration.calibrate import plan_calibration, stats_to_table
    from npuc.passes.calibration.fit_choice import FIT_OPTIONS, FitChoice, choose_fitted
    from npuc.passes.calibration.method_choice import (
        AUTO_METHODS,
        AUTO_SAMPLES,
        Fold,
        choose_method,
        choose_tensor_methods,
        evaluation_picks,
    )
    from npuc.passes.calibration.near_copies import copies_note
    from npuc.passes.calibration.preprocess import list_samples, load_sample

    files = list_samples(data, limit)
    split = SampleSplit.of(files)
    report, used, folds, fit, choose = split.report, split.used, split.folds, split.fit, split.judges
    start = time.perf_counter()
    if frozen is None and options.histogram == "global":  # one pass per fold, histograms at the merged geometry
        runs = [run(fold, range_only=True, keep_grid=True) for fold in folds]
        ranges = reduce(lambda a, b: a.merge(b), (r.stats for r in runs))
        runs = [replace(r, stats=r.stats.histograms(ranges)) for r in runs]
    else:
        ranges = frozen if frozen is not None else run(used, range_only=True).stats
        runs = [run(fold, ranges=ranges, keep_histograms=True) for fold in folds]
    stats = reduce(lambda a, b: a.merge(b), (r.stats for r in runs))
    plan = plan_calibration(model, shapes or None)
    layers = list(dict.fromkeys(n for found in patterns.values() for n in found))
    # each fold's spread picks judge the tables made without it (its own, when there is one fold)
    per_fold = -(-AUTO_SAMPLES // len(folds))
    judges = [[fold[i] for i in evaluation_picks(len(fold), per_fold)] for fold in folds]
    judge_feeds = [load_sample(f, plan.inputs, pre) for found in judges for f in found]
    rounds, place = [], 0
    for i, found in enumerate(judges):
        rest = [r.stats for j, r in enumerate(runs) if j != i] or [stats]
        rounds.append(Fold(reduce(lambda a, b: a.merge(b), rest), list(range(place, place + len(found)))))
        place += len(found)
    choice = choose_method(model, rounds, judge_feeds, options, shapes or None, layers)
    if len(folds) == 1:
        choice.judged_on = "calibration"
    fitted = runs[0]
    feeds = [load_sample(choose[i], plan.inputs, pre) for i in evaluation_picks(len(choose))]
    tables = {m: stats_to_table(stats, replace(options, method=m)) for m in AUTO_METHODS}
    spread = [load_sample(used[i], plan.inputs, pre) for i in evaluation_picks(len(used))]
    table = choose_tensor_methods(model, tables, choice, spread, shapes or None, layers, budget)
    others = f", {len(choice.per_tensor)} tensors by other methods" if choice.per_tensor else ""
    table.method = f"auto ({choice.method}{others})"
    if not may_fit and not split.may_fit():
        may_fit = f"it is judged on samples it does not fit: give {samples_to_fit()} or more samples"
    if may_fit:
        fitting = FitChoice(0.0, 0, 0, may_fit)
    else:
        fit_feeds = [load_sample(f, plan.inputs, pre) for f in fit[: FIT_OPTIONS.refine_samples]]
        fitting = choose_fitted(model, plan, table, fit_feeds, feeds, shapes or None, layers, budget)
    if fitting.kept:
        table = fitting.table
        table.method = f"auto ({choice.method}{others}, {fitting.header()})"
        patterns = {name: [n for n in found if n in fitting.known] for name, found in patterns.items()}
        layers = list(dict.fromkeys(n for found in patterns.values() for n in found))
        fitted = replace(fitted, refinement=fitting.refit, groupings=fitting.groupings)
    result = replace(fitted, stats=stats, table=table, samples=len(used), seconds=time.perf_counter() - start)
    note = copies_note(report, used, lambda f: load_sample(f, plan.inputs, pre)) if report else ""
    return AutoCalibration(result, choice, fitting, report, patterns, note)


def closing_report(model: Path, table: Any, report_files: list[Path], pre: Any, shapes: dict, refinement: Any,
                   float_layers: list[str]) -> Any:  # fmt: skip
    """The closing accuracy report on up to 8 of the samples set apart (spread), as the build runs the table:
    with its side file and the qtable's bf16 layers (None without report samples)."""
    if not report_files:
        return None
    import warnings

    from npuc.passes.calibration.calibrate import plan_calibration
    from npuc.passes.calibration.compare import Comparison
    from npuc.passes.calibration.method_choice import evaluation_picks
    from npuc.passes.calibration.preprocess import load_sample

    inputs = plan_calibration(model, shapes or None).inputs
    held = [load_sample(report_files[i], inputs, pre) for i in evaluation_picks(len(report_files))]
    with warnings.catch_warnings():  # rows without a tensor are the build's to report
        warnings.simplefilter("ignore")
        comparison = Comparison(model, table, held, "cv18xx_int8", shapes or None, refinement=refinement)
        return comparison.evaluate(float_layers)


def report_lines(report: Any, worst: int = 3) -> list[str]:
    """The closing accuracy report: per output on samples no threshold saw, then the worst layers."""
    from npuc.passes.calibration.compare import CONFIDENT

    if report is None:
        return ["held-out report: fewer than 10 samples, none set apart (give more samples to measure)"]
    lines, bf16 = [], f", {len(report.float_layers)} layer(s) in bf16" if report.float_layers else ""
    for out in report.outputs:
        top1 = f", top-1 agreement {out.top1_agreement:.3f}" if out.top1_agreement is not None else ""
        if out.confident_top1 is not None:
            n = out.confident_positions
            top1 += f" ({out.confident_top1:.3f} where float is >= {CONFIDENT:g} sure: {n} position(s))"
        elif out.top1_agreement is not None:
            top1 += f" (float is >= {CONFIDENT:g} sure of none)"
        lines.append(f"held-out ({report.samples} samples{bf16}) output {out.name}: cosine {out.cosine:.5f}, "
                     f"SQNR {out.sqnr_db:.1f} dB{top1}")  # fmt: skip
    shown = ", ".join(f"{a.name} {a.cosine:.4f}" for a in report.layers[:worst])
    return lines + [f"held-out worst layers: {shown}"]


def write_qtable_beside(model: Path, table: Any, output: Path, shapes: dict, found: dict[str, list[str]],
                  held_out: list[Path], pre: Any, target: float | None, max_layers: int,
                  explicit: bool = True, refinement: Any = None,
                  calibrated: Sequence[Path] = ()) -> tuple[list[str], list[str]]:  # fmt: skip
    """`<output>.qtable`: the layers the float patterns keep, plus those `target_cos` finds (written even when
    none when the target was asked for, `explicit`); a stale one from an earlier table is removed. Returns
    the lines to say (the qtable decides what `npuc build --calib` does) and the layers it keeps in bf16. Up
    to WIDE_SAMPLES of the `calibrated` samples join the held-out ones to judge the averaging layers and
    the greedy's picks (compare.auto_mixed)."""
    from npuc.passes.calibration.qtable import beside, write_qtable

    base = list(dict.fromkeys(n for layers in found.values() for n in layers))
    lines = [f"the {name} pattern keeps {len(layers)} layer(s) in float" for name, layers in found.items()]
    comments = [f"npuc calibrate: {line}" for line in lines]
    chosen: list[str] = []
    if held_out:
        from npuc.passes.calibration.calibrate import plan_calibration
        from npuc.passes.calibration.compare import held_out_search
        from npuc.passes.calibration.method_choice import evaluation_picks
        from npuc.passes.calibration.preprocess import load_sample

        inputs = plan_calibration(model, shapes or None).inputs
        feeds = [load_sample(p, inputs, pre) for p in held_out]

        def wide() -> list[dict]:  # loaded only when int8 misses the target on the held-out part
            return [load_sample(calibrated[i], inputs, pre) for i in evaluation_picks(len(calibrated), WIDE_SAMPLES)]

        mixed = held_out_search(model, table, feeds, target, max_layers, shapes or None, base, refinement, wide)
        chosen = mixed.float_layers
        kept = "the qtable holds the best layers found" if base or chosen or explicit else "no qtable written"
        verdict = "" if mixed.reached else f"NOT reached, {kept}: "
        shown = ", ".join(chosen[:6]) + (", ..." if len(chosen) > 6 else "")
        comments.append(f"npuc calibrate --target-cos {target} on {len(feeds)} held-out sample(s): {mixed.reason}")
        comments.append(f"int8 output cosine on them {mixed.int8_cosine:.6f}")
        lines.append(f"--target-cos {target} on {len(feeds)} held-out sample(s): {verdict}int8 output cosine "
                     f"{mixed.int8_cosine:.6f}; {mixed.reason}{f' ({shown})' if shown else ''}")  # fmt: skip
        if not mixed.reached and mixed.all_float_cosine is not None and mixed.all_float_cosine >= target:
            every = len(mixed.report.int8_layers) + len(chosen)  # the int8 layers the search could keep in float
            lines.append(wider_search_hint(model, output, shapes, target, every))
    path = beside(output)
    if base or chosen or (held_out and explicit):
        write_qtable(path, [*base, *chosen], "BF16", comments)
        share = int8_share(model, shapes, [*base, *chosen], refinement)
        lines.append(f"wrote {path}: {len(base) + len(chosen)} layer(s) in bf16, {share:.1%} of the operations int8")
    elif path.exists():
        path.unlink()
        lines.append(f"removed {path}, made for an earlier table")
    return lines, [*base, *chosen]


def wider_search_hint(model: Path, table: Path, shapes: dict, target: float, layers: int) -> str:
    """What reaches a --target-cos the bounded search missed (all `layers` int8 layers in float reach it): every
    int8 layer ranked by what it costs alone, the shortest reaching prefix kept (passes/calibration/sensitivity.py),
    a log2(layers) search."""
    from npuc.passes.calibration.qtable import beside

    pinned = "".join(f" --input-shape {name}:{','.join(map(str, dims))}" for name, dims in (shapes or {}).items())
    return (f"for more bf16 layers in the order each costs alone in int8 (about half a run per layer and picture): "
            f"npuc compare {model} --calib {table} --data PICTURES{pinned} --sensitivity --auto-mixed {target} "
            f"--max-float-layers {layers} --write-qtable {beside(table)}, PICTURES a few the "
            "table never saw")  # fmt: skip


def int8_share(model: Path, shapes: dict, layers: list[str], refinement: Any) -> float:
    """The share of the network's operations (MACs and element ops) left in int8 with `layers` in bf16."""
    from npuc.compiler.stats import int8_flops_share
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.calibration.refinement import apply_refinement
    from npuc.passes.rewrite.canonicalize import canonicalize

    graph = import_onnx(model, shapes or None, [])
    canonicalize(graph)
    if refinement is not None:
        graph = apply_refinement(graph, refinement)
    return int8_flops_share(graph, set(layers))


def write_calibration_depfile(path: Path, model: Path, data: Any, samples: int | None, ranges: Any,
                         outputs: list[Path | None]) -> None:  # fmt: skip
    from npuc.compiler.depfile import onnx_external_files, write_depfile
    from npuc.passes.calibration.preprocess import list_samples
    from npuc.passes.calibration.qtable import beside
    from npuc.passes.calibration.refinement import side_file

    written = [p for p in outputs if p is not None]
    if outputs[0] is not None:  # the table's companions, when this run wrote them
        written += [f for f in (beside(outputs[0]), side_file(outputs[0])) if f.is_file()]
    lists = [Path(d) for d in data if Path(d).is_file() and Path(d).suffix == ".txt"]
    read = [model, *onnx_external_files(model), *lists, *list_samples(data, samples), ranges]
    write_depfile(path, written, read)
