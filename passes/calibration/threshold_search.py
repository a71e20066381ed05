"""Threshold search against a global objective: each tensor's int8 threshold chosen for the network's output.

tpu-mlir's tune step (passes/calibration/tune.py) scores a threshold by the error of the next op alone. Here every
candidate is scored by the network's result: the mean cosine, over the calibration samples, between the
float network's output (its logits when it ends in a softmax, see `objective_tensor`) and the same tensor of
the scheme simulated in float (passes/quantization/qsim.py). One greedy sweep in graph order (coordinate descent): for
each thresholded tensor, `candidates` values spaced geometrically from its current (KL) threshold up to its
calibration absmax; the network prefix stays quantized with the values already chosen and only the suffix
reruns per candidate. A candidate must beat the best so far by MIN_GAIN to replace it, so ties keep the KL
threshold. Deterministic: fixed order, fixed candidates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from npuc.compiler.ir import Graph
from npuc.passes.quantization.qsim import (
    Simulator,
    activation_peaks,
    fake_quant,
    op_forward,
    output_cosines,
    stack_feeds,
)

DEFAULT_CANDIDATES = 5
MIN_GAIN = 1e-5  # mean-cosine improvement a new threshold must bring
MIN_SPREAD = 1.02  # absmax / threshold below which a tensor has nothing to search


@dataclass
class SearchResult:
    """Chosen thresholds and the calibration objective before and after."""

    thresholds: dict[str, float]
    cosine_before: float
    cosine_after: float
    changed: list[str]


def candidate_thresholds(threshold: float, peak: float, count: int, below: float = 1.0) -> np.ndarray:
    """`count` thresholds from `threshold` to `peak`, geometrically spaced (the first is `threshold`), and with
    `below` < 1 as many again from `threshold·below` up (clipping harder than KL)."""
    if count < 2 or peak <= threshold * MIN_SPREAD:
        up = np.array([threshold])
    else:
        up = np.geomspace(threshold, peak, count)
    if below >= 1.0:
        return up
    return np.concatenate([up, np.geomspace(threshold * below, threshold, count)[:-1]])


def objective_tensor(graph: Graph) -> str:
    """The tensor the search compares: the graph's first output, or the logits when that output is a softmax
    (probabilities saturate, so most samples show no change while a few flip; the logits move smoothly)."""
    out = graph.outputs[0]
    producer = next((op for op in graph.ops if out in op.outputs), None)
    return producer.inputs[0] if producer is not None and producer.kind == "softmax" else out


def search_thresholds(
    graph: Graph,
    thresholds: Mapping[str, float],
    feeds: Sequence[Mapping[str, np.ndarray]],
    candidates: int = DEFAULT_CANDIDATES,
    target: str | None = None,
    below: float = 1.0,
) -> SearchResult:
    """Greedy coordinate descent over the thresholds of `graph`'s activations (IR tensor names) maximising the
    mean cosine of `target` (default `objective_tensor`) on `feeds` (calibration samples only). Graph inputs
    keep their thresholds. `below` < 1 also tries values down to `below` × the current threshold."""
    feed = stack_feeds(feeds)
    sim = Simulator(graph, thresholds)
    out = target or objective_tensor(graph)
    sim.last_use[out] = len(graph.ops)
    ref = sim.forward(sim.inputs(feed, False), quantized=False)[out]
    peaks = activation_peaks(graph, feed)

    def objective(env: dict[str, np.ndarray], start: int) -> float:
        return float(output_cosines(ref, sim.forward(env, start)[out]).mean())

    env = sim.inputs(feed)
    batch = next(iter(feed.values())).shape[0]
    before = best_score = objective(env, 0)
    changed = []
    for i, op in enumerate(graph.ops):
        name = op.outputs[0]
        th = sim.thresholds.get(name)
        options = candidate_thresholds(th, peaks.get(name, th), candidates, below) if th is not None else ()
        if op.kind == "softmax" or len(options) < 2:
            env = sim.forward(env, i, i + 1)
            continue
        raw = op_forward(graph, op, sim.args(op, env, True), batch)
        env = sim.forward(env, i, i + 1)
        for value in options[1:]:
            score = objective({**env, name: fake_quant(raw, value)}, i + 1)
            if score > best_score + MIN_GAIN:
                best_score, th = score, float(value)
        if th != sim.thresholds[name]:
            sim.thresholds[name] = th
            changed.append(name)
            env[name] = sim.grid(name, raw)
    return SearchResult(dict(sim.thresholds), before, best_score, changed)
