"""What every quantization rule works with: the int8/bf16 formats, the thresholds matched to the graph, the
context that rewrites the graph op by op, and a scheme (per-op-kind rules plus a fallback)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from npuc.compiler import ops
from npuc.compiler.ir import Graph, Op, QuantParams
from npuc.compiler.kernels.quantized.params import OpQuant, with_quant
from npuc.compiler.numformats.bf16_fp16 import constant_to_bf16
from npuc.compiler.numformats.cv18xx_int8 import cv18xx_quantize_activation

BF16 = QuantParams("bf16")


def int8_params(threshold: float) -> QuantParams:
    th = float(np.float32(threshold))
    return QuantParams("int8_sym", np.float32(th / 127.0), threshold=th, min=-th, max=th)


@dataclass
class ThresholdMap:
    """Thresholds keyed by IR tensor name, plus what did not match.

    pre_activation: op name -> threshold of the op's result before its fused activation (tpu-mlir calibrates
    it separately; the IR no longer names that tensor).
    """

    thresholds: dict[str, float] = field(default_factory=dict)
    pre_activation: dict[str, float] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # table names that match nothing in the graph
    missing: list[str] = field(default_factory=list)  # activation tensors the table does not cover


@dataclass
class Lowered:
    """A rule's answer: the op's new input names and its parameters."""

    inputs: list[str]
    quant: OpQuant


class QuantContext:
    """The graph under construction: formats of produced tensors, inserted casts, new constants."""

    def __init__(self, graph: Graph, thresholds: ThresholdMap) -> None:
        self.graph = graph
        self.th = thresholds
        self.formats: dict[str, QuantParams | None] = {name: None for name in graph.inputs}
        self.casts: dict[tuple[str, str], str] = {}
        self.pending: list[Op] = []  # casts to insert before the op being lowered

    def threshold(self, name: str) -> float | None:
        fmt = self.formats.get(name)
        if fmt is not None and fmt.scheme == "int8_sym":
            return fmt.threshold
        tensor = self.graph.tensors[name]
        if tensor.is_const and np.issubdtype(tensor.data.dtype, np.floating):
            peak = float(np.abs(tensor.data).max()) if tensor.data.size else 0.0
            return max(peak, 1e-5)
        return self.th.thresholds.get(name)

    def format_of(self, name: str) -> QuantParams | None:
        return self.formats.get(name)

    def as_int8(self, name: str) -> str:
        """`name` as an int8 tensor (a quantized constant, or a cast inserted when its format differs)."""
        tensor = self.graph.tensors[name]
        th = self.threshold(name)
        if tensor.is_const:
            return self.const(f"{name}_int8", cv18xx_quantize_activation(tensor.data, th), int8_params(th))
        return self._cast(name, int8_params(th))

    def as_bf16(self, name: str) -> str:
        tensor = self.graph.tensors[name]
        if tensor.is_const:
            if not np.issubdtype(tensor.data.dtype, np.floating):
                return name
            return self.const(f"{name}_bf16", constant_to_bf16(tensor.data), BF16)
        if self.formats.get(name) is None and tensor.dtype != "float32":
            return name  # integer data (indices, shapes) is not a number format
        return self._cast(name, BF16)

    def _cast(self, name: str, dst: QuantParams) -> str:
        src = self.formats.get(name)
        if src is not None and src.scheme == dst.scheme and src.threshold == dst.threshold:
            return name
        key = (name, f"{dst.scheme}:{dst.threshold}")
        if key not in self.casts:
            out = self.graph.unique_name(f"{name}_{'i8' if dst.scheme == 'int8_sym' else 'bf16'}")
            dtype = "int8" if dst.scheme == "int8_sym" else "float32"
            attrs = with_quant(ops.Cast(dtype), OpQuant("cast", (src,), dst))
            self.graph.add_tensor(out, self.graph.shape(name), dtype).quant = dst
            self.pending.append(Op(out, "cast", [name], [out], attrs))
            self.formats[out] = dst
            self.casts[key] = out
        return self.casts[key]

    def const(self, name: str, data: np.ndarray, quant: QuantParams | None) -> str:
        name = self.graph.unique_name(name)
        self.graph.add_const(name, data).quant = quant
        return name


Rule = Callable[[QuantContext, Op], Lowered | None]


@dataclass(frozen=True)
class Scheme:
    """A quantization scheme: per-op-kind rules and the scheme used for everything else."""

    name: str
    rules: Mapping[str, Rule]
    fallback: str | None = None
    keeps_act: Callable[[Op], bool] = lambda op: True  # a fused activation the scheme's ops apply themselves
