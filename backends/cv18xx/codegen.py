"""Code generation driver: walks the quantized ops of a TPU routine and lets each op's kernel emit descriptors.

A kernel (registered per IR op kind with `@kernel`) reads its operands from global memory, tiles them through
local memory and writes its result back (specs/cv18xx.md §3.3: 32 KiB per lane, 16-byte EU alignment).
Kernels get everything from `Codegen`: the chip, the stream, the weight area and the memory plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from npuc.backends.cv18xx.chips import ChipSpec
from npuc.backends.cv18xx.emit import CmdStream
from npuc.backends.cv18xx.lmem import GTensor, LocalAllocator
from npuc.backends.cv18xx.memplan import MemoryPlan
from npuc.backends.cv18xx.weights import WeightArea, bf16_bits
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op
from npuc.compiler.kernels.quantized.params import OpQuant, op_quant

FMT_OF_DTYPE = {"int8": "i8", "bf16": "bf16", "float32": "f32"}


@dataclass
class Codegen:
    chip: ChipSpec
    graph: Graph
    plan: MemoryPlan
    fmt: dict[str, str]  # tensor -> "int8" | "bf16" | "float32"
    stream: CmdStream = None  # type: ignore[assignment]
    weights: WeightArea = field(default_factory=WeightArea)
    top_aligned: bool = False  # lay this unit's local memory out against the top of the lane (group_plan.py)
    compress_weights: bool = False  # store filters VLC-compressed where that is smaller (weights.py)

    def __post_init__(self) -> None:
        if self.stream is None:
            self.stream = CmdStream(self.chip)

    def gtensor(self, name: str, shape: tuple[int, ...] | None = None) -> GTensor:
        """The tensor's bytes in gmem viewed as a contiguous 4-D tensor (default: its shape padded to 4-D); a
        constant operand is placed in the weight area (int8 codes, or bf16 bits of a float constant)."""
        if self.graph.tensors[name].is_const:
            data = self.graph.const(name)
            dims = shape or to4d(data.shape)
            if data.dtype == np.int8:
                return self.weights.add(name, data.reshape(dims)).reshaped(dims)
            return self.weights.add(name, bf16_bits(data).reshape(dims), "bf16").reshaped(dims)
        place = self.plan.places[name]
        fmt = {"int8": "i8", "uint8": "u8", "bf16": "bf16", "float32": "bf16"}[self.fmt[name]]
        dims = shape or to4d(self.graph.shape(name))
        if self.fmt[name] == "float32":  # fp32 words are moved as pairs of bf16
            dims = (*dims[:3], dims[3] * 2)
        return GTensor.contiguous(place.region, place.offset, dims, fmt)

    def local(self, op: Op) -> LocalAllocator:
        return LocalAllocator(self.chip, op_where(op))

    def local_named(self, what: str) -> LocalAllocator:
        return LocalAllocator(self.chip, what)

    def const(self, name: str) -> np.ndarray:
        data = self.graph.const(name)
        if data is None:
            raise UserError(f"input '{name}' must be a constant for the cv18xx target")
        return data


def to4d(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """NCHW view of any rank: rank < 4 appends 1s (N, C[, H]); rank > 4 folds the tail into W."""
    dims = list(shape) or [1]
    if len(dims) > 4:
        dims = [*dims[:3], int(np.prod(dims[3:]))]
    return tuple(dims + [1] * (4 - len(dims)))  # type: ignore[return-value]


Kernel = Callable[[Codegen, Op], None]
KERNELS: dict[str, Kernel] = {}


def kernel(*kinds: str) -> Callable[[Kernel], Kernel]:
    def wrap(fn: Kernel) -> Kernel:
        for k in kinds:
            KERNELS[k] = fn
        return fn

    return wrap


def quant_of(op: Op) -> OpQuant:
    return op_quant(op)


def fused_relu(op: Op) -> tuple[bool, int | None]:
    """(relu, int8 upper clamp) of the op's fused activation."""
    act = getattr(op.attrs, "act", None)
    relu = act is not None and act.kind in ("relu", "clip")
    q = getattr(op.attrs, "quant", None)
    return relu, (q.relu_max if q is not None else None)


def no_kernel(op: Op, what: str) -> UserError:
    """The error for an op the cv18xx cannot run: it names the node and says what the user can do."""
    q = getattr(op.attrs, "quant", None)
    fix = "build for another target (see `npuc targets`)"
    if q is not None and q.mode == "int8":
        fix = f"keep it in bf16 with --float-layers {op.name}, {fix}"
    return UserError(f"op '{op.name}' ({op.kind}): {what} has no cv18xx kernel; {fix}, or replace it in the model")


def does_not_fit(where: str, what: str, chip: ChipSpec) -> UserError:
    """The error for a layer no tiling fits in local memory (`where`: the op, named)."""
    return UserError(
        f"{where}: {what} does not fit in the {chip.name}'s local memory ({chip.lmem_size} bytes per lane) however "
        "it is tiled; the model cannot fit this chip as it is: make the layer smaller (narrower rows, fewer "
        "channels) or build for another target"
    )


def op_where(op: Op) -> str:
    return f"op '{op.name}' ({op.kind})"
