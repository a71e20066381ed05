"""Write npuc's quantization as an ONNX model that onnxruntime runs (like hb_mapper's quantized_model.onnx).

Two forms (`qdq_for_target(..., form=)`, `npuc export --qdq --form`):

- exact (the default for every target): for cv18xx, bpu, lyngor, dmp `write_qdq_exact` transcribes the graph
  `passes.quantization.quantize(..., "cv18xx_int8")` makes into integer ONNX ops (passes/export/qdq_exact.py lists which
  ops are exact integer, exact float, and plain float). Every int8 tensor of npuc's reference appears under its IR
  name with the same codes; the model's inputs are quantized by a visible QuantizeLinear (scale th/127, zero
  point 0) and its outputs leave through DequantizeLinear. Measured: bit-exact outputs and int8 tensors on
  smallcnn and on the PP-LCNet orientation classifier (the plain form: cosine 0.9946 on its worst picture).
  For bm1880 `write_qdq_bm1880` writes the layers of the bm1880 backend's own lowering as integer ops
  (backends/bm1880/qdq.py, which registers it as that target's exact writer, and the `--option weight_scale`
  it reads): the bmodel's simulated outputs, code for code (smallcnn, MTCNN P-Net, PP-LCNet with per-channel
  gains).
- plain (any target): float ops between QuantizeLinear/DequantizeLinear pairs, for
  tools that expect pure QDQ. Every int8 activation T becomes `T --Q--> T_q --DQ--> T_dq` with scale s and
  zero point 0; weights are int8 initializers behind a DequantizeLinear (per output channel where the scheme
  is), biases int32 at the accumulator scale. A `QdqPlan` holds those numbers; each target names how its
  plan is made (TARGET_PLANS):
  - cv18xx, bpu (and lyngor/dmp, which have no int8 scheme of their own: npuc's symmetric int8 is shown for
    them): from the quantized graph. Activation scale th/127; weight scale `M·2^-(31+rshift)·th_y/th_x` per
    channel, so float conv + QuantizeLinear gives `acc·M/2^(31+rshift)`, the integer kernel's
    requantization. Ops whose kernel rescales each input with an 8-bit multiplier (add, sub, max, min,
    concat, average pools, mul) get their own DequantizeLinear per input at exactly that multiplier's
    scale; int8 activations are a Gather of their table's dequantized values on the input codes. Not
    reproduced: QuantizeLinear rounds once, half to even, where npuc's QDM requantization rounds twice (at
    2^31, then half away at 2^rshift) and pools/eltwise round half up; bf16 fallback ops run in float32.
  - bm1880: from the float graph and the thresholds: activation scale th/128, conv/FC weights with BMNet's
    per-layer power-of-two shift (scale `Ty/(Tx·2^r)`), int16 bias (scale `Ty/(128·2^r)`); the per-channel
    gains a cali_table build uses by default are shown by the exact form only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx
from onnx import TensorProto, helper

from npuc.compiler.coverage import per_op, stop_if_gaps
from npuc.compiler.errors import UnsupportedError, UserError
from npuc.compiler.ir import Graph, Op
from npuc.compiler.numformats.bm1880_int8 import bm1880_quantize_layer
from npuc.frontends.colorspace import PreprocessAffine
from npuc.frontends.onnx_load import load_model
from npuc.passes.calibration.calibrate import tensor_table_names
from npuc.passes.calibration.calitable import CalibrationTable
from npuc.passes.export.qdq_exact import ExactBuilder, int8_value_infos, write_exact_nodes
from npuc.passes.export.qdq_ops import EMITTERS, OPSET, OnnxBuilder, input_value
from npuc.passes.quantization.quantize import ThresholdMap, quantize, thresholds_for_graph


@dataclass(frozen=True)
class ConstQ:
    """A quantized constant: integer data and its dequantization scale (per tensor, or along `axis`)."""

    data: np.ndarray
    scale: np.ndarray
    axis: int | None = None


@dataclass
class QdqPlan:
    """The numbers of a QDQ model: activation scales, quantized constants, per-consumer input scales."""

    scheme: str
    # int8 tensor -> scale (zero point 0): one float, or one per channel (axis 1) in a per-channel plan
    act: dict[str, float | np.ndarray] = field(default_factory=dict)
    consts: dict[tuple[str, int], ConstQ] = field(default_factory=dict)  # (op name, input index)
    dq_scales: dict[tuple[str, int], float] = field(default_factory=dict)  # (op name, input index)
    luts: dict[str, np.ndarray] = field(default_factory=dict)  # op name -> 256 int8 codes by input byte
    note: str = ""


@dataclass(frozen=True)
class InputPrologue:
    """An image input fed as int8 NHWC runtime pixels (u8 - 128), mapped to the model's input by HzPreprocess."""

    affine: PreprocessAffine


