"""Annotate a float graph with a target's number formats: the quantize pass (specs/quant.md §1.4-1.5).

A scheme is data: per op kind, a rule that picks the op's input and output formats, converts its constants
(int8 weights, int32 bias, bf16 copies) and computes its integer parameters (`OpQuant`). An op a scheme has no
rule for, one whose thresholds are missing, and every op named in `float_layers` runs in the scheme's
fallback (bf16 for cv18xx). Where neighbouring ops disagree on a tensor's format a `cast` op is inserted, and
the graph's inputs and outputs stay float32 (quantized on entry by the CPU `quant` rule, dequantized on exit).

Thresholds: the IR keeps ONNX tensor names (a fused op's output is the last fused node's output), while
tpu-mlir's tables name tensors `<onnx tensor>_<OpType>`; `thresholds_for_graph` maps one onto the other.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from npuc.compiler import ops
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op, QuantParams
from npuc.compiler.kernels.activation import apply_activation
from npuc.compiler.kernels.quantized.bf16_conv import conv_filter_as_transposed, transposed_conv_filter
from npuc.compiler.kernels.quantized.int8 import window_cell_counts
from npuc.compiler.kernels.quantized.params import OpQuant, with_quant
from npuc.passes.calitable import CalibrationTable
from npuc.passes.fixedpoint import (
    cv18xx_eltwise_multipliers,
    cv18xx_per_tensor_multiplier,
    cv18xx_qdm_multiplier,
    cv18xx_quantize_activation,
    cv18xx_quantize_bias_int32,
    cv18xx_quantize_conv,
    round_half_away,
    round_to_bf16,
)

BF16 = QuantParams("bf16")
_SUFFIX = re.compile(r"^(.*)_([A-Z][A-Za-z0-9]*)$")  # tpu-mlir appends `_<OpType>` to tensor names


def int8_params(threshold: float) -> QuantParams:
    th = float(np.float32(threshold))
    return QuantParams("int8_sym", np.float32(th / 127.0), threshold=th, min=-th, max=th)


# ---------------------------------------------------------------------------------------------------------
# Calibration table names -> IR tensor names


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


def thresholds_for_graph(
    graph: Graph, table: CalibrationTable, warn: bool = True, table_names: Mapping[str, str] | None = None
) -> ThresholdMap:
    """Match table rows to tensors: exact name, else the name without its `_<OpType>` suffix (which may
    also name the op that produces a renamed, fused tensor). `table_names` (source tensor -> table row, as
    `passes.calibrate.tensor_table_names` gives for the source model) is tried first: it knows which row a
    BN-folded tensor went under. Unknown and missing names are listed, warned about once, and skipped."""
    result = ThresholdMap()
    rows = table.thresholds()
    used: set[str] = set()
    for tensor, row in (table_names or {}).items():
        if tensor in graph.tensors and row in rows:
            result.thresholds[tensor] = rows[row]
            used.add(row)
    producers = {op.name: op for op in graph.ops}
    by_op_name: dict[str, float] = {}
    for name, th in rows.items():
        if name in used:
            continue
        stem = m.group(1) if (m := _SUFFIX.match(name)) else None
        if name in graph.tensors:
            result.thresholds.setdefault(name, th)
        elif stem is not None and stem in graph.tensors:
            result.thresholds.setdefault(stem, th)
        elif stem is not None and stem in producers:
            by_op_name[stem] = th
        else:
            result.unknown.append(name)
    for op_name, th in by_op_name.items():
        out = producers[op_name].outputs[0]
        if out not in result.thresholds:
            result.thresholds[out] = th
        else:
            result.pre_activation[op_name] = th
    activations = [*graph.inputs, *(out for op in graph.ops for out in op.outputs)]
    result.missing = [n for n in activations if n not in result.thresholds and graph.tensors[n].dtype == "float32"]
    if warn and (result.unknown or result.missing):
        warnings.warn(
            f"calibration table: {len(result.unknown)} unknown name(s) {result.unknown[:8]}, "
            f"{len(result.missing)} tensor(s) without a threshold {result.missing[:8]}; "
            "ops reading or writing those run in the fallback format",
            stacklevel=2,
        )
    return result


# ---------------------------------------------------------------------------------------------------------
# The rewriting context shared by the rules


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
            return self.const(f"{name}_bf16", round_to_bf16(tensor.data), BF16)
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


# ---------------------------------------------------------------------------------------------------------
# cv18xx int8 rules


def _relu_max(act: ops.Activation | None, th_y: float) -> int | None:
    """int8 upper bound of a fused relu6-style clip (None: plain relu or no clip)."""
    if act is None or act.kind != "clip" or not np.isfinite(act.hi):
        return None
    return int(min(127, round_half_away(np.float32(act.hi) * (np.float32(127) / np.float32(th_y)))))


def _int8_act_ok(op: Op) -> bool:
    act = ops.fused_act(op)
    return act is None or act.kind == "relu" or (act.kind == "clip" and act.lo == 0.0)


def _thresholds(ctx: QuantContext, op: Op, names: Iterable[str]) -> list[float] | None:
    values = [ctx.threshold(n) for n in names]
    return None if any(v is None for v in values) else [float(v) for v in values]


def _int8_conv(ctx: QuantContext, op: Op) -> Lowered | None:
    """Per output channel of the conv the TIU runs. A transposed conv runs as a conv with flipped,
    channel-swapped filters; its int8 filters are stored back in the ConvTranspose layout (IC, OC/group, KH, KW)."""
    g = ctx.graph
    th = _thresholds(ctx, op, [op.inputs[0], op.outputs[0]])
    weight = g.const(op.inputs[1])
    bias = g.const(op.inputs[2]) if len(op.inputs) > 2 else None
    if th is None or weight is None or (len(op.inputs) > 2 and bias is None) or not _int8_act_ok(op):
        return None
    transposed = op.kind == "conv_transpose2d"
    if transposed:
        weight = transposed_conv_filter(weight, op.attrs.group)
    p = cv18xx_quantize_conv(weight, bias, th[0], th[1])
    w_q = conv_filter_as_transposed(p.weight, op.attrs.group) if transposed else p.weight
    inputs = [ctx.as_int8(op.inputs[0]), ctx.const(f"{op.inputs[1]}_int8", w_q, None)]
    if p.bias is not None:
        inputs.append(ctx.const(f"{op.inputs[2]}_int32", p.bias, None))
    q = OpQuant("int8", (int8_params(th[0]),), int8_params(th[1]), p.multiplier, p.rshift)
    q.relu_max = _relu_max(ops.fused_act(op), th[1])
    return Lowered(inputs, q)


def _int8_gemm(ctx: QuantContext, op: Op) -> Lowered | None:
    """FC: one QDM multiplier for the whole weight (tpu-mlir's per-tensor FC), int32 bias."""
    g = ctx.graph
    th = _thresholds(ctx, op, [op.inputs[0], op.outputs[0]])
    weight = g.const(op.inputs[1])
    bias = g.const(op.inputs[2]) if len(op.inputs) > 2 else None
    if op.kind == "gemm" and (op.attrs.alpha != 1.0 or (bias is not None and op.attrs.beta != 1.0)):
        return None
    if th is None or weight is None or (len(op.inputs) > 2 and bias is None) or not _int8_act_ok(op):
        return None
    peak_bias = None if bias is None else np.abs(bias).max(keepdims=True).reshape(1)
    p = cv18xx_quantize_conv(weight.reshape(1, -1), peak_bias, th[0], th[1])
    inputs = [ctx.as_int8(op.inputs[0]), ctx.const(f"{op.inputs[1]}_int8", p.weight.reshape(weight.shape), None)]
    if bias is not None:
        scale = 127.0 / float(np.float32(th[1])) * np.ldexp(1.0, int(p.rshift[0]) + 31) / float(p.multiplier[0])
        inputs.append(ctx.const(f"{op.inputs[2]}_int32", cv18xx_quantize_bias_int32(bias, scale), None))
    q = OpQuant("int8", (int8_params(th[0]),), int8_params(th[1]), p.multiplier, p.rshift)
    q.relu_max = _relu_max(ops.fused_act(op), th[1])
    return Lowered(inputs, q)


_ELTWISE_COEFFS = MappingProxyType({"add": 1.0, "sub": -1.0, "max": 1.0, "min": 1.0})


def _int8_eltwise(ctx: QuantContext, op: Op) -> Lowered | None:
    kind = op.attrs.kind
    th = _thresholds(ctx, op, [*op.inputs, op.outputs[0]])
    if th is None or not _int8_act_ok(op) or kind not in (*_ELTWISE_COEFFS, "mul"):
        return None
    th_in, th_out = th[:-1], th[-1]
    if kind == "mul":
        real = np.prod(np.float64(th_in)) / (127.0 ** (len(th_in) - 1) * th_out)
        multiplier, rshift = cv18xx_qdm_multiplier(np.array([real]))
    else:
        coeffs = np.array([1.0] + [_ELTWISE_COEFFS[kind]] * (len(th_in) - 1), np.float32)
        multiplier, rshift = cv18xx_eltwise_multipliers(np.array(th_in, np.float32), th_out, coeffs)
    q = OpQuant("int8", tuple(int8_params(t) for t in th_in), int8_params(th_out), multiplier, np.asarray(rshift))
    q.relu_max = _relu_max(ops.fused_act(op), th_out)
    return Lowered([ctx.as_int8(n) for n in op.inputs], q)


def _requant_factors(th_in: list[float], th_out: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-input (multiplier, rshift) taking each input to the output threshold; (1, 0) when equal."""
    mults, shifts = [], []
    for t in th_in:
        if np.float32(t) == np.float32(th_out):
            mults.append(1), shifts.append(0)
            continue
        m, r = cv18xx_per_tensor_multiplier(np.float32(t) / np.float32(th_out), 127)
        mults.append(int(m)), shifts.append(int(r))
    return np.array(mults, np.int64), np.array(shifts, np.int64)


def _int8_concat(ctx: QuantContext, op: Op) -> Lowered | None:
    th_in = _thresholds(ctx, op, op.inputs)
    if th_in is None:
        return None
    th_out = ctx.th.thresholds.get(op.outputs[0], max(th_in))
    multiplier, rshift = _requant_factors(th_in, th_out)
    q = OpQuant("int8", tuple(int8_params(t) for t in th_in), int8_params(th_out), multiplier, rshift)
    return Lowered([ctx.as_int8(n) for n in op.inputs], q)


def _int8_passthrough(ctx: QuantContext, op: Op) -> Lowered | None:
    """Ops that only move or select codes: the output keeps the input threshold (forward calibration)."""
    th = ctx.threshold(op.inputs[0])
    if th is None or getattr(op.attrs, "act", None) is not None and not _int8_act_ok(op):
        return None
    if op.kind == "pad" and (op.attrs.mode != "constant" or op.attrs.value != 0.0):
        return None
    return Lowered([ctx.as_int8(op.inputs[0]), *op.inputs[1:]], OpQuant("int8", (int8_params(th),), int8_params(th)))


def _int8_pool(ctx: QuantContext, op: Op) -> Lowered | None:
    if op.attrs.mode == "max":
        return _int8_passthrough(ctx, op)
    th = _thresholds(ctx, op, [op.inputs[0], op.outputs[0]])
    if th is None or not _int8_act_ok(op):
        return None
    shape = ctx.graph.shape(op.inputs[0])
    count = op.attrs.kernel[0] * op.attrs.kernel[1] if op.kind == "pool2d" else int(np.prod(shape[2:]))
    ratio = np.float32(th[0]) / np.float32(th[1])
    multiplier, rshift = cv18xx_per_tensor_multiplier(ratio / count, 127)
    q = OpQuant("int8", (int8_params(th[0]),), int8_params(th[1]), multiplier, rshift)
    # windows that count fewer cells (padding excluded, ceil_mode overhang): one pair per output position
    counts = window_cell_counts(op, shape[2:], ctx.graph.shape(op.outputs[0])[2:])
    if counts is not None:
        q.position_multiplier, q.position_rshift = cv18xx_per_tensor_multiplier(
            ratio / np.maximum(counts, 1).astype(np.float32), 127
        )
    q.relu_max = _relu_max(getattr(op.attrs, "act", None), th[1])
    return Lowered([ctx.as_int8(op.inputs[0])], q)


def int8_lut(fn: Callable[[np.ndarray], np.ndarray], th_x: float, th_y: float) -> np.ndarray:
    """256 int8 entries indexed by the input byte: `q(f(i·th_x/127))` for every code i."""
    codes = np.arange(256, dtype=np.int64)
    codes = np.where(codes < 128, codes, codes - 256)
    x = codes.astype(np.float32) * (np.float32(th_x) / np.float32(127))
    return cv18xx_quantize_activation(fn(x).astype(np.float32), th_y)


def _int8_activation(ctx: QuantContext, op: Op) -> Lowered | None:
    act = op.attrs.act if op.kind == "activation" else None
    th_x = ctx.threshold(op.inputs[0])
    th_y = 1.0 if act is not None and act.kind == "sigmoid" else ctx.th.thresholds.get(op.outputs[0])
    if act is not None and act.kind == "relu" and th_y is None:
        th_y = th_x
    if th_x is None or th_y is None:
        return None
    if op.kind == "lut":
        table = np.asarray(op.attrs.table, np.int8)
    elif act.kind == "relu" and np.float32(th_x) == np.float32(th_y):
        table = None
    else:
        table = int8_lut(lambda x: apply_activation(x, act), th_x, th_y)
    return Lowered([ctx.as_int8(op.inputs[0])], OpQuant("int8", (int8_params(th_x),), int8_params(th_y), lut=table))


def _scale_factors(scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A real per-channel scale as (int8 weight, QDM multiplier, rshift): weight = ±ceil(|s|) so the QDM
    part |s| / ceil(|s|) stays at most 1 (a zero scale keeps weight 1 and multiplies by 0)."""
    scale = np.asarray(scale, np.float64)
    magnitude = np.maximum(np.ceil(np.abs(scale)), 1.0)
    if magnitude.max() > 127:
        raise UserError(f"a PReLU rescale factor of {magnitude.max():g} does not fit an int8 weight")
    weight = np.where(scale < 0, -magnitude, magnitude).astype(np.int8)
    multiplier, rshift = cv18xx_qdm_multiplier(np.abs(scale) / magnitude)
    multiplier = np.where(scale == 0, 0, multiplier)
    return weight, np.asarray(multiplier, np.int64), np.asarray(rshift, np.int64)


def _int8_prelu(ctx: QuantContext, op: Op) -> Lowered | None:
    """y = q(x+ · th_x/th_y) + q(x- · slope_c · th_x/th_y): each half a per-channel 1x1 depthwise requant."""
    th = _thresholds(ctx, op, [op.inputs[0], op.outputs[0]])
    slope = ctx.graph.const(op.inputs[1])
    channels = ctx.graph.shape(op.inputs[0])[1] if len(ctx.graph.shape(op.inputs[0])) > 1 else 1
    if th is None or slope is None or slope.size not in (1, channels):
        return None
    ratio = np.float64(np.float32(th[0])) / np.float64(np.float32(th[1]))
    slopes = np.broadcast_to(np.asarray(slope, np.float64).reshape(-1), (channels,))
    w_pos, m_pos, r_pos = _scale_factors(np.full(channels, ratio))
    w_neg, m_neg, r_neg = _scale_factors(slopes * ratio)
    weights = ctx.const(f"{op.inputs[1]}_int8", np.stack([w_pos, w_neg]), None)
    q = OpQuant("int8", (int8_params(th[0]),), int8_params(th[1]), np.stack([m_pos, m_neg]), np.stack([r_pos, r_neg]))
    return Lowered([ctx.as_int8(op.inputs[0]), weights], q)


CV18XX_INT8_RULES: Mapping[str, Rule] = MappingProxyType(
    {
        "prelu": _int8_prelu,
        "conv2d": _int8_conv,
        "conv_transpose2d": _int8_conv,
        "gemm": _int8_gemm,
        "matmul": _int8_gemm,
        "eltwise": _int8_eltwise,
        "concat": _int8_concat,
        "pool2d": _int8_pool,
        "global_pool": _int8_pool,
        "activation": _int8_activation,
        "lut": _int8_activation,
        **{kind: _int8_passthrough for kind in ("reshape", "transpose", "slice", "pad", "expand", "gather")},
    }
)


# ---------------------------------------------------------------------------------------------------------
# bf16 rule: every op, float constants rounded to bf16 (a conv/gemm bias stays fp32, as the TIU adds it)

_FP32_BIAS_KINDS = ("conv2d", "conv_transpose2d", "gemm")


def _bf16_any(ctx: QuantContext, op: Op) -> Lowered | None:
    inputs = []
    for i, name in enumerate(op.inputs):
        if not name:
            inputs.append(name)
        elif i == 2 and op.kind in _FP32_BIAS_KINDS and ctx.graph.tensors[name].is_const:
            inputs.append(name)
        else:
            inputs.append(ctx.as_bf16(name))
    formats = tuple(ctx.format_of(n) if n else None for n in inputs)
    return Lowered(inputs, OpQuant("bf16", formats, BF16))


_BF16_RULES: Mapping[str, Rule] = MappingProxyType({kind: _bf16_any for kind in ops.OPS})

SCHEMES: Mapping[str, Scheme] = MappingProxyType(
    {
        "cv18xx_int8": Scheme("cv18xx_int8", CV18XX_INT8_RULES, fallback="cv18xx_bf16"),
        "cv18xx_bf16": Scheme("cv18xx_bf16", _BF16_RULES),
    }
)


# ---------------------------------------------------------------------------------------------------------
# The pass


def _bf16_act_ok(op: Op) -> bool:
    """A fused activation every bf16 TIU op applies itself: ReLU (its relu flag), nothing else."""
    act = ops.fused_act(op)
    return act is None or act.kind == "relu" or (act.kind == "clip" and act.lo == 0.0 and act.hi == np.inf)


def _unfuse_activations(graph: Graph, keeps: Callable[[Op], bool]) -> list[str]:
    """Split fused activations an op cannot apply itself (`keeps(op)` false) into their own op; returns the
    names of the new activation ops."""
    added = []
    for op in list(graph.ops):
        act = ops.fused_act(op)
        if act is None or op.kind == "activation" or keeps(op):
            continue
        mid = graph.unique_name(f"{op.name}_preact")
        graph.add_tensor(mid, graph.shape(op.outputs[0]), graph.tensors[op.outputs[0]].dtype)
        out = op.outputs[0]
        op.attrs = copy.copy(op.attrs)
        op.attrs.act = None
        op.outputs = [mid]
        graph.ops.insert(
            graph.ops.index(op) + 1, Op(f"{op.name}_act", "activation", [mid], [out], ops.ActivationOp(act))
        )
        added.append(f"{op.name}_act")
    return added


def quantize(
    graph: Graph,
    table: CalibrationTable | ThresholdMap | None,
    scheme: str,
    float_layers: Iterable[str] = (),
    table_names: Mapping[str, str] | None = None,
) -> Graph:
    """A quantized copy of `graph` (the float graph is left untouched) for `interp.run(..., QUANT_KERNELS)`.

    `float_layers`: op names or output tensor names kept in the scheme's fallback format (bf16 for cv18xx).
    """
    if scheme not in SCHEMES:
        raise UserError(f"unknown quantization scheme '{scheme}'; choose one of {sorted(SCHEMES)}")
    main = SCHEMES[scheme]
    fallback = SCHEMES[main.fallback] if main.fallback else None
    qgraph = copy.deepcopy(graph)
    if isinstance(table, CalibrationTable):
        thresholds = thresholds_for_graph(qgraph, table, table_names=table_names)
    else:
        thresholds = copy.deepcopy(table) if table is not None else ThresholdMap()  # never edit the caller's
    keep_float = set(float_layers)
    if main.fallback is not None:
        # int8 ops keep ReLU and ReLU6; an op kept in bf16 keeps ReLU only, its split activation stays bf16
        floated = {op.name for op in qgraph.ops if keep_float & {op.name, *op.outputs}}

        def keeps(op: Op) -> bool:
            return op.kind not in main.rules or (_bf16_act_ok if op.name in floated else _int8_act_ok)(op)

        added = _unfuse_activations(qgraph, keeps)
        keep_float |= floated | {name for name in added if name.removesuffix("_act") in floated}
        for op in qgraph.ops:  # the pre-activation tensors now have names of their own
            if op.name in thresholds.pre_activation:
                thresholds.thresholds.setdefault(op.outputs[0], thresholds.pre_activation[op.name])
    else:
        _unfuse_activations(qgraph, _bf16_act_ok)
    ctx = QuantContext(qgraph, thresholds)
    new_ops: list[Op] = []
    for op in qgraph.ops:
        rule = None if keep_float & {op.name, *op.outputs} else main.rules.get(op.kind)
        lowered = rule(ctx, op) if rule is not None else None
        if lowered is None and fallback is not None:
            lowered = fallback.rules[op.kind](ctx, op)
        if lowered is None:
            raise UserError(f"op '{op.name}' ({op.kind}) cannot be quantized by scheme '{scheme}'")
        new_ops += ctx.pending
        ctx.pending = []
        op.inputs = lowered.inputs
        op.attrs = with_quant(op.attrs, lowered.quant)
        for out in op.outputs:
            _annotate_output(ctx, out, lowered.quant)
        new_ops.append(op)
    qgraph.ops = new_ops
    _dequantize_outputs(ctx)
    qgraph.ops += ctx.pending
    qgraph.prune()
    return qgraph


def _annotate_output(ctx: QuantContext, name: str, quant: OpQuant) -> None:
    tensor = ctx.graph.tensors[name]
    if quant.mode == "int8":
        tensor.dtype, tensor.quant = "int8", quant.output
    elif tensor.dtype == "float32":
        tensor.quant = quant.output
    else:
        return
    ctx.formats[name] = tensor.quant


def _dequantize_outputs(ctx: QuantContext) -> None:
    """Graph outputs keep their names and float32: the producer's tensor is renamed, a cast takes its place."""
    g = ctx.graph
    for name in list(g.outputs):
        fmt = ctx.formats.get(name)
        if fmt is None:
            continue
        inner = g.unique_name(f"{name}_{'i8' if fmt.scheme == 'int8_sym' else 'bf16'}")
        g.tensors[inner] = copy.copy(g.tensors[name])
        g.tensors[inner].name = inner
        for op in g.ops:
            op.inputs = [inner if n == name else n for n in op.inputs]
            op.outputs = [inner if n == name else n for n in op.outputs]
        g.tensors[name].dtype, g.tensors[name].quant = "float32", None
        attrs = with_quant(ops.Cast("float32"), OpQuant("cast", (fmt,), None))
        ctx.pending.append(Op(f"{name}_dequant", "cast", [inner], [name], attrs))
        ctx.formats[inner] = fmt
