"""`npuc calibrate`'s default threshold method: the one whose table gives the network's best output.

Chosen by cross-validation over the calibration samples' folds (calibration_run.SampleSplit): each fold's
samples judge every method's table made from the statistics of the other folds (the histograms merge exactly, so
a fold's tables cost merges, not runs) — measured the way the build will use them, the cv18xx int8 scheme
simulated by npuc's quantized reference with the layers the float patterns keep in bf16 kept, against
onnxruntime — and the best worst-output cosine pooled over every fold's samples wins (within METHOD_TIE of
it, the first of TIE_ORDER). Pooled, samples with large outputs weigh most: a text
detector's map of a photo without text is ~0 everywhere and cannot decide alone, as one set-apart sample did
(PP-OCRv6 det calibrated on one scan and five photos, judged on another scan: 0.9736 mean cosine when such a
photo chose `max`; 0.9853 with the folds, a tie of mse and percentile; tpu-mlir 1.30.2's default 0.9790).

Then per tensor: starting from the winner, the tensors that lose the most cosine against their own inputs
are tried first with every other method's threshold, and a change is kept when the worst output cosine on the
same samples improves. When the budget covers that sweep twice over (a small model: MTCNN O-Net), the search
refines: where another method's value is rejected but lies MIDPOINT_RATIO or more away, their geometric midpoint
is tried too (with few samples the methods spread far apart on a wide tensor, and what unseen inputs want often
lies between: O-Net's box FC input, 25 samples, percentile 1.84, KL 0.80, held-out faces best near 1.1-1.2), and
as it compares many candidates on few samples, a change must gain MIN_GAIN to be kept. The number of trials
comes from `budget` seconds through a fixed cost model of the quantized reference (flops and ops per sample),
so the same inputs give the same table on any machine.
Measured on YOLOv8n (7 photos): KL 0.9989 output cosine with its face box at IoU 0.78, max / percentile / MSE
0.9995-0.9998 with every box at IoU >= 0.9. PP-LCNet (20 calibration photos, 35 others): KL alone 0.9725 with
top-1 agreement 0.66; with 90 per-tensor trials 0.9791 and 0.94. passes/calibration/fit_choice.py then decides whether
fitting the samples (split, tune, refit) beats the resulting table.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from npuc.compiler.defaults import DEFAULT_BUDGET
from npuc.compiler.ir import Graph
from npuc.compiler.stats import op_flops
from npuc.frontends.onnx import InputShapes
from npuc.passes.calibration.calibrate import CalibrationOptions, stats_to_table, tensor_table_names
from npuc.passes.calibration.calitable import CalibrationTable
from npuc.passes.calibration.compare import Agreement, CompareReport, Comparison
from npuc.passes.calibration.histogram import CalibrationStats
from npuc.passes.quantization.quantize import thresholds_for_graph

AUTO_METHODS = ("kl", "mse", "percentile", "max")
AUTO_SAMPLES = 8  # calibration samples each candidate table is measured on
# Methods whose pooled cosines lie within METHOD_TIE of the best are a tie, which goes to the first of TIE_ORDER:
# percentile clips the rare extremes KL keeps and max keeps them all, and on the pictures the folds do not
# represent it measured best or near-best (PP-LCNet on 8 mirrored pages, judged on 20 pictures: percentile top-1
# 20/20, KL 17/20; PP-OCRv6 det calibrated on text only: max, 0.001 ahead, marked text in a photo without any).
METHOD_TIE = 2e-3
TIE_ORDER = ("percentile", "kl", "mse", "max")
MIDPOINT = "mid-"  # the per-tensor candidate geometrically halfway from the start method's threshold to another's
MIDPOINT_RATIO = 1.5  # ... tried only after that other value was rejected and lies at least this factor away
# A refining search keeps a change that raises the objective by MIN_GAIN or more (O-Net's box output on 84 faces
# no calibration saw: 0.99835 / worst 0.9881 keeping any gain, 0.99849 / 0.9936 with this; tpu-mlir 1.30.2's
# file 0.9984 / 0.9915).
MIN_GAIN = 2e-4
ANY_GAIN = 1e-6  # the least gain a change needs without refining (above float noise)
# The quantized reference's speed on a 2-core x86 machine (O-Net and PP-LCNet fit it within 10%): it turns a
# budget into a fixed number of trials, so the result does not depend on the machine's load.
REFERENCE_FLOPS_PER_SECOND = 3.8e9
REFERENCE_SECONDS_PER_OP = 2.5e-4


@dataclass
class MethodChoice:
    method: str
    scores: dict[str, float]  # method -> worst output cosine
    per_tensor: dict[str, str] = field(default_factory=dict)  # IR tensor -> method, where not `method`
    tensor_score: float | None = None  # worst output cosine with the per-tensor choices
    trials: int = 0
    judged_on: str = "held-out"  # or "calibration": the samples the tables were made from

    def summary(self) -> str:
        scores = ", ".join(f"{m} {s:.5f}" for m, s in self.scores.items())
        line = f"threshold method {self.method}: {self.judged_on} output (softmax: logits) cosine per method {scores}"
        if self.trials:
            counts = Counter(self.per_tensor.values())
            changed = ", ".join(f"{n} {m}" for m, n in sorted(counts.items())) or "none"
            line += f"; per tensor ({self.trials} trials): {changed} -> {self.tensor_score:.5f}"
        return line


def reference_seconds(graph: Graph) -> float:
    """The cost model's seconds for one run of the quantized reference on one sample."""
    flops = sum(op_flops(graph, op) for op in graph.ops)
    return flops / REFERENCE_FLOPS_PER_SECOND + len(graph.ops) * REFERENCE_SECONDS_PER_OP