# ---------------------------------------------------------------------------------------------------------
# Plans


def _pot(shift: np.ndarray) -> np.ndarray:
    return np.ldexp(1.0, -np.asarray(shift, np.int64).astype(np.int32))


def _requant_scale(q, th_in: float, th_out: float) -> np.ndarray:  # noqa: ANN001 - OpQuant
    """QDM weight scale: `M·2^-(31+r)·th_out/th_in` (one per multiplier)."""
    m = np.asarray(q.multiplier, np.float64).ravel()
    return m * _pot(np.asarray(q.rshift).ravel() + 31) * (th_out / th_in)


def _plan_weights(plan: QdqPlan, g: Graph, op: Op, q) -> None:  # noqa: ANN001
    th_x, th_y = float(q.inputs[0].threshold), float(q.output.threshold)
    s_w = _requant_scale(q, th_x, th_y)
    per_channel = op.kind == "conv2d" and s_w.size > 1
    axis = 0 if per_channel else None
    w_scale = s_w.astype(np.float32) if per_channel else np.float32(s_w[0])
    plan.consts[(op.name, 1)] = ConstQ(g.const(op.inputs[1]), w_scale, axis)
    if len(op.inputs) > 2 and op.inputs[2]:
        b_scale = (s_w * th_x / 127.0).astype(np.float32)
        plan.consts[(op.name, 2)] = ConstQ(g.const(op.inputs[2]), b_scale if per_channel else b_scale[0], axis)


def _plan_rescaled_inputs(plan: QdqPlan, g: Graph, op: Op, q) -> None:  # noqa: ANN001
    """Each input dequantized at its multiplier's scale: `|m_i|·2^-r_i·s_out` (times the pool count)."""
    s_out = float(q.output.scale)
    m = np.abs(np.asarray(q.multiplier, np.float64).ravel())
    r = np.broadcast_to(np.asarray(q.rshift).ravel(), m.shape)
    count = 1.0
    if op.kind == "pool2d":
        count = float(op.attrs.kernel[0] * op.attrs.kernel[1])
    elif op.kind == "global_pool":
        count = float(np.prod(g.shape(op.inputs[0])[2:]))
    scales = m * _pot(r) * s_out * count
    for i, s in enumerate(scales):
        plan.dq_scales[(op.name, i)] = float(s)


def _plan_mul(plan: QdqPlan, g: Graph, op: Op, q) -> None:  # noqa: ANN001
    """Product of n inputs: the last input's scale carries `M·2^-(31+r)·s_out / Π other scales`."""
    others = np.prod([float(p.scale) for p in q.inputs[:-1]])
    real = float(_requant_scale(q, 1.0, 1.0)[0])
    plan.dq_scales[(op.name, len(op.inputs) - 1)] = real * float(q.output.scale) / others


