"""Caffe frontend: a deploy `.prototxt` (text) plus `.caffemodel` weights (binary) → the float IR graph.

Both files are parsed with protobuf (text_format / binary) through dynamic message classes built from the
schema subset in `caffe.proto` (compiler.protoschema). Weights are matched to layers by name, as Caffe's
`CopyTrainedLayersFrom` does, so a training-net caffemodel serves a deploy prototxt. Each layer type has a
converter in LAYER_CONVERTERS producing the same IR ops the ONNX frontend would (conv2d, pool2d, gemm,
activation, ...). Caffe's own conventions are kept: pooling rounds its output size up (ceil) and averages
over the window clipped to the padded input; InnerProduct flattens from `axis` and computes x·Wᵀ + b.
In-place layers (top == bottom) get fresh IR tensor names; blobs no later layer reads are the outputs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from npuc.compiler import ops
from npuc.compiler.errors import CorruptFileError, UnsupportedError, UserError
from npuc.compiler.fileio import read_limited
from npuc.compiler.ir import Graph
from npuc.compiler.protoschema import load_proto

MAX_PROTOTXT_BYTES = 64 << 20  # the largest public prototxts are a few hundred KB
MAX_CAFFEMODEL_BYTES = (2 << 30) - 1  # protobuf messages end at 2 GiB

SCHEMA_PATH = Path(__file__).with_name("caffe.proto")
InputShapes = dict[str, tuple[int, ...]]
TRAIN = 0  # caffe.Phase


@lru_cache(maxsize=1)
def caffe_schema():
    """The `caffe` message classes (built once; the classes are immutable)."""
    return load_proto(SCHEMA_PATH)


# ---------------------------------------------------------------------------------------------------------
# Reading the two files
# ---------------------------------------------------------------------------------------------------------


def read_prototxt(path: Path):
    """A `NetParameter` from a text prototxt; parse errors name the file, line and column."""
    try:
        text = read_limited(Path(path), "Caffe prototxt", MAX_PROTOTXT_BYTES).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: byte {exc.start} is not UTF-8 text; pass the Caffe .prototxt") from None
    net = caffe_schema().NetParameter()
    try:
        text_format.Parse(text, net)
    except text_format.ParseError as exc:
        raise UserError(f"{path}:{exc}; npuc reads the layers and parameters listed in frontends/caffe.proto") from None
    return net


def read_caffemodel(path: Path):
    """A `NetParameter` with blobs from a binary `.caffemodel`."""
    data = read_limited(Path(path), "caffemodel", MAX_CAFFEMODEL_BYTES)
    net = caffe_schema().NetParameter()
    try:
        net.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise CorruptFileError(f"{path}: not a binary caffemodel ({exc}); pass the .caffemodel weights file") from None
    return net


def blob_array(blob, where: str) -> np.ndarray:
    """A BlobProto as a float32 array of its declared shape (new-style `shape` or legacy n/c/h/w)."""
    if blob.HasField("shape"):
        shape = tuple(int(d) for d in blob.shape.dim)
    else:
        shape = tuple(d for d in (blob.num, blob.channels, blob.height, blob.width))
        shape = shape if any(shape) else (len(blob.data) or len(blob.double_data),)
    values = np.asarray(blob.data if len(blob.data) else blob.double_data, np.float32)
    if values.size != int(np.prod(shape, dtype=np.int64)):
        raise CorruptFileError(f"{where}: blob holds {values.size} values but its shape is {list(shape)}")
    return values.reshape(shape)


def weights_by_layer(model) -> dict[str, list[np.ndarray]]:
    """Layer name → its blobs (new-style `layer` and legacy V1 `layers` both)."""
    found: dict[str, list[np.ndarray]] = {}
    for layer in list(model.layers) + list(model.layer):
        if len(layer.blobs):
            found[layer.name] = [blob_array(b, f"caffemodel layer {layer.name!r} blob {i}") for i, b in
                                 enumerate(layer.blobs)]  # fmt: skip
    return found


# ---------------------------------------------------------------------------------------------------------
# Conversion state
# ---------------------------------------------------------------------------------------------------------


@dataclass
class LayerContext:
    """One layer being converted: its parameters, weights and the blob → IR tensor map."""

    graph: Graph
    layer: object
    blobs: dict[str, list[np.ndarray]]
    current: dict[str, str]  # Caffe blob name → IR tensor holding its latest value
    notes: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"layer {self.layer.name!r} ({self.layer.type})"

    def error(self, what: str, fix: str) -> UserError:
        return UserError(f"{self.where}: {what}; {fix}")

    def input(self, index: int = 0) -> str:
        if index >= len(self.layer.bottom):
            raise self.error(f"needs bottom #{index}", "add the bottom blob to the prototxt")
        blob = self.layer.bottom[index]
        if blob not in self.current:
            raise self.error(f"reads blob {blob!r}, which no earlier layer produces", "check the bottom names")
        return self.current[blob]

    def inputs(self) -> list[str]:
        return [self.input(i) for i in range(len(self.layer.bottom))]

    def shape(self, index: int = 0) -> tuple[int, ...]:
        return self.graph.shape(self.input(index))

    def weight(self, index: int, count: int | None = None) -> np.ndarray:
        found = self.blobs.get(self.layer.name, [])
        if index >= len(found):
            raise self.error(
                f"has no weight blob #{index} in the caffemodel",
                "pass the matching .caffemodel (weights are found by layer name)",
            )
        if count is not None and found[index].size != count:
            raise self.error(f"weight blob #{index} has {found[index].size} values, expected {count}",
                             "the caffemodel does not match the prototxt")  # fmt: skip
        return found[index]

    def const(self, suffix: str, data: np.ndarray) -> str:
        name = self.graph.unique_name(f"{self.layer.name}_{suffix}")
        self.graph.add_const(name, np.ascontiguousarray(data, np.float32))
        return name

    def emit(self, kind: str, inputs: list[str], attrs, top: int = 0) -> str:
        """Add an op writing top blob #top (a fresh tensor name when the blob already exists)."""
        blob = self.layer.top[top] if top < len(self.layer.top) else self.layer.name
        out = self.graph.unique_name(blob if blob not in self.current else self.layer.name)
        self.graph.add_op(kind, inputs, [out], attrs, name=self.graph.unique_name(self.layer.name))
        self.current[blob] = out
        return out

    def temp(self, kind: str, inputs: list[str], attrs, suffix: str) -> str:
        out = self.graph.unique_name(f"{self.layer.name}_{suffix}")
        self.graph.add_op(kind, inputs, [out], attrs, name=out)
        return out

    def alias(self, tensor: str, top: int = 0) -> None:
        self.current[self.layer.top[top]] = tensor


