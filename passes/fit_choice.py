"""`npuc calibrate`'s default, second step: whether fitting the samples beats the plain table.

The plain table (passes/method_choice.py) only moves thresholds. The steps that fit the samples themselves —
channel groups with their own thresholds (passes/channel_split.py), tpu-mlir's tune step (passes/tune.py),
weights refitted to the quantized activations (passes/refine.py) — are what lift mobile networks whose channels
differ in range inside one tensor (PP-LCNet: 0.95 -> 0.99 mean output cosine on the bench). They fit their
samples closely, so they are judged on samples the fit never saw: both candidates are measured with the
cv18xx int8 reference against onnxruntime there, and the fitted one is kept only when it raises the worst
output's objective (mean per-sample cosine + pooled cosine, as the per-tensor search uses) by FIT_MIN_GAIN.

The fit's cost comes from a fixed cost model of the reference (FIT_REFERENCE_RUNS runs of the float and
quantized graphs per fitted sample), so the number of samples it fits on — and therefore the table — does not
depend on the machine's load; what does not fit in the budget is not tried, and the summary says so.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from npuc.compiler.errors import UserError
from npuc.frontends.onnx import InputShapes
from npuc.passes.calibrate import CalibrationOptions, CalibrationPlan, fit_to_samples
from npuc.passes.calitable import CalibrationTable
from npuc.passes.compare import Agreement, Comparison
from npuc.passes.method_choice import objective, reference_seconds
from npuc.passes.qsim import batch_first
from npuc.passes.refine import RefineResult
from npuc.passes.refinement import Refinement

FIT_OPTIONS = CalibrationOptions(method="kl", tune=5, refine="weights", split_channels=3)
FIT_MIN_SAMPLES = 8  # fewer: a refit that memorises its samples; not tried
FIT_MIN_JUDGES = 2  # samples the fit never saw that judge it
# the objective gain (two cosines summed) the fit must bring: a split costs the device ops and DDR traffic, so a
# gain within measuring noise keeps the plain table's graph (smallcnn: +4e-5, PP-LCNet: +0.011)
FIT_MIN_GAIN = 1e-3
# and no output may lose more than this (O-Net: the refit raised its box output and lowered its face probability)
FIT_TOLERANCE = 1e-4
# per fitted sample: the channel peaks, the split thresholds, the tune step's runs and the refit's float and
# quantized walks, in units of one quantized-reference run (measured on PP-LCNet and O-Net)
FIT_REFERENCE_RUNS = 12.0


@dataclass
class FitChoice:
    """What the comparison found; `kept` says which table the calibration writes."""

    kept: bool
    plain_score: float  # worst output: mean per-sample + pooled cosine, on the judging samples
    fitted_score: float | None  # None: not tried
    fitted_samples: int
    judged_on: int
    reason: str
    table: CalibrationTable | None = None
    refit: RefineResult | None = None
    groupings: dict[str, list[np.ndarray]] = field(default_factory=dict)
    known: frozenset[str] = frozenset()  # the fitted graph's op and tensor names (what a qtable may name)

    def refinement(self) -> Refinement | None:
        """What the side file carries when the fitted table is kept (None otherwise)."""
        if not self.kept:
            return None
        return Refinement(self.refit.constants if self.refit is not None else {}, self.groupings)

    def summary(self) -> str:
        if self.fitted_score is None:
            return f"split/tune/refit not tried: {self.reason}"
        verdict = "kept" if self.kept else f"not kept ({self.reason})"
        return (f"split/tune/refit on {self.fitted_samples} samples {verdict}: objective {self.fitted_score:.5f} "
                f"vs plain {self.plain_score:.5f} on {self.judged_on} samples it never saw")  # fmt: skip


def output_score(agreement: Agreement) -> float:
    """One output's share of the objective: its mean per-sample cosine plus its pooled cosine."""
    return float(np.mean(agreement.sample_cosines)) + agreement.cosine


def fit_sample_count(seconds_per_run: float, available: int, budget: float) -> int:
    """How many samples the fit may use within `budget` seconds (at most `available`, capped by the
    refinement's batch)."""
    per_sample = FIT_REFERENCE_RUNS * seconds_per_run
    affordable = int(budget / per_sample) if per_sample > 0 else available
    return min(available, affordable, FIT_OPTIONS.refine_samples)


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
    """Fit `table` to as many of `fit_feeds` as `budget` allows and keep it when it beats `table` on
    `judge_feeds` (which the fit never sees)."""
    with warnings.catch_warnings():  # rows without a tensor are the build's to report
        warnings.simplefilter("ignore")
        plain = Comparison(model, table, list(judge_feeds), "cv18xx_int8", input_shapes)
        before = plain.evaluate(float_layers)
        plain_score = objective(before)
        count = fit_sample_count(reference_seconds(plain.graph), len(fit_feeds), budget)
        if not batch_first(plain.graph):
            reason = "the model's tensors are not all sample-first (a sequence-first RNN); the fit batches samples"
            return FitChoice(False, plain_score, None, 0, len(judge_feeds), reason)
        if count < FIT_MIN_SAMPLES:
            reason = (f"{len(fit_feeds)} samples to fit, {count} within --budget {budget:g} s; it needs "
                      f"{FIT_MIN_SAMPLES} (give more samples or a larger --budget)")  # fmt: skip
            return FitChoice(False, plain_score, None, count, len(judge_feeds), reason)
        options = replace(FIT_OPTIONS, refine_samples=count)
        try:
            fitted, refit, groupings = fit_to_samples(plan, table, fit_feeds[:count], options)
            refinement = Refinement(refit.constants if refit is not None else {}, groupings)
            trial = Comparison(model, fitted, list(judge_feeds), "cv18xx_int8", input_shapes, refinement=refinement)
        except UserError as exc:  # an op the batched fit cannot run: the plain table stands, and the summary says why
            return FitChoice(False, plain_score, None, count, len(judge_feeds), f"the fit stopped: {exc}")
        known = frozenset(trial.graph.tensors) | frozenset(op.name for op in trial.graph.ops)
        after = trial.evaluate([n for n in float_layers if n in known])  # a split drops some
        fitted_score = objective(after)
    pairs = zip(after.judged, before.judged)
    worse = [a.name for a, b in pairs if output_score(a) < output_score(b) - FIT_TOLERANCE]
    kept = fitted_score > plain_score + FIT_MIN_GAIN and not worse
    reason = f"output {worse[0]} loses" if worse else "" if kept else f"gains less than {FIT_MIN_GAIN:g}"
    return FitChoice(kept, plain_score, fitted_score, count, len(judge_feeds), reason, fitted, refit, groupings,
                     known)  # fmt: skip
