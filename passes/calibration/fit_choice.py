"""`npuc calibrate`'s default, second step: whether fitting the samples beats the plain table.

The plain table (passes/calibration/method_choice.py) only moves thresholds. The steps that fit the samples themselves —
channel groups with their own thresholds (passes/calibration/channel_split.py), tpu-mlir's tune step
(passes/calibration/tune.py), weights refitted to the quantized activations (passes/calibration/refine.py) — are what
lift mobile networks whose channels differ in range inside one tensor (PP-LCNet: 0.95 -> 0.99 mean output cosine on the
bench). They fit their samples closely, so they are judged on samples no fit saw: the plain table and each candidate of
FIT_CANDIDATES (the tune step alone, then split + tune + refit) are measured with the cv18xx int8 reference against
onnxruntime there, and a candidate is kept only when it raises the worst output's objective (mean per-sample
cosine + pooled cosine, as the per-tensor search uses) by FIT_MIN_GAIN and no output loses.

The fit's cost comes from a fixed cost model of the reference (FIT_REFERENCE_RUNS runs of the float and
quantized graphs per fitted sample), so the number of samples it fits on — and therefore the table — does not
depend on the machine's load; what does not fit in the budget is not tried, and the summary says so. A model too large
for those on FIT_MIN_SAMPLES samples gets LEAN_CANDIDATE instead, the channel split alone, priced at
LEAN_REFERENCE_RUNS.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from npuc.compiler.errors import UserError
from npuc.frontends.onnx import InputShapes
from npuc.passes.calibration.calibrate import CalibrationOptions, fit_to_samples
from npuc.passes.calibration.calitable import CalibrationTable
from npuc.passes.calibration.compare import Agreement, CompareReport, Comparison
from npuc.passes.calibration.method_choice import objective, reference_seconds
from npuc.passes.calibration.refine import RefineResult
from npuc.passes.calibration.refinement import Refinement
from npuc.passes.calibration.tap import CalibrationPlan
from npuc.passes.quantization.qsim import batch_first

FIT_OPTIONS = CalibrationOptions(method="kl", tune=5, refine="weights", split_channels=3)
# the candidates, cheapest on the device first: tpu-mlir's tune step alone moves thresholds only (no side file, no
# graph change); the full fit also splits channel runs and refits weights. A later candidate replaces an earlier
# winner only when it beats it by FIT_MIN_GAIN too. Measured on MTCNN O-Net calibrated on 30 LFW faces, 31 other
# faces: plain 0.9956 mean box cosine, full fit 0.9957 (worst 0.981), tune alone 0.9969 (worst 0.991).
FIT_CANDIDATES = (("tune", replace(FIT_OPTIONS, refine="", split_channels=0)), ("split/tune/refit", FIT_OPTIONS))
FIT_MIN_SAMPLES = 8  # fewer: a refit that memorises its samples; not tried
FIT_MIN_JUDGES = 2  # samples the fit never saw that judge it
# the objective gain (two cosines summed) a candidate must bring: a split costs the device ops and DDR traffic,
# so a gain within measuring noise keeps the plain table's graph (smallcnn: +4e-5, PP-LCNet: +0.011)
FIT_MIN_GAIN = 1e-3
# and no output may lose more than this (O-Net: the refit raised its box output and lowered its face probability)
FIT_TOLERANCE = 1e-4
# per fitted sample: the channel peaks, the split thresholds, the tune step's runs and the refit's float and
# quantized walks, in units of one quantized-reference run (measured on PP-LCNet and O-Net)
FIT_REFERENCE_RUNS = 12.0
# where the budget cannot fit those on FIT_MIN_SAMPLES samples (a large model), the split alone is tried: per sample
# a float run for the channel peaks and one of the split graph for its thresholds (PicoDet 800x608: 2.9 s a sample
# against 1.8 s estimated a run; its default, 18 calibration pictures, 0.911 -> 0.976 mean output cosine on ten
# unseen documents)
LEAN_CANDIDATE = ("split", replace(FIT_OPTIONS, refine="", tune=0))
LEAN_REFERENCE_RUNS = 2.0
CANDIDATE_NAMES = "; ".join(label for label, _ in FIT_CANDIDATES)


@dataclass
class FitChoice:
    """What the comparison found; `chosen` names the kept candidate (None: the plain table is written)."""

    plain_score: float  # worst output: mean per-sample + pooled cosine, on the judging samples
    fitted_samples: int
    judged_on: int
    reason: str  # why none was tried or kept
    scores: dict[str, float | None] = field(default_factory=dict)  # candidate -> objective (None: it stopped)
    chosen: str | None = None
    options: CalibrationOptions | None = None  # the chosen candidate's
    table: CalibrationTable | None = None
    refit: RefineResult | None = None
    groupings: dict[str, list[np.ndarray]] = field(default_factory=dict)
    known: frozenset[str] = frozenset()  # the fitted graph's op and tensor names (what a qtable may name)

    @property
    def kept(self) -> bool:
        return self.chosen is not None

    def refinement(self) -> Refinement | None:
        """What the side file carries when a candidate that changes constants or the graph is kept (else None)."""
        if not self.kept or (self.refit is None and not self.groupings):
            return None
        return Refinement(self.refit.constants if self.refit is not None else {}, self.groupings)

    def header(self) -> str:
        """The kept fit as the table header records it (after the method)."""
        parts = [f"split {len(self.groupings)} runs"] if self.groupings else []
        parts += [f"tune {self.options.tune}"] if self.options is not None and self.options.tune else []
        parts += [f"refit {self.fitted_samples}"] if self.refit is not None else []
        return ", ".join(parts)

    def summary(self) -> str:
        if not self.scores:
            return f"sample fits ({CANDIDATE_NAMES}) not tried: {self.reason}"
        scores = ", ".join(f"{k} {'stopped' if v is None else f'{v:.5f}'}" for k, v in self.scores.items())
        verdict = f"kept: {self.chosen}" if self.kept else f"none kept ({self.reason})"
        return (f"sample fits on {self.fitted_samples} samples, objective on {self.judged_on} samples they never "
                f"saw: plain {self.plain_score:.5f}, {scores}; {verdict}")  # fmt: skip


def output_score(agreement: Agreement) -> float:
    """One output's share of the objective: its mean per-sample cosine plus its pooled cosine."""
    return float(np.mean(agreement.sample_cosines)) + agreement.cosine


