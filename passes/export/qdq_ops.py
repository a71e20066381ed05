"""ONNX nodes for each IR op kind, in float: the compute part of a QDQ model (passes/export/qdq.py).

`EMITTERS[kind](b, op, ins, out)` appends the ONNX nodes computing `op` from the float tensors `ins` into
the float tensor `out` (fused activations included). `OnnxBuilder` collects nodes and initializers with
unique names; the opset is fixed (OPSET) so attribute/input conventions are those of that opset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npuc.compiler import ops
from npuc.compiler.errors import UnsupportedError
from npuc.compiler.ir import Graph, Op
from npuc.frontends.colorspace import PreprocessAffine

OPSET = 17  # HardSwish (14), per-axis QuantizeLinear/DequantizeLinear (13), Split sizes as an input (13)


class OnnxBuilder:
    """Nodes and initializers of the model being written; names are made unique against the IR's."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.used: set[str] = set(graph.tensors)

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.initializers[name] = numpy_helper.from_array(np.ascontiguousarray(value), name)
        return name

    def node(self, op_type: str, inputs: list[str], output: str | None = None, **attrs: object) -> str:
        out = output or self.fresh(f"{inputs[0]}_{op_type}")
        self.used.add(out)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.fresh(f"{out}/{op_type}"), **attrs))
        return out


def input_value(
    b: OnnxBuilder, graph: Graph, name: str, affine: PreprocessAffine | None
) -> tuple[str, onnx.ValueInfoProto]:
    """The NCHW value of graph input `name` and the model input that feeds it: the input's type (float32, or
    integers such as token ids) in its declared layout, or (`affine`, an hb_mapper image input) int8 NHWC pixels
    (u8 - 128) through HzPreprocess."""
    shape = graph.shape(name)
    if affine is not None:
        n, _, h, w = shape
        # in float64 then rounded once to float32, as PreprocessAffine.apply computes it
        raw = b.node("Cast", [name], b.fresh(f"{name}_pixels"), to=TensorProto.DOUBLE)
        mixed = b.node("MatMul", [raw, b.const(f"{name}_hz_weight", affine.weight.T.astype(np.float64))])
        biased = b.node("Add", [mixed, b.const(f"{name}_hz_bias", affine.bias.astype(np.float64))])
        single = b.node("Cast", [biased], to=TensorProto.FLOAT)
        value = b.node("Transpose", [single], b.fresh(f"{name}_HzPreprocess"), perm=[0, 3, 1, 2])
        return value, helper.make_tensor_value_info(name, TensorProto.INT8, [n, h, w, affine.weight.shape[1]])
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(graph.tensors[name].dtype))  # token ids stay integers
    if graph.input_layouts.get(name, "nchw") == "nhwc":
        n, c, h, w = shape
        value = b.node("Transpose", [name], b.fresh(f"{name}_nchw"), perm=[0, 3, 1, 2])
        return value, helper.make_tensor_value_info(name, elem, [n, h, w, c])
    return name, helper.make_tensor_value_info(name, elem, list(shape))


# ---------------------------------------------------------------------------------------------------------
# Activations


def _clip(b: OnnxBuilder, x: str, out: str | None, act: ops.Activation) -> str:
    bounds = [b.const("clip_lo", np.float32(act.lo)) if np.isfinite(act.lo) else ""]
    bounds.append(b.const("clip_hi", np.float32(act.hi)) if np.isfinite(act.hi) else "")
    while bounds and bounds[-1] == "":
        bounds.pop()
    return b.node("Clip", [x, *bounds], out)


def _gelu(b: OnnxBuilder, x: str, out: str | None, act: ops.Activation) -> str:
    half = b.const("half", np.float32(0.5))
    one = b.const("one", np.float32(1.0))
    if act.approximate == "tanh":  # 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
        cube = b.node("Mul", [b.node("Mul", [x, x]), x])
        inner = b.node("Add", [x, b.node("Mul", [cube, b.const("c", np.float32(0.044715))])])
        core = b.node("Tanh", [b.node("Mul", [inner, b.const("k", np.float32(np.sqrt(2.0 / np.pi)))])])
    else:  # 0.5x(1 + erf(x/sqrt 2))
        core = b.node("Erf", [b.node("Mul", [x, b.const("k", np.float32(1.0 / np.sqrt(2.0)))])])
    return b.node("Mul", [b.node("Mul", [x, half]), b.node("Add", [core, one])], out)


