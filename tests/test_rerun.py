"""Quantized re-runs resumed where the graph first differs (passes/calibration/rerun.py): the same bytes as a
full run, without re-running the ops before the first change."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from golden import GOLDEN_ROOT

from npuc.compiler.interp import run
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.passes.calibration.calitable import read_table
from npuc.passes.calibration.compare import Comparison
from npuc.passes.calibration.rerun import RunCache, first_difference, same
from npuc.passes.quantization.quantize import quantize

GOLDEN = GOLDEN_ROOT / "cv18xx"
MODEL = GOLDEN / "smallcnn.onnx"
TABLE = GOLDEN / "smallcnn_cali_table.txt"


@pytest.fixture(scope="module")
def comparison() -> Comparison:
    feeds = []
    for i in range(2):
        with np.load(GOLDEN / "smallcnn_cali_samples" / f"{i:02d}.npz") as data:
            feeds.append({"input": data["input"]})
    return Comparison(MODEL, read_table(TABLE), feeds, "cv18xx_int8")


def _graph(comparison: Comparison, change: dict[str, float] | None = None, float_layers: tuple[str, ...] = ()):
    thresholds = dict(comparison.thresholds.thresholds)
    comparison.thresholds.thresholds = {**thresholds, **(change or {})}
    try:
        return quantize(comparison.graph, comparison.thresholds, "cv18xx_int8", comparison.float_names(float_layers))
    finally:
        comparison.thresholds.thresholds = thresholds


def test_same_compares_arrays_by_bytes_and_dataclasses_by_field() -> None:
    assert same(np.arange(3, dtype=np.int8), np.arange(3, dtype=np.int8))
    assert not same(np.arange(3, dtype=np.int8), np.arange(3, dtype=np.int16))  # same values, other format
    assert not same(np.zeros((1, 3)), np.zeros(3)) and not same(np.float32(np.nan), np.float32(np.nan))
    assert same({"a": (1, np.ones(2))}, {"a": (1, np.ones(2))}) and not same([1], (1,))


def test_first_difference_is_the_producer_of_the_changed_tensor(comparison: Comparison) -> None:
    base = _graph(comparison)
    assert first_difference(base, _graph(comparison)) == len(base.ops)  # quantize is deterministic
    name = "relu_26"
    changed = _graph(comparison, {name: comparison.thresholds.thresholds[name] * 1.5})
    k = first_difference(base, changed)
    producer = next(i for i, op in enumerate(changed.ops) if name in op.outputs)
    assert 0 < k <= producer
    assert all(same(a.attrs, b.attrs) for a, b in zip(base.ops[:k], changed.ops[:k]))
    assert first_difference(base, _graph(comparison, float_layers=("relu_34",))) > 0


def test_resumed_runs_give_the_full_runs_bytes_and_skip_the_prefix(comparison: Comparison) -> None:
    calls: Counter[str] = Counter()

    def counting(kind: str):  # noqa: ANN202
        def kernel(op, args):  # noqa: ANN001, ANN202
            calls[op.name] += 1
            return QUANT_KERNELS[kind](op, args)

        return kernel

    cache = RunCache({kind: counting(kind) for kind in QUANT_KERNELS})
    base = _graph(comparison)
    name = "relu_26"
    changed = _graph(comparison, {name: comparison.thresholds.thresholds[name] * 1.5})
    for graph in (base, changed, base):
        cache.begin(graph)
        for i, feed in enumerate(comparison.feeds):
            got = cache.run(i, feed)
            full = run(graph, feed, keep_all=True, kernels=QUANT_KERNELS)
            assert got.keys() == full.keys()
            assert all(np.array_equal(got[n], full[n]) and got[n].dtype == full[n].dtype for n in full)
        cache.end()
    k = first_difference(base, changed)
    first = base.ops[0].name
    # per sample: the base ran in full; the changed graph from op k on; the base again not at all (kept whole)
    assert calls[first] == 2 and all(calls[op.name] == 2 for op in base.ops[:k])
    assert calls[changed.ops[-1].name] == 4
    # kept tensors are read-only: a kernel writing into its input would corrupt later runs, and fails instead
    with pytest.raises(ValueError):
        got[changed.ops[0].outputs[0]][...] = 0


def test_evaluations_in_a_search_are_unchanged_by_the_resume(comparison: Comparison, tmp_path: Path) -> None:
    """Evaluate the same float-layer sets in a different order and with fresh comparisons: identical reports."""
    sets = [(), ("relu_34",), (), ("output",), ("relu_34",)]
    resumed = [comparison.evaluate(layers) for layers in sets]
    for layers, report in zip(sets, resumed):
        fresh = Comparison(MODEL, read_table(TABLE), comparison.feeds, "cv18xx_int8").evaluate(layers)
        assert [a.sample_cosines for a in fresh.outputs] == [a.sample_cosines for a in report.outputs]
        assert [(a.name, a.cosine) for a in fresh.layers] == [(a.name, a.cosine) for a in report.layers]