Converter = Callable[[LayerContext], None]
LAYER_CONVERTERS: dict[str, Converter] = {}


def layer_converter(*types: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for name in types:
            LAYER_CONVERTERS[name] = fn
        return fn

    return register


def _pair(repeated, single_h: int, single_w: int, has_hw: bool, default: int) -> tuple[int, int]:
    """Caffe's (h, w) from `x_h`/`x_w` or a repeated field with 0, 1 or 2 values."""
    if has_hw:
        return int(single_h), int(single_w)
    values = list(repeated)
    if not values:
        return default, default
    return (int(values[0]), int(values[-1])) if len(values) <= 2 else (-1, -1)


# ---------------------------------------------------------------------------------------------------------
# Layer converters
# ---------------------------------------------------------------------------------------------------------


@layer_converter("Convolution")
def _convolution(ctx: LayerContext) -> None:
    p = ctx.layer.convolution_param
    n, c = ctx.shape()[:2]
    kernel = _pair(p.kernel_size, p.kernel_h, p.kernel_w, p.HasField("kernel_h"), 0)
    strides = _pair(p.stride, p.stride_h, p.stride_w, p.HasField("stride_h"), 1)
    pads = _pair(p.pad, p.pad_h, p.pad_w, p.HasField("pad_h") or p.HasField("pad_w"), 0)
    dilations = _pair(p.dilation, 1, 1, False, 1)
    if min(kernel + strides + dilations) < 1 or min(pads) < 0 or p.axis != 1 or len(ctx.shape()) != 4:
        raise ctx.error("only 2-D NCHW convolutions with positive kernel, stride and dilation are supported",
                        "check convolution_param")  # fmt: skip
    group, oc = p.group, p.num_output
    if group < 1 or c % group or oc % group:
        raise ctx.error(f"group {group} does not divide {c} input / {oc} output channels", "fix group")
    weight = ctx.weight(0, oc * (c // group) * kernel[0] * kernel[1]).reshape(oc, c // group, *kernel)
    inputs = [ctx.input(), ctx.const("weight", weight)]
    if p.bias_term:
        inputs.append(ctx.const("bias", ctx.weight(1, oc).reshape(oc)))
    attrs = ops.Conv2d(strides, (pads[0], pads[1], pads[0], pads[1]), dilations, group)
    ctx.emit("conv2d", inputs, attrs)


POOL_MODES = {0: "max", 1: "avg"}


@layer_converter("Pooling")
def _pooling(ctx: LayerContext) -> None:
    p = ctx.layer.pooling_param
    mode = POOL_MODES.get(p.pool)
    if mode is None or len(ctx.shape()) != 4:
        raise ctx.error("only MAX and AVE pooling of NCHW blobs are supported", "use MAX or AVE")
    if p.global_pooling:
        ctx.emit("global_pool", [ctx.input()], ops.GlobalPool(mode))
        return
    has_k = p.HasField("kernel_h") or p.HasField("kernel_w")
    kernel = (p.kernel_h, p.kernel_w) if has_k else (p.kernel_size, p.kernel_size)
    has_s = p.HasField("stride_h") or p.HasField("stride_w")
    strides = (p.stride_h, p.stride_w) if has_s else (p.stride, p.stride)
    has_p = p.HasField("pad_h") or p.HasField("pad_w")
    pads = (p.pad_h, p.pad_w) if has_p else (p.pad, p.pad)
    if min(kernel + strides) < 1 or pads[0] >= kernel[0] or pads[1] >= kernel[1]:
        raise ctx.error(f"kernel {kernel}, stride {strides}, pad {pads} is not a valid window", "fix pooling_param")
    # Caffe: output size rounds up; AVE divides by the window clipped to the padded input
    attrs = ops.Pool2d(mode, kernel, strides, (pads[0], pads[1], pads[0], pads[1]), (1, 1), ceil_mode=True,
                       count_include_pad=True)  # fmt: skip
    ctx.emit("pool2d", [ctx.input()], attrs)


@layer_converter("InnerProduct")
def _inner_product(ctx: LayerContext) -> None:
    p = ctx.layer.inner_product_param
    shape = ctx.shape()
    axis = p.axis % len(shape)
    rows, k = int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))
    x = ctx.input()
    if shape != (rows, k):
        x = ctx.temp("reshape", [x], ops.Reshape((rows, k)), "flat")
    weight = ctx.weight(0, p.num_output * k).reshape((k, p.num_output) if p.transpose else (p.num_output, k))
    inputs = [x, ctx.const("weight", weight)]
    if p.bias_term:
        inputs.append(ctx.const("bias", ctx.weight(1, p.num_output).reshape(p.num_output)))
    ctx.emit("gemm", inputs, ops.Gemm(trans_b=not p.transpose))


def _activation(ctx: LayerContext, act: ops.Activation) -> None:
    ctx.emit("activation", [ctx.input()], ops.ActivationOp(act))


@layer_converter("ReLU")
def _relu(ctx: LayerContext) -> None:
    slope = ctx.layer.relu_param.negative_slope
    _activation(ctx, ops.Activation("leaky_relu", alpha=slope) if slope else ops.Activation("relu"))


@layer_converter("Sigmoid")
def _sigmoid(ctx: LayerContext) -> None:
    _activation(ctx, ops.Activation("sigmoid"))


@layer_converter("TanH")
def _tanh(ctx: LayerContext) -> None:
    _activation(ctx, ops.Activation("tanh"))


_CUSTOM_ALPHA = re.compile(r"alpha\s*:\s*([-+0-9.eE]+)")


@layer_converter("ELU")
def _elu(ctx: LayerContext) -> None:
    alpha = ctx.layer.elu_param.alpha
    if ctx.layer.HasField("custom"):  # BMNet CPU-layer form: custom { value: "{alpha: 0.1}" }
        match = _CUSTOM_ALPHA.search(ctx.layer.custom.value)
        if match is None:
            raise ctx.error(f"custom value {ctx.layer.custom.value!r} has no alpha", 'write "{alpha: 1.0}"')
        alpha = float(match.group(1))
    _activation(ctx, ops.Activation("elu", alpha=alpha))


def _per_channel(ctx: LayerContext, values: np.ndarray) -> np.ndarray:
    """A length-C vector shaped to broadcast along axis 1 of the layer's input."""
    return values.reshape((-1,) + (1,) * (len(ctx.shape()) - 2))


@layer_converter("PReLU")
def _prelu(ctx: LayerContext) -> None:
    channels = 1 if ctx.layer.prelu_param.channel_shared else ctx.shape()[1]
    slope = ctx.weight(0, channels).reshape(channels)
    ctx.emit("prelu", [ctx.input(), ctx.const("slope", _per_channel(ctx, slope))], ops.PRelu())


ELTWISE_KINDS = {0: "mul", 1: "add", 2: "max"}


@layer_converter("Eltwise")
def _eltwise(ctx: LayerContext) -> None:
    p = ctx.layer.eltwise_param
    inputs = ctx.inputs()
    coeffs = list(p.coeff)
    if coeffs and (len(coeffs) != len(inputs) or p.operation != 1):
        raise ctx.error("coeff needs one value per bottom and operation SUM", "fix eltwise_param")
    if coeffs:
        inputs = [
            x
            if c == 1.0
            else ctx.temp(
                "eltwise", [x, ctx.const(f"coeff{i}", np.float32(c))], ops.Eltwise("mul"), f"scaled{i}"
            )  # fmt: skip
            for i, (x, c) in enumerate(zip(inputs, coeffs, strict=True))
        ]
    ctx.emit("eltwise", inputs, ops.Eltwise(ELTWISE_KINDS[p.operation]))


@layer_converter("Concat")
def _concat(ctx: LayerContext) -> None:
    p = ctx.layer.concat_param
    axis = p.axis if p.HasField("axis") or not p.HasField("concat_dim") else p.concat_dim
    ctx.emit("concat", ctx.inputs(), ops.Concat(axis % len(ctx.shape())))


@layer_converter("BatchNorm")
def _batch_norm(ctx: LayerContext) -> None:
    c = ctx.shape()[1]
    factor = ctx.weight(2, 1).reshape(()) if len(ctx.blobs.get(ctx.layer.name, [])) > 2 else np.float32(1)
    factor = np.float32(0) if factor == 0 else np.float32(1) / factor  # Caffe's moving-average scale
    mean, var = ctx.weight(0, c).reshape(c) * factor, ctx.weight(1, c).reshape(c) * factor
    scale = (1.0 / np.sqrt(var.astype(np.float64) + ctx.layer.batch_norm_param.eps)).astype(np.float32)
    inputs = [ctx.input(), ctx.const("scale", scale), ctx.const("bias", -mean * scale)]
    ctx.emit("channel_scale", inputs, ops.ChannelScale(axis=1))


@layer_converter("Scale")
def _scale(ctx: LayerContext) -> None:
    p = ctx.layer.scale_param
    if len(ctx.layer.bottom) != 1 or p.axis % len(ctx.shape()) != 1 or p.num_axes != 1:
        raise ctx.error("only a learned per-channel scale on axis 1 is supported", "use axis 1, num_axes 1")
    c = ctx.shape()[1]
    bias = ctx.weight(1, c).reshape(c) if p.bias_term else np.zeros(c, np.float32)
    inputs = [ctx.input(), ctx.const("scale", ctx.weight(0, c).reshape(c)), ctx.const("bias", bias)]
    ctx.emit("channel_scale", inputs, ops.ChannelScale(axis=1))


@layer_converter("Softmax")
def _softmax(ctx: LayerContext) -> None:
    ctx.emit("softmax", [ctx.input()], ops.Softmax(axis=ctx.layer.softmax_param.axis % len(ctx.shape())))


@layer_converter("Flatten")
def _flatten(ctx: LayerContext) -> None:
    shape = ctx.shape()
    p = ctx.layer.flatten_param
    start, end = p.axis % len(shape), p.end_axis % len(shape)
    new = shape[:start] + (int(np.prod(shape[start : end + 1])),) + shape[end + 1 :]
    ctx.emit("reshape", [ctx.input()], ops.Reshape(new))


@layer_converter("Reshape")
def _reshape(ctx: LayerContext) -> None:
    shape = ctx.shape()
    p = ctx.layer.reshape_param
    start = p.axis % (len(shape) + 1)
    end = len(shape) if p.num_axes == -1 else start + p.num_axes
    dims = [shape[start + i] if d == 0 else int(d) for i, d in enumerate(p.shape.dim)]
    head, tail = list(shape[:start]), list(shape[end:])
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise ctx.error(f"reshape_param.shape {list(p.shape.dim)} is invalid", "use at most one -1")
    if -1 in dims:
        known = int(np.prod(head + [d for d in dims if d != -1] + tail))
        dims[dims.index(-1)] = int(np.prod(shape)) // max(known, 1)
    new = tuple(head + dims + tail)
    if int(np.prod(new)) != int(np.prod(shape)):
        raise ctx.error(f"cannot reshape {list(shape)} to {list(new)}", "fix reshape_param.shape")
    ctx.emit("reshape", [ctx.input()], ops.Reshape(new))


@layer_converter("Dropout")
def _dropout(ctx: LayerContext) -> None:
    ctx.alias(ctx.input())  # inference: identity


# ---------------------------------------------------------------------------------------------------------
# Inputs and the net
# ---------------------------------------------------------------------------------------------------------


def _add_input(graph: Graph, current: dict[str, str], name: str, shape, input_shapes: InputShapes) -> None:
    shape = tuple(input_shapes.get(name, shape or ()))
    if not shape or min(shape) < 1:
        raise UserError(f"Caffe input {name!r} has no complete shape; give it with --input-shape {name}:1,3,224,224")
    graph.add_tensor(name, shape)
    graph.inputs.append(name)
    graph.input_layouts[name] = "nchw"
    current[name] = name


def _net_inputs(net, graph: Graph, current: dict[str, str], input_shapes: InputShapes) -> None:
    """Old-style `input:` + `input_shape`/`input_dim` declarations."""
    dims = list(net.input_dim)
    for i, name in enumerate(net.input):
        if i < len(net.input_shape):
            shape = tuple(net.input_shape[i].dim)
        else:
            shape = tuple(dims[4 * i : 4 * i + 4])
        _add_input(graph, current, name, shape, input_shapes)


def _included(layer) -> bool:
    """Deploy view: skip layers restricted to the TRAIN phase."""
    if layer.HasField("phase"):
        return layer.phase != TRAIN
    if len(layer.include):
        return any(not r.HasField("phase") or r.phase != TRAIN for r in layer.include)
    return not any(r.HasField("phase") and r.phase != TRAIN for r in layer.exclude)


def import_caffe(
    prototxt: Path,
    caffemodel: Path | None = None,
    input_shapes: InputShapes | None = None,
    notes: list[str] | None = None,
) -> Graph:
    """Caffe deploy prototxt (+ caffemodel weights) → verified float IR graph."""
    input_shapes = dict(input_shapes or {})
    net = read_prototxt(Path(prototxt))
    if len(net.layers):
        raise UnsupportedError(
            f"{prototxt}: legacy V1 'layers' net; upgrade it with Caffe's upgrade_net_proto_text first"
        )
    blobs = weights_by_layer(read_caffemodel(Path(caffemodel))) if caffemodel is not None else {}
    graph = Graph(name=net.name or Path(prototxt).stem)
    current: dict[str, str] = {}
    read: set[str] = set()
    _net_inputs(net, graph, current, input_shapes)
    for layer in net.layer:
        if not _included(layer):
            continue
        if layer.type in ("Input", "Data"):
            shapes = list(layer.input_param.shape)
            for i, top in enumerate(layer.top[:1] if layer.type == "Data" else layer.top):
                _add_input(graph, current, top, tuple(shapes[i].dim) if i < len(shapes) else (), input_shapes)
            if layer.type == "Data" and notes is not None:
                notes.append(
                    f"layer {layer.name!r} (Data): fed as input {layer.top[0]!r}; data transforms are not applied"
                )
            continue
        convert = LAYER_CONVERTERS.get(layer.type)
        if convert is None:
            raise UnsupportedError(
                f"layer {layer.name!r} has type {layer.type!r}, which npuc's Caffe frontend does not support "
                f"(supported: Input, Data, {', '.join(sorted(LAYER_CONVERTERS))}); remove or replace it"
            )
        read.update(current.get(b, b) for b in layer.bottom)
        convert(LayerContext(graph, layer, blobs, current, notes if notes is not None else []))
    graph.outputs = [t for b, t in current.items() if t not in read and t not in graph.inputs]
    graph.outputs = list(dict.fromkeys(graph.outputs))
    if not graph.outputs:
        raise UserError(f"{prototxt}: the net has no output blobs; it needs at least one layer after its inputs")
    graph.verify()
    return graph