def _plan_prelu(plan: QdqPlan, g: Graph, op: Op, q) -> None:  # noqa: ANN001
    """The float slope the int8 halves make (negative factor over positive factor, per channel): the negative
    half's int8 weights behind a DequantizeLinear, shaped to broadcast over the input's channels."""
    weights = g.const(op.inputs[1]).astype(np.int64)  # (2, C): positive half, negative half
    factor = weights * np.asarray(q.multiplier, np.float64) * _pot(np.asarray(q.rshift) + 31)
    codes = np.where(factor[1] == 0, 0, weights[1]).astype(np.int8)
    scale = np.where(codes != 0, factor[1] / (np.where(codes != 0, codes, 1) * factor[0]), 1.0).astype(np.float32)
    rank = len(g.shape(op.inputs[0]))
    plan.consts[(op.name, 1)] = ConstQ(codes.reshape(-1, *[1] * (rank - 2)), scale, 0)


def _plan_int8_op(plan: QdqPlan, g: Graph, op: Op, q) -> None:  # noqa: ANN001
    kind = op.kind
    if kind == "prelu" and q.multiplier is not None:
        _plan_prelu(plan, g, op, q)
    elif kind in ("activation", "lut") and q.lut is not None:
        plan.luts[op.name] = np.asarray(q.lut, np.int8)
    elif kind in ("conv2d", "gemm", "matmul") and q.multiplier is not None:
        _plan_weights(plan, g, op, q)
    elif kind == "eltwise" and op.attrs.kind == "mul":
        _plan_mul(plan, g, op, q)
    elif (kind in ("eltwise", "concat") or (kind in ("pool2d", "global_pool") and op.attrs.mode == "avg")) and (
        q.multiplier is not None
    ):
        _plan_rescaled_inputs(plan, g, op, q)


def plan_from_quantized(qgraph: Graph, scheme: str = "cv18xx_int8") -> QdqPlan:
    """The QDQ plan of a graph made by `passes.quantization.quantize` (int8 tensors, OpQuant on every op)."""
    plan = QdqPlan(scheme, note=f"npuc {scheme}: symmetric int8 activations (th/127), per-channel conv weights")
    for name, t in qgraph.tensors.items():
        if t.dtype == "int8" and t.quant is not None and t.quant.scheme == "int8_sym" and not t.is_const:
            plan.act[name] = float(t.quant.scale)
    for op in qgraph.ops:
        q = getattr(op.attrs, "quant", None)
        if q is not None and q.mode == "int8":
            _plan_int8_op(plan, qgraph, op, q)
        for i, name in enumerate(op.inputs):
            t = qgraph.tensors.get(name) if name else None
            if t is None or not t.is_const or (op.name, i) in plan.consts or t.quant is None:
                continue
            if t.quant.scheme == "int8_sym":  # an activation-format constant (e.g. an eltwise operand)
                scale = plan.dq_scales.pop((op.name, i), float(t.quant.scale))
                plan.consts[(op.name, i)] = ConstQ(t.data, np.float32(scale))
    return plan


def plan_bm1880(graph: Graph, thresholds: ThresholdMap) -> QdqPlan:
    """BM1880's numbers on the float graph: th/128 activations, per-layer shift weights, int16 bias."""
    th = thresholds.thresholds
    plan = QdqPlan("bm1880_int8", note="bm1880: int8 activations th/128, per-layer power-of-two weight shift")
    for name in [*graph.inputs, *(o for op in graph.ops for o in op.outputs)]:
        if name in th and graph.tensors[name].dtype == "float32":
            plan.act[name] = float(np.float32(th[name]) / np.float32(128.0))
    for op in graph.ops:
        if op.kind not in ("conv2d", "gemm", "matmul") or op.inputs[0] not in th or op.outputs[0] not in th:
            continue
        weight = graph.const(op.inputs[1])
        bias = graph.const(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] else None
        if weight is None or (op.kind == "gemm" and (op.attrs.alpha != 1.0 or op.attrs.beta != 1.0)):
            continue
        tx, ty = float(np.float32(th[op.inputs[0]])), float(np.float32(th[op.outputs[0]]))
        layer = bm1880_quantize_layer(weight, bias, tx, ty)
        pot = float(np.ldexp(1.0, layer.rshift))
        plan.consts[(op.name, 1)] = ConstQ(layer.weight, np.float32(ty / (tx * pot)))
        if layer.bias is not None:
            plan.consts[(op.name, 2)] = ConstQ(layer.bias.astype(np.int32), np.float32(ty / (128.0 * pot)))
    return plan


