"""The closed op vocabulary of the IR: one attribute dataclass and one shape rule per op kind.

`OPS[kind]` says what an op kind is; the frontend may only create these kinds, passes may rely on their
fields, and `infer_op` gives an op's output shapes and dtypes from its inputs (used when ops are added and
again by `Graph.verify`). Fused activations live in the `act` field of the ops that can carry one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import UserError

Shape = tuple[int, ...]


@dataclass(eq=False)  # an op is an entity: two ops are equal only if they are the same op
class Op:
    """One node of the IR: a kind of OPS, the tensor names it reads and writes, its attributes."""

    name: str
    kind: str
    inputs: list[str]
    outputs: list[str]
    attrs: Any = None


# ---------------------------------------------------------------------------------------------------------
# Attribute dataclasses
# ---------------------------------------------------------------------------------------------------------

ACTIVATION_KINDS = (
    "relu", "leaky_relu", "clip", "sigmoid", "tanh", "hard_sigmoid", "hard_swish", "gelu", "erf", "elu",
    "sqrt", "exp", "log", "reciprocal", "neg", "abs",
)  # fmt: skip


@dataclass(frozen=True)
class Activation:
    """An elementwise activation: relu6 is clip(0, 6); hard_sigmoid is clip(alpha*x + beta, 0, 1)."""

    kind: str
    alpha: float = 0.0  # leaky_relu slope, hard_sigmoid/elu alpha
    beta: float = 0.0  # hard_sigmoid beta
    lo: float = -np.inf  # clip bounds
    hi: float = np.inf
    approximate: str = "none"  # gelu: "none" (erf) or "tanh"

    def __post_init__(self) -> None:
        if self.kind not in ACTIVATION_KINDS:
            raise ValueError(f"unknown activation kind {self.kind!r}")


@dataclass
class Conv2d:
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    dilations: tuple[int, int] = (1, 1)
    group: int = 1
    act: Activation | None = None


@dataclass
class ConvTranspose2d:
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # cropped from the full output: top, left, bottom, right
    dilations: tuple[int, int] = (1, 1)
    group: int = 1
    output_padding: tuple[int, int] = (0, 0)
    act: Activation | None = None


@dataclass
class Pool2d:
    mode: str  # "max" | "avg"
    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilations: tuple[int, int] = (1, 1)
    ceil_mode: bool = False
    count_include_pad: bool = False
    act: Activation | None = None


@dataclass
class GlobalPool:
    mode: str  # "max" | "avg"


@dataclass
class Eltwise:
    """N-ary elementwise arithmetic with numpy broadcasting: add, sub, mul, div, max, min, pow."""

    kind: str
    act: Activation | None = None


@dataclass
class Gemm:
    """y = act(alpha * op(A) @ op(B) + beta * C); op() transposes when trans_* is set."""

    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    act: Activation | None = None


@dataclass
class MatMul:
    act: Activation | None = None


@dataclass
class ActivationOp:
    act: Activation


@dataclass
class PRelu:
    """y = x if x >= 0 else slope * x, slope broadcast (usually per channel) from the second input."""


@dataclass
class ChannelScale:
    """y = x * scale[c] + bias[c] along `axis`: a standalone (inference) BatchNormalization."""

    axis: int = 1
    act: Activation | None = None


@dataclass
class LayerNorm:
    """y = (x - mean) / sqrt(var + epsilon) * scale + bias over the axes from `axis` on (scale, bias: inputs)."""

    axis: int = -1
    epsilon: float = 1e-5


@dataclass
class Softmax:
    axis: int = -1
    coerce_2d: bool = False  # opset < 13: flatten to 2-D at `axis` before normalising


@dataclass
class Concat:
    axis: int


@dataclass
class Reshape:
    shape: tuple[int, ...]


@dataclass
class Transpose:
    perm: tuple[int, ...]


@dataclass
class Slice:
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    axes: tuple[int, ...]
    steps: tuple[int, ...]


@dataclass
class Recurrent:
    """An ONNX LSTM or GRU over a whole sequence (layout 0: [seq, batch, features]).

    Inputs [X, W, R, B, initial_h] (+ initial_c and peepholes P for an LSTM), all present (the frontend makes
    zeros for the optional ones); outputs [Y (seq, directions, batch, hidden), Y_h] (+ Y_c). Gate order as
    ONNX: LSTM i, o, f, c; GRU z, r, h. Default activations only (sigmoid, tanh)."""

    cell: str  # "lstm" | "gru"
    hidden: int
    direction: str = "forward"  # forward | reverse | bidirectional
    clip: float | None = None  # pre-activation clip of every gate
    linear_before_reset: bool = False  # GRU: apply the reset gate after the recurrent matmul

    @property
    def directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1


@dataclass
class Split:
    axis: int
    sizes: tuple[int, ...]


@dataclass
class Pad:
    pads: tuple[int, ...]  # ONNX order: all begins, then all ends
    mode: str = "constant"  # constant | reflect | edge | wrap
    value: float = 0.0


@dataclass
class Resize:
    """Resize to a static output shape; coordinate semantics follow ONNX Resize."""

    out_shape: tuple[int, ...]
    scales: tuple[float, ...]
    mode: str = "nearest"  # nearest | linear | cubic
    coord_mode: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    roi: tuple[float, ...] = ()
    antialias: bool = False


@dataclass
class LRN:
    size: int
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0


@dataclass
class Reduce:
    kind: str  # mean | max | min | sum
    axes: tuple[int, ...]
    keepdims: bool = True


@dataclass
class Gather:
    axis: int = 0


@dataclass
class Expand:
    shape: tuple[int, ...]


@dataclass
class Cast:
    dtype: str


@dataclass
class Lut:
    """Table lookup on integer codes (quantized activations)."""

    table: np.ndarray = field(default_factory=lambda: np.zeros(256, np.int8))


# The values each enum-like string attribute may take, per op kind. Kernels look these strings up in tables
# (the tests check that the tables hold exactly these keys); a reader of a serialized graph checks a decoded
# op against them before it is run.
ATTR_CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "pool2d": {"mode": ("max", "avg")},
    "global_pool": {"mode": ("max", "avg")},
    "eltwise": {"kind": ("add", "sub", "mul", "div", "max", "min", "pow")},
    "recurrent": {"cell": ("lstm", "gru"), "direction": ("forward", "reverse", "bidirectional")},
    "pad": {"mode": ("constant", "reflect", "edge", "wrap")},
    "resize": {
        "mode": ("nearest", "linear", "cubic"),
        "coord_mode": ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                       "tf_half_pixel_for_nn", "tf_crop_and_resize"),
        "nearest_mode": ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
    },
    "reduce": {"kind": ("mean", "max", "min", "sum")},
}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Shape rules
# ---------------------------------------------------------------------------------------------------------

InferFn = Callable[[Op, list[Shape]], list[Shape]]


@dataclass(frozen=True)
class OpDef:
    kind: str
    attrs: type
    infer: InferFn
    arity: tuple[int, int]  # min and max number of inputs (max -1 = unbounded)
    keeps_dtype: bool = True  # output dtype = first input's dtype


def _conv_out(size: int, k: int, stride: int, dilation: int, pad: int) -> int:
    return (size + pad - dilation * (k - 1) - 1) // stride + 1


def _infer_conv(op: Op, s: list[Shape]) -> list[Shape]:
    a: Conv2d = op.attrs
    if len(s[0]) != 4 or len(s[1]) != 4:
        raise _shape_error(op, f"a 2-D conv takes a 4-D input and weight, not {list(s[0])} and {list(s[1])}")
    (n, c, h, w), (oc, icg, kh, kw) = s[0], s[1]
    if c != icg * a.group or oc % a.group:
        raise _shape_error(op, f"input has {c} channels but weight {list(s[1])} with group {a.group}")
    oh = _conv_out(h, kh, a.strides[0], a.dilations[0], a.pads[0] + a.pads[2])
    ow = _conv_out(w, kw, a.strides[1], a.dilations[1], a.pads[1] + a.pads[3])
    return [(n, oc, oh, ow)]


def _infer_conv_transpose(op: Op, s: list[Shape]) -> list[Shape]:
    a: ConvTranspose2d = op.attrs
    if len(s[0]) != 4 or len(s[1]) != 4:
        raise _shape_error(op, f"a 2-D transposed conv takes a 4-D input and weight, not {list(s[0])}, {list(s[1])}")
    (n, c, h, w), (icw, ocg, kh, kw) = s[0], s[1]
    if c != icw:
        raise _shape_error(op, f"input has {c} channels but weight is {list(s[1])}")
    dims = []
    for i, (size, k) in enumerate(((h, kh), (w, kw))):
        full = a.strides[i] * (size - 1) + a.output_padding[i] + (k - 1) * a.dilations[i] + 1
        dims.append(full - a.pads[i] - a.pads[i + 2])
    return [(n, ocg * a.group, dims[0], dims[1])]


def pool_out_size(size: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int, ceil: bool) -> int:
    span = size + pad_begin + pad_end - dilation * (k - 1) - 1
    out = -(-span // stride) + 1 if ceil else span // stride + 1
    # in ceil mode the last window must start inside the input or the leading padding
    if ceil and (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


def _infer_pool(op: Op, s: list[Shape]) -> list[Shape]:
    a: Pool2d = op.attrs
    n, c, h, w = s[0]
    oh = pool_out_size(h, a.kernel[0], a.strides[0], a.dilations[0], a.pads[0], a.pads[2], a.ceil_mode)
    ow = pool_out_size(w, a.kernel[1], a.strides[1], a.dilations[1], a.pads[1], a.pads[3], a.ceil_mode)
    return [(n, c, oh, ow)]


def _broadcast(op: Op, shapes: list[Shape]) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise _shape_error(op, f"inputs {[list(x) for x in shapes]} do not broadcast") from None


def _infer_gemm(op: Op, s: list[Shape]) -> list[Shape]:
    a: Gemm = op.attrs
    if len(s[0]) != 2 or len(s[1]) != 2:
        raise _shape_error(op, f"Gemm takes two matrices, got shapes {list(s[0])} and {list(s[1])}")
    m, k = s[0][::-1] if a.trans_a else s[0]
    k2, n = s[1][::-1] if a.trans_b else s[1]
    if k != k2:
        raise _shape_error(op, f"inner dimensions differ: {list(s[0])} x {list(s[1])}")
    if len(s) > 2:
        _broadcast(op, [(m, n), s[2]])
    return [(m, n)]


def _infer_matmul(op: Op, s: list[Shape]) -> list[Shape]:
    try:
        shape = np.matmul(np.empty(s[0], np.int8), np.empty(s[1], np.int8)).shape
    except ValueError:
        raise _shape_error(op, f"cannot multiply {list(s[0])} by {list(s[1])}") from None
    return [tuple(shape)]


def _infer_concat(op: Op, s: list[Shape]) -> list[Shape]:
    axis = op.attrs.axis % len(s[0])
    for other in s[1:]:
        if len(other) != len(s[0]) or any(a != b for i, (a, b) in enumerate(zip(s[0], other)) if i != axis):
            raise _shape_error(op, f"inputs {[list(x) for x in s]} differ outside axis {axis}")
    out = list(s[0])
    out[axis] = sum(x[axis] for x in s)
    return [tuple(out)]


def _infer_reshape(op: Op, s: list[Shape]) -> list[Shape]:
    if int(np.prod(op.attrs.shape)) != int(np.prod(s[0])):
        raise _shape_error(op, f"cannot reshape {list(s[0])} to {list(op.attrs.shape)}")
    return [tuple(op.attrs.shape)]


def _infer_slice(op: Op, s: list[Shape]) -> list[Shape]:
    a: Slice = op.attrs
    out = list(s[0])
    for start, end, axis, step in zip(a.starts, a.ends, a.axes, a.steps):
        out[axis] = len(range(*slice(start, end, step).indices(s[0][axis])))
    return [tuple(out)]


def _infer_split(op: Op, s: list[Shape]) -> list[Shape]:
    a: Split = op.attrs
    if sum(a.sizes) != s[0][a.axis]:
        raise _shape_error(op, f"split sizes {list(a.sizes)} do not add up to {s[0][a.axis]}")
    return [tuple(s[0][: a.axis]) + (n,) + tuple(s[0][a.axis + 1 :]) for n in a.sizes]


def _infer_recurrent(op: Op, s: list[Shape]) -> list[Shape]:
    a: Recurrent = op.attrs
    if len(s[0]) != 3:
        raise _shape_error(op, f"the sequence input is {list(s[0])}; it must be [seq, batch, features]")
    seq, batch, features = s[0]
    gates = 4 if a.cell == "lstm" else 3
    want = [(a.directions, gates * a.hidden, features), (a.directions, gates * a.hidden, a.hidden)]
    if [tuple(x) for x in s[1:3]] != want:
        raise _shape_error(op, f"W, R are {[list(x) for x in s[1:3]]}; expected {[list(w) for w in want]}")
    state = (a.directions, batch, a.hidden)
    return [(seq, a.directions, batch, a.hidden), state] + ([state] if a.cell == "lstm" else [])


def _infer_pad(op: Op, s: list[Shape]) -> list[Shape]:
    rank = len(s[0])
    pads = op.attrs.pads
    return [tuple(d + pads[i] + pads[i + rank] for i, d in enumerate(s[0]))]


def _infer_reduce(op: Op, s: list[Shape]) -> list[Shape]:
    a: Reduce = op.attrs
    if a.keepdims:
        return [tuple(1 if i in a.axes else d for i, d in enumerate(s[0]))]
    return [tuple(d for i, d in enumerate(s[0]) if i not in a.axes)]


def _infer_gather(op: Op, s: list[Shape]) -> list[Shape]:
    axis = op.attrs.axis
    return [tuple(s[0][:axis]) + tuple(s[1]) + tuple(s[0][axis + 1 :])]


def _same(op: Op, s: list[Shape]) -> list[Shape]:
    return [s[0]]


def _shape_error(op: Op, detail: str) -> UserError:
    return UserError(f"shape mismatch at op '{op.name}' ({op.kind}): {detail}")


OPS: dict[str, OpDef] = {
    d.kind: d
    for d in (
        OpDef("conv2d", Conv2d, _infer_conv, (2, 3)),
        OpDef("conv_transpose2d", ConvTranspose2d, _infer_conv_transpose, (2, 3)),
        OpDef("pool2d", Pool2d, _infer_pool, (1, 1)),
        OpDef("global_pool", GlobalPool, lambda op, s: [s[0][:2] + (1,) * (len(s[0]) - 2)], (1, 1)),
        OpDef("eltwise", Eltwise, lambda op, s: [_broadcast(op, s)], (1, -1)),
        OpDef("gemm", Gemm, _infer_gemm, (2, 3)),
        OpDef("matmul", MatMul, _infer_matmul, (2, 2)),
        OpDef("activation", ActivationOp, _same, (1, 1)),
        OpDef("prelu", PRelu, lambda op, s: [_broadcast(op, s)], (2, 2)),
        OpDef("channel_scale", ChannelScale, _same, (3, 3)),
        OpDef("softmax", Softmax, _same, (1, 1)),
        OpDef("layer_norm", LayerNorm, _same, (2, 3)),
        OpDef("concat", Concat, _infer_concat, (1, -1)),
        OpDef("reshape", Reshape, _infer_reshape, (1, 1)),
        OpDef("transpose", Transpose, lambda op, s: [tuple(s[0][p] for p in op.attrs.perm)], (1, 1)),
        OpDef("slice", Slice, _infer_slice, (1, 1)),
        OpDef("split", Split, _infer_split, (1, 1)),
        OpDef("recurrent", Recurrent, _infer_recurrent, (5, 7)),
        OpDef("pad", Pad, _infer_pad, (1, 1)),
        OpDef("resize", Resize, lambda op, s: [tuple(op.attrs.out_shape)], (1, 1)),
        OpDef("lrn", LRN, _same, (1, 1)),
        OpDef("reduce", Reduce, _infer_reduce, (1, 1)),
        OpDef("gather", Gather, _infer_gather, (2, 2)),
        OpDef("expand", Expand, lambda op, s: [_broadcast(op, [s[0], op.attrs.shape])], (1, 1)),
        OpDef("cast", Cast, _same, (1, 1), keeps_dtype=False),
        OpDef("lut", Lut, _same, (1, 1)),
    )
}


def infer_op(op: Op, tensors: Mapping[str, Any]) -> list[tuple[Shape, str]]:
    """Output (shape, dtype) pairs of `op` given the tensors it reads (`tensors`: name -> an object with
    `.shape` and `.dtype`, a graph's tensor table)."""
    opdef = OPS.get(op.kind)
    if opdef is None:
        raise UserError(f"op '{op.name}' has kind '{op.kind}', which is not in the IR vocabulary")
    if not isinstance(op.attrs, opdef.attrs):
        raise TypeError(f"op '{op.name}' ({op.kind}) needs {opdef.attrs.__name__} attrs, got {op.attrs!r}")
    lo, hi = opdef.arity
    present = [name for name in op.inputs if name]
    if len(present) < lo or (hi >= 0 and len(present) > hi):
        raise UserError(f"op '{op.name}' ({op.kind}) has {len(present)} inputs; expected {lo}..{hi}")
    in_shapes = [tensors[name].shape for name in present]
    shapes = opdef.infer(op, in_shapes)
    dtype = tensors[present[0]].dtype if opdef.keeps_dtype else op.attrs.dtype
    return [(tuple(int(d) for d in shape), dtype) for shape in shapes]


def fused_act(op: Op) -> Activation | None:
    """The activation fused into `op`, if its kind can carry one."""
    return getattr(op.attrs, "act", None)


def attrs_dict(attrs: Any) -> dict[str, Any]:
    """A plain dict of an attribute dataclass, for printing."""
    from dataclasses import asdict, is_dataclass

    return asdict(attrs) if is_dataclass(attrs) else {}
