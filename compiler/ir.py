"""The npuc IR: a Graph of Ops over named Tensors, with QuantParams once quantized.

The graph is a flat, topologically ordered list of ops. Tensors are named values; a tensor with `data` is a
constant (weights, folded shapes). Op kinds form a closed vocabulary (see `ops.py`); each op carries a typed
attribute dataclass, so a pass can rely on exactly which fields exist.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import UserError
from .ops import Op, Shape, infer_op


@dataclass
class QuantParams:
    """How a tensor's real values map to stored numbers.

    scheme: "int8_sym", "int8_asym", "uint8_asym", "int8_shift" (power-of-two), "bf16", "fp16".
    real = (stored - zero_point) * scale, per tensor (scale.ndim == 0) or per channel along `axis`.
    threshold/min/max are the calibration statistics the scale came from; multiplier/rshift are the
    fixed-point requantization factors a target lowers to, when it uses them.
    """

    scheme: str
    scale: np.ndarray = field(default_factory=lambda: np.float32(1.0))
    zero_point: np.ndarray = field(default_factory=lambda: np.int32(0))
    axis: int | None = None
    threshold: float | None = None
    min: float | None = None
    max: float | None = None
    multiplier: np.ndarray | None = None
    rshift: np.ndarray | None = None


@dataclass
class Tensor:
    name: str
    shape: Shape
    dtype: str = "float32"
    data: np.ndarray | None = None
    quant: QuantParams | None = None

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Graph:
    name: str = "graph"
    tensors: dict[str, Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    # Per-input layout of the data the user feeds ("nchw" unless a leading NHWC transpose was absorbed).
    input_layouts: dict[str, str] = field(default_factory=dict)
    # What passes tell the user about this graph (a format fallback, ...), printed by the build as notes.
    notes: list[str] = field(default_factory=list)

    # ---- construction -------------------------------------------------------------------------------
    def add_tensor(self, name: str, shape: Iterable[int], dtype: str = "float32") -> Tensor:
        tensor = Tensor(name, tuple(int(d) for d in shape), dtype)
        self.tensors[name] = tensor
        return tensor

    def add_const(self, name: str, data: np.ndarray) -> Tensor:
        data = np.asarray(data)
        tensor = Tensor(name, tuple(data.shape), str(data.dtype), data)
        self.tensors[name] = tensor
        return tensor

    def copy_sharing_constants(self) -> Graph:
        """A deep copy whose constants are read-only views of this graph's arrays: no weight bytes are copied.

        A pass working on the copy replaces a constant (add_const) rather than writing into it; a write into a
        shared array raises ValueError instead of changing this graph."""
        memo: dict[int, Any] = {}
        for tensor in self.tensors.values():
            if isinstance(tensor.data, np.ndarray) and tensor.data.dtype != object:
                view = tensor.data.view()
                view.flags.writeable = False
                memo[id(tensor.data)] = view
        return copy.deepcopy(self, memo)

    def unique_name(self, base: str) -> str:
        if base not in self.tensors:
            return base
        i = 1
        while f"{base}_{i}" in self.tensors:
            i += 1
        return f"{base}_{i}"

    def add_op(self, kind: str, inputs: list[str], outputs: list[str], attrs: Any = None, name: str = "") -> Op:
        """Append an op, inferring (and creating) its output tensors from the op's shape rule."""
        op = Op(name or outputs[0], kind, list(inputs), list(outputs), attrs)
        inferred = infer_op(op, self.tensors)
        if len(inferred) != len(outputs):
            raise UserError(f"op '{op.name}' ({kind}) is given {len(outputs)} outputs but makes {len(inferred)}; "
                            "remove the extra outputs from the node")  # fmt: skip
        for out, (shape, dtype) in zip(outputs, inferred, strict=True):
            self.add_tensor(out, shape, dtype)
        self.ops.append(op)
        return op

    # ---- queries ------------------------------------------------------------------------------------
    def const(self, name: str) -> np.ndarray | None:
        tensor = self.tensors.get(name)
        return None if tensor is None else tensor.data

    def shape(self, name: str) -> Shape:
        return self.tensors[name].shape

    def producers(self) -> dict[str, Op]:
        return {out: op for op in self.ops for out in op.outputs}

    def consumers(self) -> dict[str, list[Op]]:
        users: dict[str, list[Op]] = {}
        for op in self.ops:
            for name in op.inputs:
                if name:
                    users.setdefault(name, []).append(op)
        return users

    def iter_ops(self, kind: str) -> Iterator[Op]:
        return (op for op in list(self.ops) if op.kind == kind)

    # ---- rewriting ----------------------------------------------------------------------------------
    def replace_uses(self, old: str, new: str) -> None:
        """Point every consumer (and graph output) of `old` at `new`."""
        for op in self.ops:
            op.inputs = [new if name == old else name for name in op.inputs]
        self.outputs = [new if name == old else name for name in self.outputs]

    def remove_op(self, op: Op) -> None:
        self.ops.remove(op)

    def prune(self) -> None:
        """Drop ops whose outputs nobody uses, and tensors nothing references."""
        needed = set(self.outputs)
        kept: list[Op] = []
        for op in reversed(self.ops):
            if any(out in needed for out in op.outputs):
                kept.append(op)
                needed.update(name for name in op.inputs if name)
        self.ops = kept[::-1]
        referenced = needed | set(self.inputs) | {out for op in self.ops for out in op.outputs}
        self.tensors = {name: t for name, t in self.tensors.items() if name in referenced}

    # ---- checking -----------------------------------------------------------------------------------
    def verify(self) -> None:
        """Check structure and shapes; raise UserError naming the first problem found."""
        defined = {name for name, t in self.tensors.items() if t.is_const} | set(self.inputs)
        for name in self.inputs:
            if name not in self.tensors:
                raise UserError(f"graph input '{name}' has no tensor; the model is malformed")
        produced = {out: op for op in self.ops for out in op.outputs}
        for op in self.ops:
            for name in op.inputs:
                if not name:
                    continue
                if name not in self.tensors:
                    raise UserError(f"op '{op.name}' ({op.kind}) reads '{name}', which no op or input defines")
                if name not in defined:
                    if name in produced:
                        raise UserError(
                            f"op '{op.name}' ({op.kind}) reads '{name}' before it is produced: the graph "
                            "has a cycle or is out of order"
                        )
                    raise UserError(f"op '{op.name}' ({op.kind}) reads '{name}', which nothing produces")
            for out, (shape, _dtype) in zip(op.outputs, infer_op(op, self.tensors), strict=True):
                declared = self.tensors.get(out)
                if declared is None:
                    raise UserError(f"op '{op.name}' output '{out}' has no tensor")
                if tuple(declared.shape) != tuple(shape):
                    raise UserError(
                        f"shape mismatch at op '{op.name}' ({op.kind}): output '{out}' is declared "
                        f"{list(declared.shape)} but the inputs give {list(shape)}"
                    )
                if out in defined:
                    raise UserError(f"tensor '{out}' is defined twice (second time by op '{op.name}')")
                defined.add(out)
        for name in self.outputs:
            if name not in defined:
                raise UserError(f"graph output '{name}' is never produced")

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.kind] = counts.get(op.kind, 0) + 1
        return counts