# a channel's threshold is min(th, CHANNEL_HEADROOM x its max |x| on the calibration samples): one bit of room for
# samples the calibration did not see. Measured on the bpu export (plain QDQ in onnxruntime, calibrated on 16-20
# pictures, judged on as many others; mean output cosine per-tensor -> per-channel at headroom 1 / 2):
# PP-LCNet 0.9927 -> 0.9974 / 0.9962, MTCNN R-Net 0.9956 -> 0.9781 / 0.9969 (its unseen faces pass their
# channels' calibration peaks), O-Net landmarks 0.9903 -> 0.9983 / 0.9937.
CHANNEL_HEADROOM = 2.0


def plan_per_channel(
    graph: Graph, thresholds: ThresholdMap, peaks: Mapping[str, np.ndarray], float_layers: Collection[str] = ()
) -> QdqPlan:
    """Symmetric int8 on the float graph with per-channel activations (hb_mapper's `per_channel` calibration): a
    4-D activation inside the graph with `peaks` (its per-channel max |x| on the calibration samples) gets the scale
    min(th, CHANNEL_HEADROOM·peak)/127 per channel, so no channel clips more than the per-tensor th/127 would there
    and a narrow one keeps its resolution. Per tensor (th/127) stay the graph's inputs and outputs (the contract's
    boundaries) and what a pool reads or writes (onnxruntime fuses DequantizeLinear -> pool -> QuantizeLinear into
    QLinear pools that take one scale). Conv weights int8 per output channel (absmax/127), gemm/matmul weights per
    tensor; biases stay float32. `float_layers` (op or tensor names) and their weights stay float."""
    th = thresholds.thresholds
    producer = {o: op.name for op in graph.ops for o in op.outputs}
    kept = set(float_layers)
    plan = QdqPlan("int8_per_channel", note="npuc bpu int8: per-channel activations min(th, 2 x channel max |x|)/127 "
                   "inside the graph, th/127 at its inputs and outputs, per-channel conv weights")  # fmt: skip
    boundary = {*graph.inputs, *graph.outputs}
    boundary |= {t for op in graph.ops if op.kind in ("pool2d", "global_pool") for t in (op.inputs[0], *op.outputs)}
    for name in [*graph.inputs, *(o for op in graph.ops for o in op.outputs)]:
        if name not in th or graph.tensors[name].dtype != "float32" or {name, producer.get(name)} & kept:
            continue
        t = np.float32(th[name])
        peak = peaks.get(name)
        inside = name not in boundary and peak is not None and len(graph.shape(name)) == 4
        if inside and np.shape(peak) == (graph.shape(name)[1],):
            reach = np.asarray(peak, np.float32) * np.float32(CHANNEL_HEADROOM)
            plan.act[name] = (np.clip(reach, t * np.float32(2.0**-16), t) / np.float32(127.0)).astype(np.float32)
        else:
            plan.act[name] = float(t / np.float32(127.0))
    for op in graph.ops:
        weight = graph.const(op.inputs[1]) if op.kind in ("conv2d", "gemm", "matmul") and len(op.inputs) > 1 else None
        if weight is None or weight.dtype != np.float32 or {op.name, *op.outputs} & kept:
            continue
        per_channel = op.kind == "conv2d"
        peak = np.abs(weight).reshape(weight.shape[0], -1).max(axis=1) if per_channel else np.abs(weight).max()
        scale = (np.where(peak > 0, peak, 1.0) / 127.0).astype(np.float32)
        codes = weight / (scale.reshape(-1, *([1] * (weight.ndim - 1))) if per_channel else scale)
        data = np.clip(np.rint(codes), -127, 127).astype(np.int8)
        plan.consts[(op.name, 1)] = ConstQ(data, scale, 0 if per_channel else None)
    return plan


