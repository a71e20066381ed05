"""The exact QDQ form for bm1880: onnxruntime computes the bmodel's int8 arithmetic bit for bit.

The layers come from the same lowering `npuc build --target bm1880` uses (backends/bm1880/quantize.py
`lower`: per-layer shifts or per-channel gains, 8-bit multipliers, 16-bit bias), with the build's default
weight scale (a cali_table: per-channel gains) unless `--option weight_scale=` says otherwise; each layer is
written as the integer pipeline the bmodel's descriptors run (backends/bm1880/kernels.py, specs/bm1880.md
§3.2), on int64, its integers (weights, bias, gains) the lowering's own:

- conv / FC / depthwise: `sat8(⌊(Σ x·W + B + 2^(r−1)) / 2^r⌋)` (ConvInteger, zero padding, 16-bit bias;
  a fused ReLU before the shift, which equals clamping after it); with per-channel gains g (u8 2^(7−k)) the
  conv BD writes 16 bits, `sat16(shift(relu(Σ x·W + B), r))`, and a multiply by its channel's gain gives
  `sat8(shift(a16·g, s))` with s = 7 (less for weights beyond int8 at shift 0);
- max pool: MaxPool on the input padded with -128, then `sat8(⌊(y·m + 2^(r−1)) / 2^r⌋)` unless (m, r) is
  (1, 0); average pool: window sums (ConvInteger with a ones kernel, zero padding) times m, shifted;
- ReLU / LeakyReLU / PReLU: `sat8(shift(max(x,0)·gt, gt_shift)) + sat8(shift(min(x,0)·le, le_shift))` with
  le one signed constant (leaky) or the int8 slope of each channel (PReLU); ReLU has no negative side;
- eltwise add/max: `sat8(shift(op(sat16(x1·m1), sat16(x2·m2)), r))`, ReLU before the shift;
- concat: each input `sat8(shift(x·m, r))` unless already at the output threshold; reshapes move no code.

Every shift rounds half up (`opt_rshift_typ` 1) and is one floor division (ExactBuilder.shift_round_half_up).
Boundaries: a float input is quantized as the bmodel runner does, `sat8(⌊x·(128/T) + 0.5⌋)` in float64,
then passes a visible QuantizeLinear (scale T/128, zero point 0) that returns the code; each bmodel output is
DequantizeLinear(code, float32(T/128)) — the runner's `q·T/128`. Ops BMNet leaves to the host (trailing
transposes, softmax) follow in float32 ONNX ops, as the host runs them. int8 tensors keep their IR names in
the bmodel's NCHW views; a name the model uses for a float input or output gets the suffix `_int8`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx
from onnx import TensorProto

from npuc.backends.bm1880.quantize import (
    WEIGHT_RULES,
    Layer,
    LoweredNet,
    choose_weight_scale,
    lower,
    strip_host_tail,
)
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op
from npuc.frontends.onnx_load import load_model
from npuc.passes.calibration.calibrate import tensor_table_names
from npuc.passes.export.qdq import ExportRequest, InputPrologue, onnx_model, register_exact_writer
from npuc.passes.export.qdq_exact import ExactBuilder
from npuc.passes.export.qdq_ops import EMITTERS, input_value

INT16 = (-(1 << 15), (1 << 15) - 1)
BM1880_NOTE = (
    "bm1880 exact form: int8 layers of npuc's bm1880 lowering ({rule}, 8-bit multipliers, 16-bit bias) "
    "as integer ops (ConvInteger, int64 round-half-up shifts); inputs sat8(floor(x*128/T + 0.5)), outputs q*T/128"
)


@dataclass(frozen=True)
class Bm1880Lowering:
    """The int8 net `npuc build --target bm1880` compiles, and the float ops it leaves to the host."""

    net: LoweredNet
    tail: tuple[Op, ...]


def lower_for_export(
    graph: Graph, table: Mapping[str, float], table_names: dict[str, str] | None, channel_gains: bool = False
) -> Bm1880Lowering:
    """`backends.bm1880.quantize.lower` on a copy of `graph`; the host tail it drops is kept, in graph order."""
    work = copy.deepcopy(graph)
    strip_host_tail(work)
    kept = {op.name for op in work.ops}
    tail = tuple(op for op in graph.ops if op.name not in kept)
    return Bm1880Lowering(lower(work, dict(table), table_names, channel_gains=channel_gains), tail)


def _onnx_pads(pads: tuple[int, int, int, int]) -> list[int]:
    """Layer pads (top, bottom, left, right) as ONNX Conv/Pool pads (top, left, bottom, right)."""
    top, bottom, left, right = pads
    return [top, left, bottom, right]


class _Writer:
    def __init__(self, e: ExactBuilder, net: LoweredNet, reserved: set[str]) -> None:
        self.e, self.net, self.reserved = e, net, reserved
        self.codes: dict[str, str] = {}  # IR tensor -> ONNX int8 tensor (its 4-D view)

    def name(self, tensor: str) -> str:
        """The ONNX name of an int8 tensor: its IR name unless the model uses that name for a float value."""
        if tensor in self.reserved:
            return self.e.b.fresh(f"{tensor}_int8")
        self.e.b.used.add(tensor)  # names the lowering adds (a split activation's `#pre`) are new to the graph
        return tensor

    def out(self, layer: Layer) -> str:
        self.codes[layer.output] = self.name(layer.output)
        return self.codes[layer.output]

    def view(self, tensor: str) -> str:
        """The int8 codes of `tensor`; a reshape's output is its source's bytes in its own 4-D view."""
        if tensor not in self.codes:
            owner = self.net.storage[tensor]
            if owner == tensor:
                raise RuntimeError(f"tensor '{tensor}' is read before a layer writes it")
            shape = self.e.c("shape", np.array(self.net.shapes[tensor], np.int64))
            self.codes[tensor] = self.e.b.node("Reshape", [self.view(owner), shape], self.name(tensor))
        return self.codes[tensor]

    # integer helpers ------------------------------------------------------------------------------------------

    def sat(self, x: str, lo: int, hi: int) -> str:
        return self.e.b.node("Clip", [x, self.e.c("lo", np.int64(lo)), self.e.c("hi", np.int64(hi))])

    def scaled(self, x: str, m: np.ndarray | int, r: np.ndarray | int, shape: tuple[int, ...] | None = None) -> str:
        """`⌊(x·m + 2^(r−1)) / 2^r⌋` on int64 (the BD's multiply then round-half-up right shift)."""
        return self.e.shift_round_half_up(x, np.asarray(m), np.asarray(r), shape)

    def requant8(self, x: str, m: int, r: int, out: str | None = None) -> str:
        """int8 `x` times an 8-bit constant, shifted, saturated to int8 (pool and concat requantization)."""
        return self.e.finish(self.scaled(self.e.to_i64(x), m, r), out or self.e.b.fresh(f"{x}_requant"))


# ---------------------------------------------------------------------------------------------------------
# Layers: each writes layer.output (int8, 4-D) from the int8 codes of its inputs

LayerEmitter = Callable[[_Writer, Layer, list[str]], None]


def _conv(w: _Writer, layer: Layer, xs: list[str]) -> None:
    e = w.e
    c = w.net.shapes[layer.inputs[0]][1]
    depthwise = layer.kind == "dwconv"
    weight = layer.weight.reshape(c, 1, *layer.kernel) if depthwise else layer.weight
    attrs = dict(strides=list(layer.strides), pads=_onnx_pads(layer.pads), dilations=list(layer.dilations))
    kernel = e.c(f"{layer.name}_weight", np.ascontiguousarray(weight, np.int8))
    acc = e.to_i64(e.b.node("ConvInteger", [xs[0], kernel], group=c if depthwise else 1, **attrs))
    if layer.bias is not None:
        acc = e.b.node("Add", [acc, e.c(f"{layer.name}_bias", np.asarray(layer.bias, np.int64).reshape(1, -1, 1, 1))])
    if layer.gains is None:
        e.finish(w.scaled(acc, 1, layer.rshift), w.out(layer), relu=layer.relu)
        return
    if layer.relu:  # before the shift, as the BD does
        acc = e.b.node("Max", [acc, e.c("zero", np.int64(0))])
    wide = w.sat(w.scaled(acc, 1, layer.rshift), *INT16)  # the conv BD's 16-bit result
    gains = e.c(f"{layer.name}_gains", np.asarray(layer.gains, np.int64).reshape(1, -1, 1, 1))
    e.finish(w.scaled(e.b.node("Mul", [wide, gains]), 1, layer.gain_shift), w.out(layer))


def _pool(w: _Writer, layer: Layer, xs: list[str]) -> None:
    e = w.e
    (m,) = layer.multipliers
    attrs = dict(kernel_shape=list(layer.kernel), strides=list(layer.strides), dilations=list(layer.dilations))
    if layer.mode == "max":  # the BD pads with -128, which never wins a window holding an input value
        top, bottom, left, right = layer.pads
        pads = e.c("pads", np.array([0, 0, top, left, 0, 0, bottom, right], np.int64))
        padded = e.b.node("Pad", [xs[0], pads, e.c("pad_value", np.int8(-128))], mode="constant")
        if (m, layer.rshift) == (1, 0):
            e.b.node("MaxPool", [padded], w.out(layer), **attrs)
        else:
            w.requant8(e.b.node("MaxPool", [padded], **attrs), m, layer.rshift, w.out(layer))
        return
    c = w.net.shapes[layer.inputs[0]][1]
    ones = e.c("window", np.ones((c, 1, *layer.kernel), np.int8))
    attrs = dict(strides=list(layer.strides), pads=_onnx_pads(layer.pads), dilations=list(layer.dilations))
    sums = e.to_i64(e.b.node("ConvInteger", [xs[0], ones], group=c, **attrs))
    e.finish(w.scaled(sums, m, layer.rshift), w.out(layer))


def _activation(w: _Writer, layer: Layer, xs: list[str]) -> None:
    """Positive side `sat8(shift(max(x,0)·gt))` plus the negative side (leaky: one slope, prelu: per channel)."""
    e = w.e
    gt, le = layer.multipliers
    gt_shift, le_shift = layer.shifts
    x = e.to_i64(xs[0])
    zero = e.c("zero", np.int64(0))
    y = w.sat(w.scaled(e.b.node("Max", [x, zero]), gt, gt_shift), -128, 127)
    if layer.mode in ("leaky", "prelu"):
        negative = e.b.node("Min", [x, zero])
        if layer.mode == "prelu":
            slopes = np.asarray(layer.weight, np.int64)
            scaled = w.scaled(negative, slopes, np.full(slopes.shape, le_shift), (1, slopes.size, 1, 1))
        else:
            scaled = w.scaled(negative, le, le_shift)
        y = e.b.node("Add", [y, w.sat(scaled, -128, 127)])  # one half is 0: the BD's OR of the two bytes
    e.finish(y, w.out(layer))


def _eltwise(w: _Writer, layer: Layer, xs: list[str]) -> None:
    e = w.e
    products = [w.sat(e.b.node("Mul", [e.to_i64(x), e.c("mult", np.int64(m))]), *INT16)
                for x, m in zip(xs, layer.multipliers, strict=True)]  # fmt: skip
    combined = e.b.node("Add" if layer.mode == "add" else "Max", products)
    e.finish(w.scaled(combined, 1, layer.rshift), w.out(layer), relu=layer.relu)


def _concat(w: _Writer, layer: Layer, xs: list[str]) -> None:
    parts = [x if (m, r) == (1, 0) else w.requant8(x, m, r)
             for x, m, r in zip(xs, layer.multipliers, layer.shifts, strict=True)]  # fmt: skip
    w.e.b.node("Concat", parts, w.out(layer), axis=int(layer.mode))


def _copy(w: _Writer, layer: Layer, xs: list[str]) -> None:
    """Slice/split/transpose: the strided region of the input's 4-D view, then the permutation; bytes unchanged."""
    e = w.e
    out_shape = w.net.shapes[layer.output]
    shape = [out_shape[layer.perm.index(a)] for a in range(4)]  # the region in input axes
    starts = np.array(layer.offsets, np.int64)
    ends = starts + (np.array(shape, np.int64) - 1) * np.array(layer.steps, np.int64) + 1
    args = [e.c("starts", starts), e.c("ends", ends), e.c("axes", np.arange(4, dtype=np.int64)),
            e.c("steps", np.array(layer.steps, np.int64))]  # fmt: skip
    if layer.perm == (0, 1, 2, 3):
        e.b.node("Slice", [xs[0], *args], w.out(layer))
        return
    e.b.node("Transpose", [e.b.node("Slice", [xs[0], *args])], w.out(layer), perm=list(layer.perm))


def _upsample(w: _Writer, layer: Layer, xs: list[str]) -> None:
    """Nearest upsample: each code repeated sh x sw (a reshape to (n, c, h, 1, w, 1), expand, reshape)."""
    e = w.e
    n, c, h, wd = w.net.shapes[layer.inputs[0]]
    _, _, sh, sw = layer.steps
    six = e.b.node("Reshape", [xs[0], e.c("shape", np.array([n, c, h, 1, wd, 1], np.int64))])
    wide = e.b.node("Expand", [six, e.c("shape", np.array([n, c, h, sh, wd, sw], np.int64))])
    e.b.node("Reshape", [wide, e.c("shape", np.array(w.net.shapes[layer.output], np.int64))], w.out(layer))


def _interleave(w: _Writer, layer: Layer, xs: list[str]) -> None:
    """A transposed conv's phases: phase (dy, dx) at rows dy::sh, columns dx::sw (each reshaped to
    (n, c, h, 1, w, 1), concatenated along the two unit axes, reshaped to the output)."""
    e = w.e
    n, c, h, wd = w.net.shapes[layer.inputs[0]]
    _, _, sh, sw = layer.steps
    six = [e.b.node("Reshape", [x, e.c("shape", np.array([n, c, h, 1, wd, 1], np.int64))]) for x in xs]
    rows = [e.b.node("Concat", six[dy * sw : (dy + 1) * sw], axis=5) for dy in range(sh)]
    block = e.b.node("Concat", rows, axis=3)
    e.b.node("Reshape", [block, e.c("shape", np.array(w.net.shapes[layer.output], np.int64))], w.out(layer))


def _lut(w: _Writer, layer: Layer, xs: list[str]) -> None:
    """The table indexed by the input code's byte, (q + 256) mod 256."""
    e = w.e
    byte = e.c("byte", np.int64(256))
    index = e.b.node("Mod", [e.b.node("Add", [e.to_i64(xs[0]), byte]), byte])
    table = e.c(f"{layer.name}_table", np.asarray(layer.weight, np.int8))
    e.b.node("Gather", [table, index], w.out(layer), axis=0)


def _mul(w: _Writer, layer: Layer, xs: list[str]) -> None:
    """`sat8(shift(sat16(x·s)·m, r))`, s broadcast per channel."""
    e = w.e
    (m,) = layer.multipliers
    product = w.sat(e.b.node("Mul", [e.to_i64(xs[0]), e.to_i64(xs[1])]), *INT16)
    e.finish(w.scaled(product, m, layer.rshift), w.out(layer))


LAYER_EMITTERS: Mapping[str, LayerEmitter] = MappingProxyType(
    {
        "conv": _conv,
        "dwconv": _conv,
        "pool": _pool,
        "act": _activation,
        "eltwise": _eltwise,
        "concat": _concat,
        "copy": _copy,
        "upsample": _upsample,
        "interleave": _interleave,
        "lut": _lut,
        "mul": _mul,
    }
)


# ---------------------------------------------------------------------------------------------------------
# Boundaries


def _quantize_input(e: ExactBuilder, value: str, threshold: float, out: str) -> str:
    """The bmodel runner's `sat8(floor(x·(128/T) + 0.5))` in float64, then a visible QuantizeLinear at T/128."""
    v = e.b.node("Mul", [e.cast(value, TensorProto.DOUBLE), e.c("inv_scale", np.float64(128.0 / threshold))])
    v = e.b.node("Floor", [e.b.node("Add", [v, e.c("half", np.float64(0.5))])])
    lo, hi = e.c("lo", np.float32(-128)), e.c("hi", np.float32(127))
    codes = e.b.node("Clip", [e.cast(v, TensorProto.FLOAT), lo, hi])  # |v| past 2^24 stays past the bounds
    return e.codes_to_int8(codes, float(np.float32(threshold / 128.0)), out)


def _dequantize_output(e: ExactBuilder, codes: str, threshold: float, out: str) -> str:
    """The runner's `q·float32(T/128)` as DequantizeLinear."""
    scale = e.c(f"{codes}_scale", np.float32(threshold / 128.0))
    return e.b.node("DequantizeLinear", [codes, scale, e.c("zero_point_int8", np.int8(0))], out)


def write_bm1880_nodes(
    e: ExactBuilder, graph: Graph, lowering: Bm1880Lowering, inputs: Mapping[str, str]
) -> tuple[dict[str, str], list[onnx.ValueInfoProto]]:
    """Append the lowered net to `e` (`inputs`: graph input -> ONNX float32 tensor), then the host tail.
    Returns IR tensor -> ONNX float tensor for the graph outputs, and the int8 tensors' value infos."""
    net = lowering.net
    reserved = set(graph.inputs) | set(graph.outputs) | {o for op in lowering.tail for o in op.outputs}
    w = _Writer(e, net, reserved)
    for name in net.inputs:
        w.codes[name] = _quantize_input(e, inputs[name], net.thresholds[name], w.name(name))
    for layer in net.layers:
        LAYER_EMITTERS[layer.kind](w, layer, [w.view(x) for x in layer.inputs])
    floats: dict[str, str] = {}
    outputs = set(net.outputs)
    for name in net.outputs:
        codes = w.view(name)
        if net.ir_shapes[name] != net.shapes[name]:
            codes = e.b.node("Reshape", [codes, e.c("shape", np.array(net.ir_shapes[name], np.int64))])
        out = name if name in graph.outputs else e.b.fresh(f"{name}_dq")
        floats[name] = _dequantize_output(e, codes, net.thresholds[name], out)
    for op in lowering.tail:  # float, as the host runs it
        EMITTERS[op.kind](e.b, op, [floats[i] for i in op.inputs], op.outputs[0])
        floats[op.outputs[0]] = op.outputs[0]
    infos = []
    for name, onnx_name in w.codes.items():
        th = net.thresholds[name]
        role = f"bmodel output '{name}'; " if name in outputs else ""
        doc = f"{role}int8 code; value = code * {np.float32(th / 128.0):.9g} (threshold {th:.9g}/128)"
        infos.append(onnx.helper.make_tensor_value_info(onnx_name, TensorProto.INT8, list(net.shapes[name]), doc))
    return floats, infos


def write_qdq_bm1880(
    graph: Graph,
    thresholds: Mapping[str, float],
    table_names: dict[str, str] | None = None,
    name: str | None = None,
    prologues: Mapping[str, InputPrologue] | None = None,
    channel_gains: bool = False,
) -> onnx.ModelProto:
    """The exact bm1880 form of the canonicalized float `graph`: the layers
    `backends.bm1880.quantize.lower(graph, thresholds, table_names)` makes — what `npuc build --target bm1880`
    compiles — in integer ONNX ops, then the float ops BMNet leaves to the host. The int8 codes of each bmodel
    output are in the model (value_info documented "bmodel output '<name>'")."""
    lowering = lower_for_export(graph, thresholds, table_names, channel_gains)
    note = BM1880_NOTE.format(rule=WEIGHT_RULES["channel" if channel_gains else "layer"])
    e = ExactBuilder(graph)
    prologues = prologues or {}
    values, inputs = {}, []
    for n in graph.inputs:
        prologue = prologues.get(n)
        values[n], info = input_value(e.b, graph, n, prologue.affine if prologue is not None else None)
        inputs.append(info)
    floats, infos = write_bm1880_nodes(e, graph, lowering, values)
    for out in graph.outputs:
        if floats.get(out) != out:
            e.b.node("Identity", [floats[out]], out)
    return onnx_model(graph, e.b, inputs, name, note, infos)


def exact_bm1880(req: ExportRequest) -> onnx.ModelProto:
    """The bm1880 backend's lowering (its own threshold matching and weight scale, as `npuc build --target
    bm1880` does with the same cali_table and options)."""
    if req.float_layers:
        raise UserError("bm1880 runs every layer in int8; drop --float-layers or use --form plain")
    names = tensor_table_names(load_model(req.model_path)) if req.model_path is not None else None
    scale, _ = choose_weight_scale(req.options, "cali_table")  # npuc export takes cali_tables only
    gains = scale == "channel"
    return write_qdq_bm1880(req.graph, req.table.thresholds(), names, req.graph.name, req.prologues, gains)


register_exact_writer("bm1880", exact_bm1880, options=("weight_scale",))
