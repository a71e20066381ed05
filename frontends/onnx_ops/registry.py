"""Converter registry: ONNX (op_type, since_version) → a function that emits IR ops.

A converter registered at since_version V handles every opset whose schema for that op was introduced at V or
later, until the next registered version takes over. `const_inputs` lists the input positions that must be
constants once shapes are pinned (shape arguments, pads, scales...); the loader checks them up front so the
error names every offending node at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npuc.compiler.errors import UnsupportedError
from npuc.compiler.ir import Graph, Op


@dataclass(frozen=True)
class Converter:
    op_type: str
    since_version: int
    fn: Callable[[ConvertContext], None]
    const_inputs: tuple[int, ...] = ()


_CONVERTERS: dict[str, list[Converter]] = {}


def converter(op_type: str, since_version: int = 1, const_inputs: tuple[int, ...] = ()) -> Callable:
    def register(fn: Callable[[ConvertContext], None]) -> Callable[[ConvertContext], None]:
        entries = _CONVERTERS.setdefault(op_type, [])
        entries.append(Converter(op_type, since_version, fn, const_inputs))
        entries.sort(key=lambda c: c.since_version)
        return fn

    return register


def find_converter(op_type: str, domain: str, opset: int) -> Converter | None:
    """The converter for `op_type` as defined at `opset`, or None when npuc has none."""
    if domain not in ("", "ai.onnx") or op_type not in _CONVERTERS:
        return None
    try:
        since = onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        return None
    chosen = None
    for entry in _CONVERTERS[op_type]:
        if entry.since_version <= since:
            chosen = entry
    return chosen


def supported_op_types() -> list[str]:
    return sorted(_CONVERTERS)


def _same_kind(value: Any, default: Any) -> bool:
    """Whether an attribute value has the kind its default has (numbers, text, a list of numbers); graphs and
    other protobuf messages never are. No default: anything but a protobuf message."""
    if hasattr(value, "SerializeToString") or (isinstance(value, list) and any(hasattr(v, "SerializeToString")
                                                                                for v in value)):  # fmt: skip
        return False
    if default is None or value is default:
        return True
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value)
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return isinstance(value, (int, float))
    if isinstance(default, str):
        return isinstance(value, str)
    return True


class ConvertContext:
    """What a converter sees: the node, its opset, and the IR graph being built."""

    def __init__(self, graph: Graph, node: onnx.NodeProto, opset: int) -> None:
        self.graph = graph
        self.node = node
        self.opset = opset
        self.attrs: dict[str, Any] = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    # ---- reading the node ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.node.name or (self.node.output[0] if self.node.output else self.node.op_type)

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        if not _same_kind(value, default):
            raise self.unsupported(f"attribute '{name}' is {type(value).__name__}, not like {default!r}",
                                   "the model is damaged; re-export it")  # fmt: skip
        return value

    def input(self, i: int) -> str:
        """Name of input i, or "" when it is absent (optional inputs may be empty strings)."""
        return self.node.input[i] if i < len(self.node.input) else ""

    @property
    def inputs(self) -> list[str]:
        return [name for name in self.node.input if name]

    def output(self, i: int = 0) -> str:
        return self.node.output[i]

    def shape(self, i: int) -> tuple[int, ...]:
        return self.graph.shape(self.input(i))

    def rank(self, i: int = 0) -> int:
        return len(self.shape(i))

    def const(self, i: int, default: Any = None) -> np.ndarray | None:
        """The constant value of input i (None/default if absent); raises if present but not constant."""
        name = self.input(i)
        if not name:
            return default
        data = self.graph.const(name)
        if data is None:
            raise self.unsupported(
                f"input {i} ('{name}') must be a constant once input shapes are pinned",
                "pin dynamic dims with --input-shape so it folds to a constant",
            )
        return data

    def ints(self, i: int, default: Any = None) -> list[int] | None:
        data = self.const(i)
        return default if data is None else [int(v) for v in np.asarray(data).reshape(-1)]

    # ---- building ---------------------------------------------------------------------------------------
    def emit(self, kind: str, inputs: list[str], attrs: Any, outputs: list[str] | None = None) -> Op:
        outs = list(outputs if outputs is not None else [o for o in self.node.output if o])
        return self.graph.add_op(kind, inputs, outs, attrs, name=self.name)

    def emit_const(self, value: np.ndarray, output: str | None = None) -> None:
        self.graph.add_const(output or self.output(0), np.asarray(value))

    def alias(self, source: str, output: str | None = None) -> None:
        """Make the node's output the same value as `source` (identity-like nodes)."""
        from npuc.compiler.ops import Reshape

        target = output or self.output(0)
        data = self.graph.const(source)
        if data is not None:
            self.graph.add_const(target, data)
        else:
            self.emit("reshape", [source], Reshape(self.graph.shape(source)), [target])

    def temp(self, suffix: str) -> str:
        return self.graph.unique_name(f"{self.output(0)}__{suffix}")

    def unsupported(
        self, detail: str, fix: str = "change the model or export it without this feature"
    ) -> UnsupportedError:
        return UnsupportedError(f"node '{self.name}' ({self.node.op_type}, opset {self.opset}): {detail}; {fix}")

    def axis(self, value: int, rank: int | None = None) -> int:
        rank = self.rank(0) if rank is None else rank
        if not -rank <= value < rank:
            raise self.unsupported(f"axis {value} is out of range for rank {rank}")
        return value % rank