# ---------------------------------------------------------------------------------------------------------
# Writing


class _Writer:
    def __init__(self, graph: Graph, plan: QdqPlan) -> None:
        self.g, self.plan, self.b = graph, plan, OnnxBuilder(graph)
        self.float_of: dict[str, str] = {}
        self.q_of: dict[str, str] = {}
        self.zero_i8 = self.b.const("zero_point_int8", np.int8(0))

    def quantize(self, name: str, value: str, dq_name: str) -> None:
        """`value` (float) -> Q -> `<name>_q` (int8) -> DQ -> `dq_name` (float); per channel along axis 1 when
        the plan gives the tensor one scale per channel."""
        given = np.asarray(self.plan.act[name], np.float32)
        scale = self.b.const(f"{name}_scale", given)
        zero = self.zero_i8 if given.ndim == 0 else self.b.const(f"{name}_zero_point", np.zeros(given.shape, np.int8))
        axis = {} if given.ndim == 0 else {"axis": 1}
        q = self.b.node("QuantizeLinear", [value, scale, zero], self.b.fresh(f"{name}_q"), **axis)
        self.q_of[name] = q
        self.float_of[name] = self.b.node("DequantizeLinear", [q, scale, zero], dq_name, **axis)

    def const_view(self, op: Op, i: int, name: str) -> str:
        cq = self.plan.consts.get((op.name, i))
        tensor = self.g.tensors[name]
        if cq is None:
            data = tensor.data
            if np.issubdtype(data.dtype, np.floating):
                data = data.astype(np.float32)
            return self.b.const(name, data)
        kind = np.int8 if cq.data.dtype == np.int8 else np.int32
        stored = self.b.const(f"{name}_quantized", np.asarray(cq.data).astype(kind))
        scale = self.b.const(f"{name}_scale", np.asarray(cq.scale, np.float32))
        zero = self.b.const(f"{name}_zero_point", np.zeros(np.shape(cq.scale), kind))
        attrs = {} if cq.axis is None else {"axis": cq.axis}
        return self.b.node("DequantizeLinear", [stored, scale, zero], self.b.fresh(f"{name}_dq"), **attrs)

    def view(self, op: Op, i: int, name: str) -> str:
        if not name:
            return ""
        if self.g.tensors[name].is_const:
            return self.const_view(op, i, name)
        special = self.plan.dq_scales.get((op.name, i))
        if special is None or name not in self.q_of:
            return self.float_of[name]
        scale = self.b.const(f"{name}_scale_{op.name}", np.float32(special))
        return self.b.node("DequantizeLinear", [self.q_of[name], scale, self.zero_i8], self.b.fresh(f"{name}_dq"))

    def lookup(self, op: Op, table: np.ndarray, out: str) -> None:
        """The op's 256-entry table on the input codes (exactly npuc's int8 activation), as float values."""
        codes = self.b.node("Cast", [self.q_of[op.inputs[0]]], to=TensorProto.INT32)
        index = self.b.node("Add", [codes, self.b.const("lut_offset", np.int32(128))])
        order = np.r_[128:256, 0:128]  # table is indexed by the byte: entries for codes -128..127
        values = table[order].astype(np.float32) * np.float32(self.plan.act[out])
        self.b.node("Gather", [self.b.const(f"{op.name}_lut", values), index], out, axis=0)

    def emit(self, op: Op) -> None:
        if len(op.outputs) != 1:
            raise UnsupportedError(f"op '{op.name}' ({op.kind}) has {len(op.outputs)} outputs; QDQ export needs one")
        out = op.outputs[0]
        if op.name in self.plan.luts and op.inputs[0] in self.q_of and out in self.plan.act:
            pre = self.b.fresh(f"{out}_float") if out in self.g.outputs else out
            self.b.used.add(pre)
            self.lookup(op, self.plan.luts[op.name], pre)
            self.quantize(out, pre, out if out in self.g.outputs else self.b.fresh(f"{out}_dq"))
            return
        ins = [self.view(op, i, n) for i, n in enumerate(op.inputs)]
        if out not in self.plan.act:
            EMITTERS[op.kind](self.b, op, ins, out)
            self.b.used.add(out)
            self.float_of[out] = out
            return
        is_output = out in self.g.outputs
        pre = self.b.fresh(f"{out}_float") if is_output else out
        self.b.used.add(pre)
        EMITTERS[op.kind](self.b, op, ins, pre)
        self.quantize(out, pre, out if is_output else self.b.fresh(f"{out}_dq"))


