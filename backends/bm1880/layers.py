"""The records of the BM1880 int8 lowering: layers, the lowered net, and the context lowerings write to.

quantize.py (the original op families) and lower_moves.py (data moves and lookups) both fill a LoweredNet
through a LowerContext; kernels, groups and codegen read the Layer records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npuc.compiler.errors import UnsupportedError, UserError
from npuc.compiler.ir import Graph, Op

Shape4 = tuple[int, int, int, int]


@dataclass
class Layer:
    """One BM1880 kernel invocation over int8 tensors (4-D views) with its integer parameters."""

    name: str
    kind: str  # conv | dwconv | pool | act | eltwise | concat | copy | upsample | interleave | lut | mul
    inputs: tuple[str, ...]
    output: str
    mode: str = ""  # pool: max/avg; act: relu/leaky/prelu; eltwise: add/max
    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, bottom, left, right
    dilations: tuple[int, int] = (1, 1)
    weight: np.ndarray | None = None  # int8: conv (oc, ic, kh, kw), dwconv (c, kh, kw), prelu slopes (c,),
    # lut: the 256 output codes indexed by the input's byte (code & 0xFF)
    bias: np.ndarray | None = None  # int16 (oc,)
    rshift: int = 0
    relu: bool = False
    multipliers: tuple[int, ...] = ()  # pool/concat/eltwise: per input; act: (gt_scale, le_scale)
    shifts: tuple[int, ...] = ()  # concat: per input; act: (gt_shift, le_shift)
    offsets: tuple[int, int, int, int] = (0, 0, 0, 0)  # copy: first element read, per NCHW axis
    steps: tuple[int, int, int, int] = (1, 1, 1, 1)  # copy: read step per input axis; upsample, interleave:
    # (1, 1, sh, sw)
    perm: tuple[int, int, int, int] = (0, 1, 2, 3)  # copy: the input axis each output axis walks (transpose)
    # conv/dwconv with per-channel gains: u8 2^(7-k) per output channel; the conv BD writes 16 bits and a
    # multiply by the gain, shifted right by gain_shift (7; less for weights beyond int8), gives int8 (weights
    # and bias scaled by 2^k, see lower_gains.py)
    gains: np.ndarray | None = None
    gain_shift: int = 7

    @property
    def outputs(self) -> list[str]:
        """The op-record interface passes/lowering/layer_group.py reads."""
        return [self.output]


@dataclass
class LoweredNet:
    """The int8 network: tensors (4-D view, threshold, gmem storage owner) and layers in program order."""

    name: str
    inputs: list[str]
    outputs: list[str]
    shapes: dict[str, Shape4]
    thresholds: dict[str, float]
    storage: dict[str, str]  # tensor -> the tensor whose gmem bytes it is (itself, or a reshape's source)
    ir_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the graph's own shapes
    layers: list[Layer] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    host_ops: list[str] = field(default_factory=list)  # the tail left to the host, "name (kind)" each


def as_4d(shape: tuple[int, ...], where: str) -> Shape4:
    """The NCHW view of an activation: (N,K) -> (N,K,1,1), (N,C,L) -> (N,C,1,L), (K,) -> (1,K,1,1)."""
    views = {1: lambda s: (1, s[0], 1, 1), 2: lambda s: (s[0], s[1], 1, 1), 3: lambda s: (s[0], s[1], 1, s[2])}
    if len(shape) == 4:
        return tuple(int(d) for d in shape)
    if len(shape) in views:
        return tuple(int(d) for d in views[len(shape)](shape))
    raise UnsupportedError(f"{where}: tensor of rank {len(shape)} has no BM1880 NCHW layout; reshape it to 4-D")


@dataclass
class LowerContext:
    graph: Graph
    net: LoweredNet
    producers: dict[str, Op]
    source: str = "--calib"
    channel_gains: bool = False  # weight_scale=channel: per-channel power-of-two weight gains
    absorbed: set[str] = field(default_factory=set)  # ops an earlier lowering folded in (a bias Add)

    def t(self, name: str) -> float:
        if name not in self.net.thresholds:
            raise UserError(
                f"{self.source}: no threshold for tensor '{name}'; calibrate the model again with this graph"
            )
        return self.net.thresholds[name]

    def const(self, op: Op, index: int) -> np.ndarray | None:
        if index >= len(op.inputs) or not op.inputs[index]:
            return None
        data = self.graph.const(op.inputs[index])
        if data is None:
            raise UnsupportedError(
                f"op '{op.name}' ({op.kind}): input {index} '{op.inputs[index]}' must be a constant for BM1880"
            )
        return np.asarray(data, np.float32)

    def add(self, layer: Layer) -> None:
        self.net.layers.append(layer)

    def add_tensor(self, name: str, shape: Shape4, threshold: float, storage: str | None = None) -> str:
        """A tensor the lowering makes (not the graph's): its 4-D view, its threshold and the tensor whose gmem
        bytes it is (itself unless `storage` says)."""
        self.net.shapes[name], self.net.thresholds[name] = shape, threshold
        self.net.storage[name] = storage or name
        return name


def unsupported(op: Op, what: str) -> UnsupportedError:
    return UnsupportedError(f"op '{op.name}' ({op.kind}) {what} is not supported by the bm1880 target")
