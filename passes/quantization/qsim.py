"""Batched float simulation of the cv18xx int8 scheme, the fast model the refinement passes optimise against.

Every thresholded tensor is put on its int8 grid (`round(x·127/th)` clipped to [-128, 127], rescaled), conv
weights on a per-output-channel int8 grid and FC weights on one per-tensor grid (npuc's cv18xx rules); the
ops themselves run in float. What it leaves out (int8 multipliers of pools and eltwise ops, int32 bias
rounding, bf16 softmax) moves the output cosine by well under 1e-2 on PP-LCNet, so choices made here hold in
the integer reference (bench/accuracy.py measures them there).

All samples run as one batch. Depthwise convs, most of the float interpreter's time, run as a sum of
kh·kw shifted slices instead of its grouped im2col. `Simulator.forward` walks a range of ops over an
environment of live tensors, dropping each tensor after its last use, so a search can keep the quantized
prefix of the network and rerun only the suffix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.interp import to_graph_layout
from npuc.compiler.ir import Graph, Op
from npuc.compiler.kernels import FLOAT_KERNELS

Env = dict[str, np.ndarray]
QUANTIZED_WEIGHT_KINDS = ("conv2d", "gemm", "matmul")


def fake_quant(x: np.ndarray, threshold: float | np.ndarray) -> np.ndarray:
    """Symmetric int8 codes of `x` at `threshold` (a scalar, or an array broadcasting against `x`), back in
    float32."""
    scale = np.float32(127.0) / np.asarray(threshold, np.float32)
    return np.clip(np.rint(x * scale), -128, 127).astype(np.float32) / scale


def weight_grid(kind: str, w: np.ndarray) -> np.ndarray:
    """`w` on its int8 grid: per output channel for conv, one scale for FC (gemm / matmul)."""
    axes = tuple(range(1, w.ndim)) if kind == "conv2d" and w.ndim > 1 else None
    peak = np.maximum(np.abs(w).max(axis=axes, keepdims=axes is not None), 1e-30).astype(np.float64)
    return (np.rint(w / peak * 127.0) * peak / 127.0).astype(np.float32)


def is_depthwise(op: Op, weight: np.ndarray) -> bool:
    return op.kind == "conv2d" and op.attrs.group > 1 and weight.shape[1] == 1 and weight.shape[0] == op.attrs.group


def op_forward(graph: Graph, op: Op, args: list[np.ndarray], batch: int) -> np.ndarray:
    """One op in float on a batch (the first output only)."""
    return op_outputs(graph, op, args, batch)[0]


def op_outputs(graph: Graph, op: Op, args: list[np.ndarray], batch: int) -> list[np.ndarray]:
    """One op in float on a batch: every output (a split has several)."""
    if op.kind == "reshape":  # the IR pins batch 1 into reshape targets; batch_first graphs stack samples on axis 0
        shape = graph.shape(op.outputs[0])
        return [args[0].reshape(batch * shape[0], *shape[1:]) if shape else args[0].reshape(shape)]
    # a concat part made of constants alone (a decode grid) holds one sample's worth: the same for every sample
    if op.kind == "concat" and batch > 1 and op.attrs.axis % len(args[0].shape) != 0:
        args = [np.broadcast_to(a, (batch, *a.shape[1:])) if a.shape[0] == 1 else a for a in args]
    return list(FLOAT_KERNELS[op.kind](op, args))


def batch_first(graph: Graph) -> bool:
    """Whether every activation has the sample axis first (dim 0 is 1 at batch 1): only then are samples
    stacked along axis 0 one batch (a sequence-first RNN's time axis is not)."""
    return all(t.shape and t.shape[0] == 1 for t in graph.tensors.values() if not t.is_const and t.shape)


def stack_feeds(feeds: Sequence[Mapping[str, np.ndarray]]) -> Env:
    """Samples (batch 1 each) as one batch per input."""
    return {name: np.concatenate([np.asarray(f[name], np.float32) for f in feeds]) for name in feeds[0]}


def output_cosines(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Per-sample cosine of two batched outputs."""
    r = ref.reshape(ref.shape[0], -1).astype(np.float64)
    g = got.reshape(got.shape[0], -1).astype(np.float64)
    norm = np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1)
    return np.sum(r * g, axis=1) / np.maximum(norm, 1e-300)


class Simulator:
    """The cv18xx int8 scheme of `graph` in float, with `thresholds` (IR tensor -> threshold) that a caller
    may change between runs. `weights` overrides constants (refined weights, biases) by name."""

    def __init__(
        self, graph: Graph, thresholds: Mapping[str, float], weights: Mapping[str, np.ndarray] | None = None
    ) -> None:
        self.graph = graph
        self.thresholds = dict(thresholds)
        self.weights: dict[str, np.ndarray] = dict(weights or {})
        self.grid_weights: dict[str, np.ndarray] = {}
        self.last_use: dict[str, int] = {}
        for i, op in enumerate(graph.ops):
            for name in op.inputs:
                self.last_use[name] = i
        for name in graph.outputs:
            self.last_use[name] = len(graph.ops)
        self.batch_first = batch_first(graph)

    def set_weight(self, name: str, value: np.ndarray) -> None:
        self.weights[name] = value
        self.grid_weights.pop(name, None)

    def constant(self, op: Op, index: int, quantized: bool) -> np.ndarray:
        name = op.inputs[index]
        value = self.weights.get(name, self.graph.tensors[name].data)
        if not (quantized and index == 1 and op.kind in QUANTIZED_WEIGHT_KINDS):
            return value
        if name not in self.grid_weights:
            self.grid_weights[name] = weight_grid(op.kind, value)
        return self.grid_weights[name]

    def grid(self, name: str, x: np.ndarray) -> np.ndarray:
        th = self.thresholds.get(name)
        return x if th is None else fake_quant(x, th)

    def args(self, op: Op, env: Env, quantized: bool) -> list[np.ndarray]:
        return [env[n] if n in env else self.constant(op, i, quantized) for i, n in enumerate(op.inputs) if n]

    def inputs(self, feed: Env, quantized: bool = True) -> Env:
        return {n: self.grid(n, v) if quantized else v for n, v in feed.items()}

    def forward(
        self,
        env: Env,
        start: int = 0,
        stop: int | None = None,
        quantized: bool = True,
        hook: Callable[[int, Op, np.ndarray], np.ndarray] | None = None,
    ) -> Env:
        """Run ops[start:stop] over `env` (left unchanged); returns the live tensors after the last op.

        `hook(i, op, raw)` sees each op's float result before it goes on its grid and may replace it."""
        ops = self.graph.ops
        stop = len(ops) if stop is None else stop
        env = to_graph_layout(self.graph, env) if start == 0 else dict(env)  # samples come as the user feeds them
        if self.batch_first:  # a tensor made of constants alone keeps dim 0 at 1
            batch = max((v.shape[0] for v in env.values() if np.ndim(v)), default=1)
        else:  # one sample at a time: its tensors have the graph's own shapes
            batch = 1
            stacked = [n for n in self.graph.inputs if n in env and env[n].shape != tuple(self.graph.shape(n))]
            if stacked:
                raise UserError(f"input '{stacked[0]}' holds {env[stacked[0]].shape[0]} samples, which cannot run as "
                                "one batch: not every tensor of the model has the sample axis first (a "
                                "sequence-first RNN); use --refine-samples 1")  # fmt: skip
        for i in range(start, stop):
            op = ops[i]
            try:
                raw, *others = op_outputs(self.graph, op, self.args(op, env, quantized), batch)
            except ValueError as exc:  # an op whose attributes pin batch 1 (a fixed shape)
                raise UserError(
                    f"op '{op.name}' ({op.kind}) cannot run {batch} samples as one batch ({exc}); "
                    "use one sample at a time (--refine-samples 1) or drop --refine"
                ) from None
            if hook is not None:
                raw = hook(i, op, raw)
            for out, value in zip(op.outputs, [raw, *others]):
                if out:
                    env[out] = self.grid(out, value) if quantized and op.kind != "softmax" else value
            for name in op.inputs:
                if self.last_use.get(name, -1) <= i and name in env:
                    del env[name]
        return env

    def outputs(self, feed: Env, quantized: bool = True) -> np.ndarray:
        """The first graph output for a stacked feed."""
        return self.forward(self.inputs(feed, quantized), quantized=quantized)[self.graph.outputs[0]]


def activation_peaks(graph: Graph, feed: Env) -> dict[str, float]:
    """Max |x| of every float activation over a stacked feed (the calibration absmax)."""
    peaks = {n: float(np.abs(v).max()) for n, v in feed.items()}
    sim = Simulator(graph, {})

    def record(i: int, op: Op, raw: np.ndarray) -> np.ndarray:
        if np.issubdtype(raw.dtype, np.floating):
            peaks[op.outputs[0]] = float(np.abs(raw).max())
        return raw

    sim.forward(feed, quantized=False, hook=record)
    return peaks