def _graph_input(w: _Writer, name: str, prologue: InputPrologue | None) -> onnx.ValueInfoProto:
    value, info = input_value(w.b, w.g, name, prologue.affine if prologue is not None else None)
    if name in w.plan.act:
        w.quantize(name, value, w.b.fresh(f"{name}_dq"))
    else:
        w.float_of[name] = value
    return info


def _output_type(graph: Graph, name: str) -> int:
    """Float32, or the integer type of an output that passes integers through (a model returning its token ids)."""
    dtype = np.dtype(graph.tensors[name].dtype)
    return helper.np_dtype_to_tensor_dtype(dtype) if dtype.kind in "iub" else TensorProto.FLOAT


def onnx_model(
    graph: Graph, b: OnnxBuilder, inputs: list[onnx.ValueInfoProto], name: str | None, doc: str,
    value_info: list[onnx.ValueInfoProto] | None = None,
) -> onnx.ModelProto:  # fmt: skip
    outputs = [helper.make_tensor_value_info(o, _output_type(graph, o), list(graph.shape(o))) for o in graph.outputs]
    onnx_graph = helper.make_graph(
        b.nodes, name or graph.name, inputs, outputs, initializer=list(b.initializers.values()), value_info=value_info
    )
    model = helper.make_model(
        onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="npuc", ir_version=8
    )
    model.doc_string = doc
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise RuntimeError(f"npuc wrote an invalid QDQ model: {str(exc).splitlines()[0]}") from None
    return model


def write_qdq(
    graph: Graph, plan: QdqPlan, name: str | None = None, prologues: Mapping[str, InputPrologue] | None = None
) -> onnx.ModelProto:
    """The plain QDQ ONNX model of `graph` (float or made by passes.quantization.quantize) with `plan`'s numbers."""
    w = _Writer(graph, plan)
    prologues = prologues or {}
    inputs = [_graph_input(w, n, prologues.get(n)) for n in graph.inputs]
    for op in graph.ops:
        with per_op(op):
            w.emit(op)
    stop_if_gaps()
    for out in graph.outputs:
        if w.float_of.get(out) != out:  # an output that is also an input, or renamed: give it its name
            w.b.node("Identity", [w.float_of[out]], out)
    return onnx_model(graph, w.b, inputs, name, plan.note)


def write_qdq_exact(
    qgraph: Graph,
    name: str | None = None,
    prologues: Mapping[str, InputPrologue] | None = None,
    output_dequant: str = "bf16",
    note: str = "",
) -> onnx.ModelProto:
    """The exact form of a graph made by `passes.quantization.quantize(..., "cv18xx_int8")`
    (passes/export/qdq_exact.py): every int8 tensor of npuc's reference appears under its IR name with the same codes.
    `output_dequant`: how int8 graph outputs are dequantized, "bf16" (the TPU) or "float32" (q·th/127, the hbDNN SCALE
    rule)."""
    e = ExactBuilder(qgraph)
    prologues = prologues or {}
    values, inputs = {}, []
    for n in qgraph.inputs:
        prologue = prologues.get(n)
        values[n], info = input_value(e.b, qgraph, n, prologue.affine if prologue is not None else None)
        inputs.append(info)
    written = write_exact_nodes(e, qgraph, values, output_dequant)
    for out in qgraph.outputs:
        if written.get(out) != out:
            e.b.node("Identity", [written[out]], out)
    doc = note or EXACT_NOTE
    return onnx_model(qgraph, e.b, inputs, name, doc, int8_value_infos(qgraph))