ACTIVATIONS: Mapping[str, Callable[[OnnxBuilder, str, str | None, ops.Activation], str]] = MappingProxyType(
    {
        "relu": lambda b, x, o, a: b.node("Relu", [x], o),
        "leaky_relu": lambda b, x, o, a: b.node("LeakyRelu", [x], o, alpha=float(a.alpha)),
        "clip": _clip,
        "sigmoid": lambda b, x, o, a: b.node("Sigmoid", [x], o),
        "tanh": lambda b, x, o, a: b.node("Tanh", [x], o),
        "hard_sigmoid": lambda b, x, o, a: b.node("HardSigmoid", [x], o, alpha=float(a.alpha), beta=float(a.beta)),
        "hard_swish": lambda b, x, o, a: b.node("HardSwish", [x], o),
        "gelu": _gelu,
        "erf": lambda b, x, o, a: b.node("Erf", [x], o),
        "elu": lambda b, x, o, a: b.node("Elu", [x], o, alpha=float(a.alpha)),
    }
)


def activation(b: OnnxBuilder, x: str, out: str, act: ops.Activation | None) -> str:
    if act is None:
        return b.node("Identity", [x], out)
    return ACTIVATIONS[act.kind](b, x, out, act)


def _with_act(b: OnnxBuilder, op: Op, out: str, make: Callable[[str | None], str]) -> None:
    """Run `make` into `out` directly, or into a temporary followed by the op's fused activation."""
    act = ops.fused_act(op)
    if act is None:
        make(out)
    else:
        activation(b, make(None), out, act)


# ---------------------------------------------------------------------------------------------------------
# Op kinds


