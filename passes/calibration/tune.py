"""tpu-mlir's calibration tune step (`run_calibration --tune_num N`, its SimpleTuner; specs/quant.md §1.2).

After the KL table, the first N samples run through the float IR once (all activations kept). Then, walking
the ops in order, each activation input of an op is tuned once, at its first consumer (an op whose inputs
are all tuned already re-tunes its first input, keeping the larger result): `steps + 1` candidate thresholds
from the KL value up to the tensor's absmax; each candidate fake-quantizes the float input
(`round(x·127/th)` clipped to [-128, 127], then rescaled), the op runs in float with fake-quantized weights
(int8 per output channel), and the score is `‖ref − out‖₂ / ‖ref‖₁` averaged over the samples. The lowest
score wins (the first on ties) and thresholds only ever rise. Deviation: tpu-mlir fake-quantizes every
input of a multi-input op (an SE block's Mul, an Add) with the candidate of the tuned one; here the other
inputs keep their own thresholds, so a 0..1 gate is not quantized with a 0..30 feature's candidate.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from npuc.compiler.interp import run
from npuc.compiler.ir import Graph, Op
from npuc.compiler.kernels import FLOAT_KERNELS
from npuc.passes.calibration.calitable import CalibrationTable

DEFAULT_TUNE_STEPS = 21  # tpu-mlir's SimpleTuner default (debug_cmd tune_steps=N)
MIN_TUNED_GAP = 0.01  # tpu-mlir skips tensors whose absmax is within this of the threshold
WEIGHTED_KINDS = ("conv2d", "gemm", "matmul")


def fake_quant(x: np.ndarray, threshold: float) -> np.ndarray:
    """tpu-mlir's `import_quant_bias`: symmetric int8 codes at `threshold`, back in float32."""
    scale = 127.0 / float(threshold)
    y = np.multiply(x, scale, dtype=np.float64)  # the same steps in one float64 buffer
    np.round(y, out=y)
    np.clip(y, -128, 127, out=y)
    y /= scale
    return y.astype(np.float32)


def fake_quant_weights(graph: Graph) -> dict[str, np.ndarray]:
    """Float copies of conv / FC weights on their int8 grid: per output channel for conv, per tensor for FC
    (npuc's cv18xx rules)."""
    out: dict[str, np.ndarray] = {}
    for op in graph.ops:
        if op.kind not in WEIGHTED_KINDS or len(op.inputs) < 2:
            continue
        w = graph.const(op.inputs[1])
        if w is None or not np.issubdtype(w.dtype, np.floating) or w.size == 0:
            continue
        axes = tuple(range(1, w.ndim)) if op.kind == "conv2d" and w.ndim > 1 else None
        peak = np.maximum(np.abs(w).max(axis=axes, keepdims=axes is not None), 1e-30)
        out[op.inputs[1]] = (np.round(w / peak * 127.0) * peak / 127.0).astype(np.float32)
    return out


class SimpleTuner:
    """Tunes IR tensors' thresholds on a few samples; `thresholds` is updated in place by `run`."""

    def __init__(
        self,
        graph: Graph,
        thresholds: dict[str, float],
        absmax: Mapping[str, float],
        feeds: Sequence[dict[str, np.ndarray]],
        steps: int = DEFAULT_TUNE_STEPS,
    ) -> None:
        self.graph, self.thresholds, self.absmax, self.steps = graph, thresholds, absmax, steps
        self.initial = dict(thresholds)
        self.refs = [run(graph, feed, keep_all=True) for feed in feeds]
        self.weights = fake_quant_weights(graph)

    def _args(self, op: Op, ref: Mapping[str, np.ndarray], tuned: str, candidate: float) -> list[np.ndarray]:
        args = []
        for name in op.inputs:
            if not name:
                continue
            if name in self.weights:
                args.append(self.weights[name])
            elif name == tuned:
                args.append(fake_quant(ref[name], candidate))
            elif name in self.thresholds and name in ref:
                args.append(fake_quant(ref[name], self.thresholds[name]))
            else:
                args.append(ref[name] if name in ref else self.graph.tensors[name].data)
        return args

    def distance(self, op: Op, tuned: str, candidate: float) -> float:
        """Mean over samples of ‖ref − out‖₂ / ‖ref‖₁ at the op's first output."""
        total = 0.0
        for ref in self.refs:
            want = ref[op.outputs[0]].astype(np.float64).ravel()
            got = FLOAT_KERNELS[op.kind](op, self._args(op, ref, tuned, candidate))[0]
            norm1 = float(np.abs(want).sum())
            if norm1 > 0:
                total += float(np.linalg.norm(want - np.asarray(got, np.float64).ravel())) / norm1
        return total / max(len(self.refs), 1)

    def tune_input(self, op: Op, tensor: str) -> None:
        low, high = self.initial[tensor], self.absmax.get(tensor, self.initial[tensor])
        if high - low <= MIN_TUNED_GAP:
            return
        step = (high - low) / self.steps
        best, best_distance = low, None
        for i in range(self.steps + 1):
            candidate = low + step * i
            d = self.distance(op, tensor, candidate)
            if best_distance is None or d < best_distance:
                best, best_distance = candidate, d
        self.thresholds[tensor] = max(self.thresholds[tensor], best)

    def run(self) -> dict[str, float]:
        tuned: set[str] = set()
        for op in self.graph.ops:
            if op.kind not in FLOAT_KERNELS or not self._float_output(op):
                continue
            inputs = [n for n in dict.fromkeys(op.inputs) if n in self.thresholds and n in self.refs[0]]
            if not inputs:
                continue
            todo = [n for n in inputs if n not in tuned] or inputs[:1]
            for name in todo:
                self.tune_input(op, name)
                tuned.add(name)
        return self.thresholds

    def _float_output(self, op: Op) -> bool:
        value = self.refs[0].get(op.outputs[0]) if self.refs else None
        return value is not None and np.issubdtype(value.dtype, np.floating)


def tune_table(
    graph: Graph,
    table: CalibrationTable,
    table_names: Mapping[str, str],
    feeds: Sequence[dict[str, np.ndarray]],
    steps: int = DEFAULT_TUNE_STEPS,
) -> CalibrationTable:
    """`table` with its thresholds tuned on `feeds`; `table_names` maps IR tensor -> table row (the rows'
    min / max give each tensor's absmax). Rows the IR does not have stay as they are."""
    rows = table.entries
    names = {t: r for t, r in table_names.items() if r in rows and t in graph.tensors}
    thresholds = {t: rows[r].threshold for t, r in names.items()}
    absmax = {t: max(abs(rows[r].min), abs(rows[r].max)) for t, r in names.items()}
    tuned = SimpleTuner(graph, thresholds, absmax, feeds, steps).run()
    entries = dict(rows)
    for tensor, row in names.items():
        entries[row] = replace(rows[row], threshold=float(np.float32(tuned[tensor])))
    result = copy.copy(table)
    result.entries = entries
    result.tune_number = len(feeds)
    return result