# ---------------------------------------------------------------------------------------------------------
# Per target


def thresholds_for_model(graph: Graph, table: CalibrationTable, model_path: str | Path | None) -> ThresholdMap:
    """`thresholds_for_graph` with the ONNX model's tpu-mlir row names (a BatchNormalization folded into its
    conv keeps one tensor name in the IR and another in the table); warns about what stays unmatched."""
    names = tensor_table_names(load_model(model_path)) if model_path is not None else None
    return thresholds_for_graph(graph, table, warn=True, table_names=names)


def _symmetric(graph: Graph, table: ThresholdMap, float_layers: tuple[str, ...]) -> tuple[Graph, QdqPlan]:
    qgraph = quantize(graph, table, "cv18xx_int8", float_layers)
    return qgraph, plan_from_quantized(qgraph)


def _fp16_target(target: str) -> PlanMaker:
    def make(graph: Graph, table: ThresholdMap, float_layers: tuple[str, ...]) -> tuple[Graph, QdqPlan]:
        qgraph, plan = _symmetric(graph, table, float_layers)
        plan.note = f"{target} runs fp16; this model shows npuc's symmetric int8 (cv18xx_int8 numerics) instead"
        return qgraph, plan

    return make


PlanMaker = Callable[[Graph, ThresholdMap, tuple[str, ...]], tuple[Graph, QdqPlan]]
TARGET_PLANS: Mapping[str, PlanMaker] = MappingProxyType(
    {
        "cv18xx": _symmetric,
        "bpu": _symmetric,
        "bm1880": lambda graph, table, fl: (graph, plan_bm1880(graph, table)),
        "lyngor": _fp16_target("lyngor"),
        "dmp": _fp16_target("dmp"),
    }
)


FORMS = ("exact", "plain")
EXACT_NOTE = (
    "exact form: int8 tensors are integer codes computed as npuc's reference does (ConvInteger/MatMulInteger, "
    "int64 QDM requantization, LUT gathers); boundaries are QuantizeLinear/DequantizeLinear"
)


@dataclass(frozen=True)
class ExportRequest:
    """What an exact-form writer gets: the float graph, the table, and the export options."""

    graph: Graph
    target: str
    table: CalibrationTable
    float_layers: tuple[str, ...]
    prologues: Mapping[str, InputPrologue] | None
    model_path: str | Path | None
    output_dequant: str
    options: Mapping[str, object] = field(default_factory=dict)  # `--option`s, those the writer registered


def _exact_symmetric(req: ExportRequest) -> onnx.ModelProto:
    """The targets whose int8 is passes.quantization.quantize's cv18xx_int8 graph, transcribed op by op."""
    thresholds = thresholds_for_model(req.graph, req.table, req.model_path)
    qgraph, plan = TARGET_PLANS[req.target](req.graph, thresholds, req.float_layers)
    note = f"{plan.note}; {EXACT_NOTE}"
    return write_qdq_exact(qgraph, req.graph.name, req.prologues, req.output_dequant, note)


ExactWriter = Callable[[ExportRequest], onnx.ModelProto]
# A target whose int8 is not the cv18xx_int8 graph registers its own writer from a module listed here (bm1880:
# its backend's lowering), as compiler/targets.TARGET_MODULES lists the targets.
EXACT_WRITER_MODULES = ("npuc.backends.bm1880.qdq",)
_EXACT_WRITERS: dict[str, ExactWriter] = {
    "cv18xx": _exact_symmetric,
    "bpu": _exact_symmetric,
    "lyngor": _exact_symmetric,
    "dmp": _exact_symmetric,
}
_EXACT_OPTIONS: dict[str, tuple[str, ...]] = {}  # target -> the `--option` keys its exact writer reads


