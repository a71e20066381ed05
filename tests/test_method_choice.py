"""The per-tensor search of `npuc calibrate`'s default (passes/calibration/method_choice.py) on a stand-in network
whose output cosine is a known function of its thresholds: which candidates it tries within a budget, when it
refines with midpoints, and which gains it keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from npuc.passes.calibration.calitable import CalibrationTable, Threshold
from npuc.passes.calibration.method_choice import (
    AUTO_METHODS,
    MIDPOINT,
    MIN_GAIN,
    choose_per_tensor,
    midpoint_tables,
)


@dataclass
class _Output:
    cosine: float
    sample_cosines: list[float] = field(default_factory=list)


@dataclass
class _Report:
    outputs: list[_Output]
    judged: list[_Output] = field(default_factory=list)

    @property
    def output_cosine(self) -> float:
        return self.outputs[0].cosine


class _Network:
    """Output cosine 1 - sum over tensors of weight * log(threshold / best)^2; counts its runs."""

    def __init__(self, best: dict[str, float], weight: dict[str, float], start: dict[str, float]) -> None:
        self.best, self.weight = best, weight
        self.thresholds = SimpleNamespace(thresholds=dict(start))
        self.runs: list[dict[str, float]] = []

    def evaluate(self, float_layers, per_layer: bool = True) -> _Report:  # noqa: ANN001, ARG002
        t = self.thresholds.thresholds
        self.runs.append(dict(t))
        c = 1 - sum(w * math.log(t[n] / self.best[n]) ** 2 for n, w in self.weight.items())
        return _Report([_Output(c, [c])])

    def local_loss(self, report: _Report) -> dict[str, float]:  # noqa: ARG002
        return dict(self.weight)


def _candidates(values: dict[str, dict[str, float]], start: str) -> dict[str, dict[str, float]]:
    """method -> tensor -> threshold, with the midpoints between `start`'s values and each other method's."""
    found = dict(values)
    for method in AUTO_METHODS:
        if method != start:
            found[MIDPOINT + method] = {n: math.sqrt(values[start][n] * values[method][n]) for n in values[start]}
    return found


# tensor "a": percentile 1.84 and KL 0.80 as on O-Net's box FC input, the network best near their midpoint;
# tensor "b": every method near its best
VALUES = {
    "percentile": {"a": 1.84, "b": 1.0},
    "kl": {"a": 0.80, "b": 1.0},
    "mse": {"a": 1.84, "b": 1.0},
    "max": {"a": 1.84, "b": 1.0},
}


def test_an_affordable_search_keeps_the_midpoint_of_a_rejected_far_value() -> None:
    network = _Network({"a": 1.25, "b": 1.0}, {"a": 0.01, "b": 0.001}, VALUES["percentile"])
    chosen, cosine, used = choose_per_tensor(network, _candidates(VALUES, "percentile"), "percentile", [], 100)
    assert chosen == {"a": MIDPOINT + "kl"}
    # the start, KL's value for "a" (rejected), the midpoint (kept), then the other methods' value against it
    tried = [run["a"] for run in network.runs]
    assert tried == pytest.approx([1.84, 0.80, math.sqrt(1.84 * 0.80), 1.84, 1.84, 1.84]) and used == 5
    assert cosine > 1 - 0.01 * math.log(1.84 / 1.25) ** 2
    assert network.thresholds.thresholds["a"] == pytest.approx(math.sqrt(1.84 * 0.80))


def test_a_tight_budget_tries_each_method_once_and_no_midpoint() -> None:
    network = _Network({"a": 1.25, "b": 1.0}, {"a": 0.01, "b": 0.001}, VALUES["percentile"])
    chosen, _, used = choose_per_tensor(network, _candidates(VALUES, "percentile"), "percentile", [], 1)
    assert chosen == {} and used == 1  # KL's value tried and rejected; 2 trials would have refined
    assert [run["a"] for run in network.runs] == [1.84, 0.80]
    assert network.thresholds.thresholds == VALUES["percentile"]


@pytest.mark.parametrize(("trials", "kept"), [(100, False), (1, True)])
def test_a_refining_search_keeps_only_gains_of_min_gain(trials: int, kept: bool) -> None:
    """A change worth a quarter of MIN_GAIN: kept by a budgeted search, not by a refining one (many candidates
    compared on few samples)."""
    values = {m: {"a": 1.0, "b": 1.0} for m in AUTO_METHODS}
    values["kl"] = {"a": 1.0, "b": 2.0}
    # the objective is 2 * cosine: from b = 1 to b = 2 (its best) it gains 2 * w * ln(2) ** 2
    weight = MIN_GAIN / 4 / (2 * math.log(2) ** 2)
    network = _Network({"a": 1.0, "b": 2.0}, {"a": 0.0, "b": weight}, values["percentile"])
    chosen, _, _ = choose_per_tensor(network, _candidates(values, "percentile"), "percentile", [], trials)
    assert ("b" in chosen) is kept


def test_midpoint_tables_are_the_geometric_means_of_the_start_and_each_method() -> None:
    def table(method: str, rows: dict[str, float]) -> CalibrationTable:
        return CalibrationTable({n: Threshold(t, -t, t) for n, t in rows.items()}, method=method)

    tables = {
        "percentile": table("percentile", {"x": 4.0, "y": 1.0, "z": 2.0}),
        "kl": table("kl", {"x": 1.0, "y": 0.0}),
        "mse": table("mse", {"x": 9.0, "y": 1.0, "z": 2.0}),
    }
    found = midpoint_tables(tables, "percentile")
    assert set(found) == {MIDPOINT + "kl", MIDPOINT + "mse"}
    kl = found[MIDPOINT + "kl"].entries
    assert kl["x"].threshold == 2.0  # sqrt(4 * 1)
    assert kl["y"].threshold == 1.0 and kl["z"].threshold == 2.0  # a zero threshold, a missing row: the start's
    assert found[MIDPOINT + "mse"].entries["x"].threshold == 6.0
