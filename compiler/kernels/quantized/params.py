"""What a quantized op carries: its execution mode and the integer (or bf16) parameters of its kernel.

The IR's attribute dataclasses are closed per op kind, so a quantized op keeps its attributes and gains one
field, `quant`, through a subclass made once per attribute class (isinstance checks in `ops.infer_op`
still pass). Kernels read everything from `op.attrs.quant`; nothing is looked up in the graph at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from ...ir import Op, QuantParams
from ...ops import OPS

MODES = ("int8", "bf16", "cast")


@dataclass
class OpQuant:
    """Execution parameters of one quantized op.

    mode: "int8" (cv18xx integer arithmetic), "bf16" (every result rounded to bf16), or "cast" (a format
    conversion between `inputs[0]` and `output`).
    inputs/output: the number format of each activation input and of the output (QuantParams; None for a
    float32 tensor). multiplier/rshift: per-channel QDM factors (conv/gemm), per-input int8 multipliers with
    one shared rshift (eltwise add/sub/max/min, concat), or a single pair (pool, mul). lut: 256 int8
    entries indexed by the input byte (q & 0xFF). relu_max: int8 upper clamp of a fused relu6, if any.
    position_multiplier/position_rshift: (oh, ow) int8 pairs of an average pool whose windows count different
    numbers of cells (one per output position, from its count); multiplier/rshift then hold the kh·kw pair.
    """

    mode: str
    inputs: tuple[QuantParams | None, ...] = ()
    output: QuantParams | None = None
    multiplier: np.ndarray | None = None
    rshift: np.ndarray | None = None
    lut: np.ndarray | None = None
    relu_max: int | None = None
    position_multiplier: np.ndarray | None = None
    position_rshift: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown quantized mode {self.mode!r}")


def _quant_subclass(cls: type) -> type:
    return dataclasses.make_dataclass(
        f"Quantized{cls.__name__}", [("quant", OpQuant | None, field(default=None))], bases=(cls,)
    )


# One subclass per IR attribute class, built at import time and never changed.
_QUANT_ATTRS: MappingProxyType[type, type] = MappingProxyType({d.attrs: _quant_subclass(d.attrs) for d in OPS.values()})


def with_quant(attrs: Any, quant: OpQuant) -> Any:
    """A copy of `attrs` (an IR attribute dataclass) that also carries `quant`."""
    base = type(attrs)
    base = next((b for b in base.__mro__ if b in _QUANT_ATTRS), base)
    values = {f.name: getattr(attrs, f.name) for f in dataclasses.fields(base)}
    return _QUANT_ATTRS[base](**values, quant=quant)


def op_quant(op: Op) -> OpQuant:
    """The quantization parameters of `op`; a plain float op is an internal error here."""
    quant = getattr(op.attrs, "quant", None)
    if quant is None:
        raise RuntimeError(
            f"op '{op.name}' ({op.kind}) has no quantization parameters; run passes.quantization.quantize"
        )
    return quant
