"""What the DV700 lowering shares with its op handlers: the `Value` of each IR tensor, the `Lowering` state,
the LOWER registry and the run-field helpers. lower.py drives it; lower_*.py register the handlers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op

from .layers import ConvConf, Layer, Run
from .validate import Hardware

MEM_ALIGN = 16


@dataclass
class Value:
    """A tensor in the io buffer. dims are (W, H, C); layout 'whc8' (fp16) or 'hwc' (CPU layer output)."""

    buf: int
    dims: tuple[int, int, int]
    layout: str = "whc8"
    dtype: str = "float16"
    view: str = "nchw"
    perm: np.ndarray | None = None  # flat views: buffer position of each graph element
    layer: int | None = None  # producing layer (None: the network input)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.dims)) * np.dtype(self.dtype).itemsize


@dataclass
class RunWeights:
    """A run's float weights, packed once the layer table is final."""

    weight: np.ndarray  # (M, C/group, kh, kw)
    bias: np.ndarray
    prelu: np.ndarray | None = None
    dilated: bool = False
    fp16_only: bool = False


@dataclass
class LayerRefs:
    input: int
    output: int
    eltwise: int | None = None
    params: dict[str, int] = field(default_factory=dict)  # custom param name -> buffer id


@dataclass
class Lowering:
    graph: Graph
    quantized: bool
    hw: Hardware = field(default_factory=Hardware)
    layers: list[Layer] = field(default_factory=list)
    refs: list[LayerRefs] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)  # bytes per buffer id
    run_weights: dict[int, RunWeights] = field(default_factory=dict)  # id(run) -> weights
    consumed: set[str] = field(default_factory=set)  # ops absorbed into an earlier run
    parents: dict[int, tuple[int, int]] = field(default_factory=dict)  # buffer -> (enclosing buffer, byte offset)
    views: set[int] = field(default_factory=set)  # buffers that are channel views (no layer writes them)
    _consumers: dict[str, list[Op]] | None = field(default=None, repr=False)

    # ---- helpers used by the op handlers --------------------------------------------------------------
    def new_buffer(self, nbytes: int) -> int:
        self.sizes.append(int(nbytes))
        return len(self.sizes) - 1

    def value(self, op: Op, index: int = 0) -> Value:
        name = op.inputs[index]
        if name not in self.values:
            raise UserError(f"op '{op.name}' ({op.kind}): input '{name}' is not an activation DMP can address")
        return self.values[name]

    def const(self, name: str) -> np.ndarray | None:
        return self.graph.const(name)

    def consumers(self) -> dict[str, list[Op]]:
        """Tensor -> the ops reading it, built once: lowering reads the graph but never changes it (a 5000-layer
        chain spent a minute rebuilding this map per query)."""
        if self._consumers is None:
            self._consumers = self.graph.consumers()
        return self._consumers

    def sole_user(self, name: str) -> Op | None:
        if name in self.graph.outputs:
            return None
        users = self.consumers().get(name, [])
        return users[0] if len(users) == 1 else None

    def add_layer(self, layer: Layer, src: Value, out: Value, eltwise: Value | None = None, **params: Value) -> int:
        index = len(self.layers)
        layer.input_dim = list(src.dims)
        layer.output_dim = list(out.dims)
        layer.output_size = out.nbytes
        # The input is in the FPGA layout (the network input of a conv layer is prepared on the CPU, so not).
        layer.is_input_hw_layout = src.layout == "whc8" and not (src.layer is None and layer.type == "LT_CONV")
        self.layers.append(layer)
        self.refs.append(
            LayerRefs(src.buf, out.buf, eltwise.buf if eltwise else None, {k: v.buf for k, v in params.items()})
        )
        out.layer = index
        return index

    def conv_layer(self, name: str, src: Value, runs: list[Run], dims: tuple[int, int, int], ops: list[str]) -> Value:
        out = Value(self.new_buffer(int(np.prod(dims)) * 2), dims)
        conf = ConvConf(w=src.dims[0], h=src.dims[1], c=src.dims[2], runs=runs, topo=1 << (len(runs) - 1))
        layer = Layer(name, "LT_CONV", 0, 0, 0, [], [], conv=conf, ops=ops)
        self.add_layer(layer, src, out)
        return out


Handler = Callable[[Lowering, Op], None]
LOWER: dict[str, Handler] = {}


def lowers(*kinds: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for kind in kinds:
            LOWER[kind] = fn
        return fn

    return register


def set_act(run: Run, code: int, param: float = 0.0) -> None:
    run.actfunc = code
    run.actfunc_param = int(np.float16(param).view(np.uint16)) if param else 0


def fp16_bits(x: float) -> int:
    return int(np.float16(x).view(np.uint16))