def _conv(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    a = op.attrs
    attrs = {"strides": list(a.strides), "pads": list(a.pads), "dilations": list(a.dilations), "group": a.group}
    kind = "Conv"
    if op.kind == "conv_transpose2d":
        kind, attrs["output_padding"] = "ConvTranspose", list(a.output_padding)
    _with_act(b, op, out, lambda o: b.node(kind, ins, o, **attrs))


def _pool(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    a = op.attrs
    attrs = {"kernel_shape": list(a.kernel), "strides": list(a.strides), "pads": list(a.pads)}
    attrs["ceil_mode"] = int(a.ceil_mode)
    if a.mode == "max":
        attrs["dilations"] = list(a.dilations)
    else:
        if tuple(a.dilations) != (1, 1):
            raise UnsupportedError(f"op '{op.name}': dilated average pooling cannot be exported at opset {OPSET}")
        attrs["count_include_pad"] = int(a.count_include_pad)
    _with_act(b, op, out, lambda o: b.node("MaxPool" if a.mode == "max" else "AveragePool", ins, o, **attrs))


_ELTWISE = MappingProxyType(
    {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max", "min": "Min", "pow": "Pow"}
)


def _eltwise(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    onnx_op = _ELTWISE[op.attrs.kind]

    def make(o: str | None) -> str:
        if onnx_op in ("Max", "Min") or len(ins) == 1:
            return b.node(onnx_op if len(ins) > 1 else "Identity", ins, o)
        acc = ins[0]
        for i, x in enumerate(ins[1:], start=2):
            acc = b.node(onnx_op, [acc, x], o if i == len(ins) else None)
        return acc

    _with_act(b, op, out, make)


def _gemm(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    a = op.attrs
    if op.kind == "matmul":
        _with_act(b, op, out, lambda o: b.node("MatMul", ins, o))
        return
    attrs = {"transA": int(a.trans_a), "transB": int(a.trans_b), "alpha": float(a.alpha), "beta": float(a.beta)}
    _with_act(b, op, out, lambda o: b.node("Gemm", ins, o, **attrs))


def _channel_scale(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    rank = len(b.graph.shape(op.inputs[0]))
    axis = op.attrs.axis % rank
    shape = np.array([-1] + [1] * (rank - axis - 1), np.int64)
    scale = b.node("Reshape", [ins[1], b.const("cs_shape", shape)])
    bias = b.node("Reshape", [ins[2], b.const("cs_shape", shape)])
    _with_act(b, op, out, lambda o: b.node("Add", [b.node("Mul", [ins[0], scale]), bias], o))


def _softmax(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    shape = b.graph.shape(op.inputs[0])
    axis = op.attrs.axis % len(shape)
    if not op.attrs.coerce_2d:
        b.node("Softmax", ins, out, axis=axis)
        return
    flat = b.node("Flatten", ins, axis=axis)
    soft = b.node("Softmax", [flat], axis=1)
    b.node("Reshape", [soft, b.const("shape", np.array(shape, np.int64))], out)


def _reshape_to_output(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    b.node("Reshape", [ins[0], b.const("shape", np.array(b.graph.shape(op.outputs[0]), np.int64))], out)


def _slice(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    a = op.attrs
    args = [
        b.const(k, np.array(v, np.int64))
        for k, v in (("starts", a.starts), ("ends", a.ends), ("axes", a.axes), ("steps", a.steps))
    ]
    b.node("Slice", [ins[0], *args], out)


def _split(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    raise UnsupportedError(f"op '{op.name}' (split) has several outputs; QDQ export of split is not supported")


def _pad(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    a = op.attrs
    value = b.const("pad_value", np.float32(a.value))
    b.node("Pad", [ins[0], b.const("pads", np.array(a.pads, np.int64)), value], out, mode=a.mode)


def _resize(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    a = op.attrs
    attrs = {
        "mode": a.mode,
        "coordinate_transformation_mode": a.coord_mode,
        "nearest_mode": a.nearest_mode,
        "cubic_coeff_a": float(a.cubic_coeff_a),
        "exclude_outside": int(a.exclude_outside),
        "extrapolation_value": float(a.extrapolation_value),
    }
    roi = b.const("roi", np.array(a.roi, np.float32)) if a.roi else ""
    rank = len(a.out_shape)
    if len(a.scales) == rank and all(s > 0 for s in a.scales):
        b.node("Resize", [ins[0], roi, b.const("scales", np.array(a.scales, np.float32))], out, **attrs)
    else:
        b.node("Resize", [ins[0], roi, "", b.const("sizes", np.array(a.out_shape, np.int64))], out, **attrs)


_REDUCE = MappingProxyType({"mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "sum": "ReduceSum"})


def _reduce(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    a = op.attrs
    if a.kind == "sum":  # ReduceSum takes its axes as an input since opset 13
        b.node("ReduceSum", [ins[0], b.const("axes", np.array(a.axes, np.int64))], out, keepdims=int(a.keepdims))
    else:
        b.node(_REDUCE[a.kind], ins, out, axes=list(a.axes), keepdims=int(a.keepdims))


def _unsupported(b: OnnxBuilder, op: Op, ins: list[str], out: str) -> None:
    raise UnsupportedError(f"op '{op.name}' ({op.kind}) has no ONNX form in npuc's QDQ export")


Emitter = Callable[[OnnxBuilder, Op, list[str], str], None]

EMITTERS: Mapping[str, Emitter] = MappingProxyType(
    {
        "conv2d": _conv,
        "conv_transpose2d": _conv,
        "pool2d": _pool,
        "global_pool": lambda b, op, ins, out: b.node(
            "GlobalMaxPool" if op.attrs.mode == "max" else "GlobalAveragePool", ins, out
        ),
        "eltwise": _eltwise,
        "gemm": _gemm,
        "matmul": _gemm,
        "activation": lambda b, op, ins, out: activation(b, ins[0], out, op.attrs.act),
        "prelu": lambda b, op, ins, out: b.node("PRelu", ins, out),
        "channel_scale": _channel_scale,
        "softmax": _softmax,
        "concat": lambda b, op, ins, out: b.node("Concat", ins, out, axis=op.attrs.axis),
        "reshape": _reshape_to_output,
        "transpose": lambda b, op, ins, out: b.node("Transpose", ins, out, perm=list(op.attrs.perm)),
        "slice": _slice,
        "split": _split,
        "pad": _pad,
        "resize": _resize,
        "lrn": lambda b, op, ins, out: b.node(
            "LRN", ins, out, size=op.attrs.size, alpha=op.attrs.alpha, beta=op.attrs.beta, bias=op.attrs.bias
        ),
        "reduce": _reduce,
        "gather": lambda b, op, ins, out: b.node("Gather", ins, out, axis=op.attrs.axis),
        "expand": lambda b, op, ins, out: b.node(
            "Expand", [ins[0], b.const("shape", np.array(op.attrs.shape, np.int64))], out
        ),
        "cast": lambda b, op, ins, out: b.node("Identity", ins, out),  # formats are the Q/DQ around it
        "layer_norm": lambda b, op, ins, out: b.node(
            "LayerNormalization", ins, out, axis=op.attrs.axis, epsilon=op.attrs.epsilon
        ),
        "recurrent": _unsupported,
        "lut": _unsupported,
    }
)
