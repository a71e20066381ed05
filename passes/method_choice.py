"""`npuc calibrate`'s default threshold method: the one whose table gives the network's best output.

Every method's thresholds come from the same statistics — those of all calibration samples but every fifth
(api._calibrate_auto) —; each table is then measured the way the build will use it — the cv18xx int8 scheme
simulated by npuc's quantized reference, the layers the float patterns keep in bf16 kept — against
onnxruntime on the samples set apart, which no threshold saw, and the best worst-output cosine wins (ties keep
the earlier method of AUTO_METHODS, KL first as tpu-mlir's default). The table written is the winner's over
all samples.
Measured on YOLOv8n (7 photos): KL 0.9989 output cosine with its face box at IoU 0.78, max / percentile / MSE
0.9995-0.9998 with every box at IoU >= 0.9.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from npuc.frontends.onnx import InputShapes
from npuc.passes.calibrate import CalibrationOptions, stats_to_table, tensor_table_names
from npuc.passes.calitable import CalibrationTable
from npuc.passes.compare import Comparison
from npuc.passes.histogram import CalibrationStats
from npuc.passes.quantize import thresholds_for_graph

AUTO_METHODS = ("kl", "mse", "percentile", "max")
AUTO_SAMPLES = 8  # calibration samples each candidate table is measured on


@dataclass
class MethodChoice:
    method: str
    table: CalibrationTable
    scores: dict[str, float]  # method -> worst output cosine

    def summary(self) -> str:
        scores = ", ".join(f"{m} {s:.5f}" for m, s in self.scores.items())
        return f"threshold method {self.method}: held-out output cosine per method {scores}"


def evaluation_picks(count: int) -> list[int]:
    """Up to AUTO_SAMPLES sample indices spread over the calibration set."""
    if count <= AUTO_SAMPLES:
        return list(range(count))
    return sorted({round(i * (count - 1) / (AUTO_SAMPLES - 1)) for i in range(AUTO_SAMPLES)})


def choose_method(
    model: Path,
    stats: CalibrationStats,
    options: CalibrationOptions,
    feeds: Sequence[dict[str, np.ndarray]],
    input_shapes: InputShapes | None,
    float_layers: Sequence[str] = (),
) -> MethodChoice:
    tables = {m: stats_to_table(stats, replace(options, method=m)) for m in AUTO_METHODS}
    with warnings.catch_warnings():  # rows without a tensor are the build's to report
        warnings.simplefilter("ignore")
        comparison = Comparison(model, tables["kl"], list(feeds), "cv18xx_int8", input_shapes)
    names = tensor_table_names(onnx.load(str(model), load_external_data=False))
    scores = {}
    for method, table in tables.items():
        comparison.thresholds = thresholds_for_graph(comparison.graph, table, warn=False, table_names=names)
        scores[method] = comparison.evaluate(float_layers).output_cosine
    best = max(AUTO_METHODS, key=lambda m: (scores[m], -AUTO_METHODS.index(m)))
    table = tables[best]
    table.method = f"auto ({tables[best].method})"
    return MethodChoice(best, table, scores)
