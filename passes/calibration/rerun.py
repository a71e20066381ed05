"""Re-running a quantized graph that differs from an earlier one only from some op on.

The automatic choices (a method per tensor, the bf16 layers of --target-cos) evaluate many quantized graphs that
differ from the last one in one threshold or one layer's format: every op before the first changed one computes
exactly what it computed before. `RunCache` keeps the last runs' tensors (keep_all) per sample and resumes a new
graph at its first op that differs (kind, name, tensors, attributes with the quantization parameters, constants,
output formats); the kernels are deterministic, so the results are the bytes a full run gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from npuc.compiler.interp import run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels import KernelFn

RERUN_CACHE_BYTES = 512 << 20  # tensors kept per cached run (all its samples); a larger run is not kept
RUNS_KEPT = 2  # a search compares trials with its best so far: keep that one and the latest


def same(a: object, b: object) -> bool:
    """Deep equality of IR values: arrays by dtype, shape and bytes; dataclasses field by field."""
    if isinstance(a, np.ndarray | np.generic) or isinstance(b, np.ndarray | np.generic):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def first_difference(old: Graph, new: Graph) -> int:
    """The index of `new`'s first op that may compute something else than `old`'s op there (len: none)."""
    if old.inputs != new.inputs or old.input_layouts != new.input_layouts:
        return 0
    if not all(same(old.tensors[n], new.tensors[n]) for n in new.inputs):
        return 0
    for i, (a, b) in enumerate(zip(old.ops, new.ops)):
        if (a.kind, a.name, a.inputs, a.outputs) != (b.kind, b.name, b.inputs, b.outputs) or not same(a.attrs, b.attrs):
            return i
        constants = [n for n in b.inputs if n and new.tensors[n].data is not None]
        if not all(n in old.tensors and same(old.tensors[n], new.tensors[n]) for n in constants):
            return i
        if not all(same(old.tensors[n], new.tensors[n]) for n in b.outputs):
            return i
    return min(len(old.ops), len(new.ops))


@dataclass
class _Run:
    graph: Graph
    tensors: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # sample -> every tensor


class RunCache:
    """keep_all runs of quantized graphs, resumed where a new graph first differs from a kept one."""

    def __init__(self, kernels: Mapping[str, KernelFn]) -> None:
        self.kernels = kernels
        self.kept: list[_Run] = []  # most useful first
        self.current: _Run | None = None
        self.resume_at = 0  # the current graph's first op to run
        self.source: _Run | None = None

    def clear(self) -> None:
        """Forget every kept run (runs made under other kernels' numerics must not be resumed)."""
        self.kept, self.current, self.source, self.resume_at = [], None, None, 0

    def begin(self, graph: Graph) -> None:
        """The graph the next `run` calls execute: resumed from the kept run it shares the longest prefix with."""
        matches = [(first_difference(r.graph, graph), k) for k, r in enumerate(self.kept)]
        start, k = max(matches, default=(0, -1))
        self.source = self.kept[k] if start else None
        self.resume_at = start
        self.current = _Run(graph)

    def run(self, sample: int, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        graph, known = self.current.graph, self.source.tensors.get(sample) if self.source else None
        start = self.resume_at if known is not None else 0
        tensors = run(graph, feed, keep_all=True, kernels=self.kernels, start=start, known=known)
        for op in graph.ops[start:]:  # shared with later runs: a kernel writing into its input fails here
            for name in op.outputs:
                tensors[name].flags.writeable = False
        self.current.tensors[sample] = tensors
        return tensors

    def end(self) -> None:
        """Keep the current run (unless it is too large) beside the one it resumed from."""
        run_, self.current = self.current, None
        size = sum(v.nbytes for t in run_.tensors.values() for v in t.values())
        if size > RERUN_CACHE_BYTES:
            return
        others = [r for r in self.kept if r is self.source] + [r for r in self.kept if r is not self.source]
        self.kept = [run_, *others][:RUNS_KEPT]