def register_exact_writer(target: str, writer: ExactWriter, options: tuple[str, ...] = ()) -> None:
    _EXACT_WRITERS[target] = writer
    _EXACT_OPTIONS[target] = options


def exact_writers() -> Mapping[str, ExactWriter]:
    """The exact-form writer of each target."""
    for module in EXACT_WRITER_MODULES:
        importlib.import_module(module)
    return MappingProxyType(_EXACT_WRITERS)


def default_form(target: str) -> str:
    return "exact" if target in exact_writers() else "plain"


def split_into_slices(graph: Graph) -> Graph:
    """The graph with every multi-output split written as one slice per output (the same values): the QDQ
    writers quantize op by op, one output each (YOLO's C2f blocks and heads split)."""
    from dataclasses import replace

    from npuc.compiler.ops import Slice

    ops: list[Op] = []
    for op in graph.ops:
        if op.kind != "split" or len(op.outputs) < 2:
            ops.append(op)
            continue
        starts = np.cumsum((0, *op.attrs.sizes))
        axis = op.attrs.axis % len(graph.shape(op.inputs[0]))
        for k, out in enumerate(op.outputs):
            attrs = Slice((int(starts[k]),), (int(starts[k + 1]),), (axis,), (1,))
            ops.append(Op(f"{op.name}_{k}" if k else op.name, "slice", [op.inputs[0]], [out], attrs))
    return replace(graph, ops=ops)


def _check_options(options: Mapping[str, object], known: tuple[str, ...], reader: str) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        reads = f"it reads {', '.join(known)}" if known else "it reads none"
        raise UserError(f"--option {unknown[0]} is not read by {reader} ({reads}); drop it")


def qdq_for_target(
    graph: Graph,
    target: str,
    table: CalibrationTable,
    float_layers: tuple[str, ...] = (),
    prologues: Mapping[str, InputPrologue] | None = None,
    model_path: str | Path | None = None,
    form: str | None = None,
    output_dequant: str = "bf16",
    options: Mapping[str, object] | None = None,
) -> onnx.ModelProto:
    """The QDQ model of the float `graph` as `target` quantizes it with `table` (`model_path`: the ONNX file
    the graph came from, to match table names of folded tensors). `form`: "exact" (integer ops that
    reproduce npuc's int8 — for bm1880 the bmodel's arithmetic; the default) or "plain" (float ops between
    QuantizeLinear/DequantizeLinear pairs, for tools that expect pure QDQ). `output_dequant` applies to the
    cv18xx_int8 exact form (bm1880 outputs are always q·T/128 in float32, as its runner gives them). `options`:
    the target's export options (bm1880's exact form: weight_scale, as `npuc build --option`); one the form
    does not read is an error."""
    if target not in TARGET_PLANS:
        raise UserError(f"no QDQ export for target '{target}'; choose one of {', '.join(sorted(TARGET_PLANS))}")
    form = form or default_form(target)
    if form not in FORMS:
        raise UserError(f"unknown QDQ form '{form}'; choose one of {', '.join(FORMS)}")
    graph = split_into_slices(graph)
    options = dict(options or {})
    if form == "exact":
        writers = exact_writers()
        if target not in writers:
            raise UserError(f"target '{target}' has no exact QDQ form; use --form plain")
        _check_options(options, _EXACT_OPTIONS.get(target, ()), f"the exact form of target '{target}'")
        request = ExportRequest(graph, target, table, tuple(float_layers), prologues, model_path, output_dequant,
                                options)  # fmt: skip
        return writers[target](request)
    _check_options(options, (), "the plain form")
    thresholds = thresholds_for_model(graph, table, model_path)
    qgraph, plan = TARGET_PLANS[target](graph, thresholds, tuple(float_layers))
    return write_qdq(qgraph, plan, graph.name, prologues)