def search_trials(graph: Graph, samples: int, budget: float) -> int:
    """How many per-tensor trials fit in `budget` seconds (each runs the quantized graph on `samples`)."""
    per_trial = samples * reference_seconds(graph)
    return int(budget / per_trial) if per_trial > 0 else 0


def objective(report: CompareReport) -> float:
    """What a per-tensor change must raise: over the judged tensors (each output, or its logits where it is a
    softmax), the worst mean per-sample cosine plus the worst pooled cosine (the first keeps every sample's
    output in view, the second the large ones)."""
    judged = report.judged or report.outputs
    return min(float(np.mean(a.sample_cosines)) for a in judged) + min(a.cosine for a in judged)


def choose_per_tensor(
    comparison: Comparison,
    candidates: dict[str, dict[str, float]],
    start: str,
    float_layers: Sequence[str],
    trials: int,
) -> tuple[dict[str, str], float, int]:
    """Greedy per-tensor method choice from the `start` method's thresholds (`comparison.thresholds` holds
    them); `candidates`: method -> IR tensor -> threshold. Returns (tensor -> method where changed, worst
    output cosine with them, trials used)."""
    current = dict(candidates[start])
    report = comparison.evaluate(float_layers)
    best, cosine = objective(report), report.output_cosine
    loss = comparison.local_loss(report)
    order = sorted((n for n in current if n in loss), key=lambda n: (-loss[n], n))
    chosen: dict[str, str] = {}
    used = 0
    endpoints = sum(_differs(candidates[m].get(n), current[n]) for n in order for m in AUTO_METHODS if m != start)
    refine = trials >= 2 * endpoints  # every method's value and as many midpoints fit (module docstring)
    gain = MIN_GAIN if refine else ANY_GAIN

    def trial(name: str, label: str, threshold: float) -> bool:
        nonlocal used, best, cosine
        used += 1
        comparison.thresholds.thresholds = {**current, name: threshold}
        found = comparison.evaluate(float_layers, per_layer=False)
        if objective(found) <= best + gain:
            return False
        best, cosine = objective(found), found.output_cosine
        current[name], chosen[name] = threshold, label
        return True

    for name in order:
        for method in AUTO_METHODS:
            value = candidates[method].get(name)
            if method == chosen.get(name, start) or not _differs(value, current[name]):
                continue
            if used >= trials:
                comparison.thresholds.thresholds = dict(current)
                return chosen, cosine, used
            if trial(name, method, value) or name in chosen or not refine:
                continue
            mid = candidates.get(MIDPOINT + method, {}).get(name)
            far = value > 0 and max(value, current[name]) / min(value, current[name]) >= MIDPOINT_RATIO
            if mid is not None and far and used < trials:
                trial(name, MIDPOINT + method, mid)
    comparison.thresholds.thresholds = dict(current)
    return chosen, cosine, used


def _differs(value: float | None, current: float) -> bool:
    return value is not None and not np.isclose(value, current, rtol=1e-6)


def evaluation_picks(count: int, most: int = AUTO_SAMPLES) -> list[int]:
    """Up to `most` sample indices spread over `count` samples."""
    if count <= most:
        return list(range(count))
    if most == 1:
        return [count // 2]
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})


@dataclass
class Fold:
    """One round of the method choice: the statistics of every sample but this fold's, and which of the
    comparison's samples (this fold's) judge the tables made from them."""

    stats: CalibrationStats
    judges: list[int]