def fit_sample_count(seconds_per_run: float, available: int, budget: float, runs: float = FIT_REFERENCE_RUNS) -> int:
    """How many samples the fit may use within `budget` seconds (at most `available`, capped by the
    refinement's batch), at `runs` reference runs per sample."""
    per_sample = runs * seconds_per_run
    affordable = int(budget / per_sample) if per_sample > 0 else available
    return min(available, affordable, FIT_OPTIONS.refine_samples)


@dataclass
class _Trial:
    score: float
    losing: list[str]  # outputs that lose more than FIT_TOLERANCE against the plain table
    table: CalibrationTable
    refit: RefineResult | None
    groupings: dict[str, list[np.ndarray]]
    known: frozenset[str]


def _try(model: Path, plan: CalibrationPlan, table: CalibrationTable, feeds: Sequence[dict[str, np.ndarray]],
         judges: Sequence[dict[str, np.ndarray]], shapes: InputShapes | None, float_layers: Sequence[str],
         options: CalibrationOptions, before: CompareReport) -> _Trial:  # fmt: skip
    """One candidate: fit `table` to `feeds` with `options`, measured on `judges` against `before` (the plain
    table's report)."""
    fitted, refit, groupings = fit_to_samples(plan, table, feeds, options)
    refinement = Refinement(refit.constants if refit is not None else {}, groupings) if refit or groupings else None
    trial = Comparison(model, fitted, list(judges), "cv18xx_int8", shapes, refinement=refinement)
    known = frozenset(trial.graph.tensors) | frozenset(op.name for op in trial.graph.ops)
    after = trial.evaluate([n for n in float_layers if n in known], per_layer=False)  # a split drops some
    pairs = zip(after.judged, before.judged)
    losing = [a.name for a, b in pairs if output_score(a) < output_score(b) - FIT_TOLERANCE]
    return _Trial(objective(after), losing, fitted, refit, groupings, known)


def choose_fitted(
    model: Path,
    plan: CalibrationPlan,
    table: CalibrationTable,
    fit_feeds: Sequence[dict[str, np.ndarray]],
    judge_feeds: Sequence[dict[str, np.ndarray]],
    input_shapes: InputShapes | None,
    float_layers: Sequence[str],
    budget: float,
) -> FitChoice:
    """Fit `table` to as many of `fit_feeds` as `budget` allows with each of FIT_CANDIDATES and keep the best
    that beats `table` on `judge_feeds` (which no fit sees)."""
    with warnings.catch_warnings():  # rows without a tensor are the build's to report
        warnings.simplefilter("ignore")
        plain = Comparison(model, table, list(judge_feeds), "cv18xx_int8", input_shapes)
        before = plain.evaluate(float_layers, per_layer=False)
        choice = FitChoice(objective(before), 0, len(judge_feeds), "")
        seconds = reference_seconds(plain.graph)
        count, candidates = fit_sample_count(seconds, len(fit_feeds), budget), FIT_CANDIDATES
        if count < FIT_MIN_SAMPLES:
            lean = fit_sample_count(seconds, len(fit_feeds), budget, LEAN_REFERENCE_RUNS)
            if lean >= FIT_MIN_SAMPLES:
                count, candidates = lean, (LEAN_CANDIDATE,)
        choice.fitted_samples = count
        if not batch_first(plain.graph):
            choice.reason = "the model's tensors are not all sample-first (a sequence-first RNN); fits batch samples"
            return choice
        if count < FIT_MIN_SAMPLES:
            choice.reason = (f"{len(fit_feeds)} samples to fit, {count} within --budget {budget:g} s; it needs "
                             f"{FIT_MIN_SAMPLES} (give more samples or a larger --budget)")  # fmt: skip
            return choice
        best: _Trial | None = None
        verdicts = []
        for label, candidate in candidates:
            options = replace(candidate, refine_samples=count)
            try:
                trial = _try(model, plan, table, fit_feeds[:count], judge_feeds, input_shapes, float_layers, options,
                             before)  # fmt: skip
            except UserError as exc:  # an op the batched fit cannot run: the summary says why
                choice.scores[label] = None
                verdicts.append(f"{label} stopped: {exc}")
                continue
            choice.scores[label] = trial.score
            if trial.losing:
                verdicts.append(f"{label}: output {trial.losing[0]} loses")
            elif trial.score <= choice.plain_score + FIT_MIN_GAIN:
                verdicts.append(f"{label} gains less than {FIT_MIN_GAIN:g}")
            elif best is None or trial.score > best.score + FIT_MIN_GAIN:
                best, choice.chosen, choice.options = trial, label, options
    if best is None:
        choice.reason = "; ".join(verdicts)
        return choice
    choice.table, choice.refit, choice.groupings, choice.known = best.table, best.refit, best.groupings, best.known
    return choice
