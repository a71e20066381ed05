"""Reference execution of an IR graph: run each op's kernel in order over numpy arrays.

`run` takes the kernel registry as an argument, so the float kernels (default) and a quantized
registry share the same driver: feed checking, constant lookup and freeing of dead intermediates.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .errors import UserError
from .ir import Graph, Op
from .kernels import FLOAT_KERNELS, KernelFn

# How a user-facing input layout maps onto the graph's NCHW input tensor.
_FROM_LAYOUT = {"nchw": None, "nhwc": (0, 3, 1, 2)}


def external_shape(graph: Graph, name: str) -> tuple[int, ...]:
    """The shape a user feeds for input `name` (its declared layout, e.g. NHWC for absorbed transposes)."""
    shape = graph.tensors[name].shape
    perm = _FROM_LAYOUT[graph.input_layouts.get(name, "nchw")]
    return shape if perm is None else tuple(shape[perm.index(i)] for i in range(len(shape)))


def to_graph_layout(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Transpose feeds given in each input's declared layout into the graph's internal layout (any batch: the
    calibration passes stack samples along axis 0)."""
    out = {}
    for name, value in feeds.items():
        perm = _FROM_LAYOUT[graph.input_layouts.get(name, "nchw")]
        value = np.asarray(value)
        fed = external_shape(graph, name) if perm is not None and name in graph.tensors else None
        if fed is not None and value.ndim == len(fed) and value.shape[1:] == fed[1:]:
            value = np.ascontiguousarray(value.transpose(perm))
        out[name] = value
    return out


def check_feeds(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds as arrays, after checking that names, shapes and dtypes match the graph inputs."""
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise UserError(f"feed '{unknown[0]}' is not a graph input; the inputs are {graph.inputs}")
    arrays: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in feeds:
            raise UserError(f"graph input '{name}' has no feed; pass an array for every input {graph.inputs}")
        tensor = graph.tensors[name]
        value = np.asarray(feeds[name])
        if tuple(value.shape) != tuple(tensor.shape):
            layout = graph.input_layouts.get(name, "nchw")
            raise UserError(
                f"input '{name}': expected shape {list(external_shape(graph, name))} ({layout}), given "
                f"{list(value.shape)}; feed an array of the model's input shape"
            )
        if str(value.dtype) != tensor.dtype:
            raise UserError(
                f"input '{name}': expected dtype {tensor.dtype}, given {value.dtype}; "
                f"convert it with .astype('{tensor.dtype}')"
            )
        arrays[name] = value
    return arrays


def last_uses(graph: Graph) -> dict[str, int]:
    """For each tensor an op reads, the index of the last op reading it."""
    last: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        for name in op.inputs:
            if name:
                last[name] = i
    return last


def _run_op(op: Op, kernel: KernelFn, args: list[np.ndarray], graph: Graph) -> list[np.ndarray]:
    outs = kernel(op, args)
    if len(outs) != len(op.outputs):
        raise RuntimeError(f"kernel for {op.kind} returned {len(outs)} outputs for op '{op.name}'")
    for name, value in zip(op.outputs, outs, strict=True):
        declared = graph.tensors[name]
        if tuple(value.shape) != tuple(declared.shape) or str(value.dtype) != declared.dtype:
            raise RuntimeError(
                f"op '{op.name}' ({op.kind}) produced {name} as {value.dtype}{list(value.shape)}, "
                f"but the graph declares {declared.dtype}{list(declared.shape)}"
            )
    return outs


def run(
    graph: Graph,
    feeds: Mapping[str, np.ndarray],
    *,
    keep_all: bool = False,
    kernels: Mapping[str, KernelFn] = FLOAT_KERNELS,
    start: int = 0,
    known: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Execute `graph` on `feeds` (each in its input's declared layout); return its outputs, or (keep_all)
    also every input and op output. `start`, `known`: resume at op `start`, taking what ops[:start] made from
    `known` (an earlier keep_all run of a graph whose first `start` ops are the same)."""
    env: dict[str, np.ndarray] = dict(check_feeds(graph, to_graph_layout(graph, feeds)))
    if start:
        env.update((name, known[name]) for op in graph.ops[:start] for name in op.outputs)
    last = last_uses(graph)
    keep = set(graph.outputs)

    def value(name: str) -> np.ndarray:
        if name in env:
            return env[name]
        tensor = graph.tensors.get(name)
        if tensor is not None and tensor.data is not None:
            return tensor.data
        raise UserError(f"tensor '{name}' is read before anything produces it; the graph is out of order")

    for i, op in enumerate(graph.ops[start:], start):
        kernel = kernels.get(op.kind)
        if kernel is None:
            raise UserError(f"op '{op.name}': no kernel for op kind '{op.kind}' in this execution mode")
        args = [value(name) for name in op.inputs if name]
        env.update(zip(op.outputs, _run_op(op, kernel, args, graph), strict=True))
        if not keep_all:
            # Free what no later op reads: this op's dead outputs and inputs read for the last time.
            for name in [*op.inputs, *op.outputs]:
                if name in env and name not in keep and last.get(name, -1) <= i:
                    del env[name]
    outputs = {name: value(name) for name in graph.outputs}
    return {**env, **outputs} if keep_all else outputs