def choose_method(
    model: Path,
    folds: Sequence[Fold],
    feeds: Sequence[dict[str, np.ndarray]],
    options: CalibrationOptions,
    input_shapes: InputShapes | None,
    float_layers: Sequence[str] = (),
) -> MethodChoice:
    """The whole-table method with the best worst-output cosine, cross-validated: each fold's tables (one per
    method, from the statistics of the other folds) run on that fold's samples of `feeds`, and a method's
    cosine pools every fold's samples (the samples with large outputs weigh most: a detector's map of a
    picture without text, ~0 everywhere, cannot decide alone)."""
    tables = {m: stats_to_table(folds[0].stats, replace(options, method=m)) for m in AUTO_METHODS}
    with warnings.catch_warnings():  # rows without a tensor are the build's to report
        warnings.simplefilter("ignore")
        comparison = Comparison(model, tables["kl"], list(feeds), "cv18xx_int8", input_shapes)
    names = tensor_table_names(onnx.load(str(model), load_external_data=False))
    reports: dict[str, list[CompareReport]] = {m: [] for m in AUTO_METHODS}
    for i, fold in enumerate(folds):
        for method in AUTO_METHODS:
            table = tables[method] if i == 0 else stats_to_table(fold.stats, replace(options, method=method))
            comparison.thresholds = thresholds_for_graph(comparison.graph, table, warn=False, table_names=names)
            reports[method].append(comparison.evaluate(float_layers, per_layer=False, samples=fold.judges))
    outputs = range(len(comparison.graph.outputs))
    scores = {
        method: min(Agreement.pooled_cosine(r.judged[k] for r in found) for k in outputs)
        for method, found in reports.items()
    }
    top = max(scores.values())
    tied = [m for m in AUTO_METHODS if scores[m] >= top - METHOD_TIE]
    best = min(tied, key=TIE_ORDER.index)
    return MethodChoice(best, scores)


def choose_tensor_methods(
    model: Path,
    tables: dict[str, CalibrationTable],
    choice: MethodChoice,
    feeds: Sequence[dict[str, np.ndarray]],
    input_shapes: InputShapes | None,
    float_layers: Sequence[str] = (),
    budget: float = DEFAULT_BUDGET,
) -> CalibrationTable:
    """`choice.method`'s table from `tables` (method -> table) with the per-tensor choices applied, measured on
    `feeds`; `choice` records them."""
    tables = {**tables, **midpoint_tables(tables, choice.method)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        comparison = Comparison(model, tables[choice.method], list(feeds), "cv18xx_int8", input_shapes)
    names = tensor_table_names(onnx.load(str(model), load_external_data=False))
    maps = {m: thresholds_for_graph(comparison.graph, t, warn=False, table_names=names) for m, t in tables.items()}
    trials = search_trials(comparison.graph, len(comparison.feeds), budget)
    if trials <= 0:
        return tables[choice.method]
    comparison.thresholds = replace(maps[choice.method], thresholds=dict(maps[choice.method].thresholds))
    candidates = {m: found.thresholds for m, found in maps.items()}
    per_tensor, score, used = choose_per_tensor(comparison, candidates, choice.method, float_layers, trials)
    choice.per_tensor, choice.tensor_score, choice.trials = per_tensor, score, used
    return apply_per_tensor(tables, choice.method, per_tensor, table_rows(comparison.graph, tables[choice.method],
                                                                             names))  # fmt: skip


def midpoint_tables(tables: dict[str, CalibrationTable], start: str) -> dict[str, CalibrationTable]:
    """MIDPOINT + method -> `start`'s table with each threshold the geometric mean of `start`'s and `method`'s
    (a row the other table lacks, or a threshold <= 0, keeps `start`'s)."""
    base = tables[start]
    found = {}
    for method in AUTO_METHODS:
        if method == start or method not in tables:
            continue
        entries = dict(base.entries)
        for row, entry in base.entries.items():
            theirs = tables[method].entries.get(row)
            if theirs is not None and entry.threshold > 0 and theirs.threshold > 0:
                entries[row] = replace(entry, threshold=float(np.sqrt(entry.threshold * theirs.threshold)))
        found[MIDPOINT + method] = replace(base, entries=entries)
    return found


def table_rows(graph: Graph, table: CalibrationTable, names: dict[str, str]) -> dict[str, str]:
    """IR tensor -> the row of `table` its threshold comes from (as thresholds_for_graph matches them)."""
    rows = list(table.entries)
    probe = replace(
        table, entries={r: replace(e, threshold=float(i + 1)) for i, (r, e) in enumerate(table.entries.items())}
    )
    found = thresholds_for_graph(graph, probe, warn=False, table_names=names).thresholds
    return {tensor: rows[int(value) - 1] for tensor, value in found.items()}


def apply_per_tensor(
    tables: dict[str, CalibrationTable], start: str, per_tensor: dict[str, str], rows: dict[str, str]
) -> CalibrationTable:
    """The `start` method's table with each chosen tensor's row taken from its method's table."""
    table = replace(tables[start], entries=dict(tables[start].entries))
    for tensor, method in per_tensor.items():
        row = rows.get(tensor)
        if row is not None and row in tables[method].entries:
            table.entries[row] = tables[method].entries[row]
    return table
