"""Annotate a float graph with a target's number formats: the quantize pass (specs/quant.md §1.4-1.5).

A scheme is data: per op kind, a rule that picks the op's input and output formats, converts its constants
(int8 weights, int32 bias, bf16 copies) and computes its integer parameters (`OpQuant`). An op a scheme has no
rule for, one whose thresholds are missing, and every op named in `float_layers` runs in the scheme's
fallback (bf16 for cv18xx). Where neighbouring ops disagree on a tensor's format a `cast` op is inserted, and
the graph's inputs and outputs stay float32 (quantized on entry by the CPU `quant` rule, dequantized on exit).
The rules live in backends/cv18xx/rules.py, what they share (formats, the rewriting context) in
passes/quantization/quant_context.py; this module matches thresholds to tensors, holds the schemes and runs the pass.

Thresholds: the IR keeps ONNX tensor names (a fused op's output is the last fused node's output), while
tpu-mlir's tables name tensors `<onnx tensor>_<OpType>`; `thresholds_for_graph` maps one onto the other.
"""

from __future__ import annotations

import copy
import importlib
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from npuc.compiler import ops
from npuc.compiler.coverage import per_op, stop_if_gaps
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op
from npuc.compiler.kernels.quantized.params import OpQuant, with_quant
from npuc.passes.calibration.calitable import CalibrationTable
from npuc.passes.quantization.quant_context import QuantContext, Scheme, ThresholdMap

_SUFFIX = re.compile(r"^(.*)_([A-Z][A-Za-z0-9]*)$")  # tpu-mlir appends `_<OpType>` to tensor names


# ---------------------------------------------------------------------------------------------------------
# Calibration table names -> IR tensor names


def thresholds_for_graph(
    graph: Graph, table: CalibrationTable, warn: bool = True, table_names: Mapping[str, str] | None = None
) -> ThresholdMap:
    """Match table rows to tensors: exact name, else the name without its `_<OpType>` suffix (which may
    also name the op that produces a renamed, fused tensor). `table_names` (source tensor -> table row, as
    `passes.calibration.calibrate.tensor_table_names` gives for the source model) is tried first: it knows which row a
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
    for op in graph.ops:  # reshapes and transposes move values, never change them: their input's range holds
        if (
            op.kind in ("reshape", "transpose")
            and op.outputs[0] not in result.thresholds
            and op.inputs[0] in (result.thresholds)
        ):
            result.thresholds[op.outputs[0]] = result.thresholds[op.inputs[0]]
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


FEW_MISSING = 4  # a table may lack this many tensors (or a tenth of them), e.g. inputs the model only casts


def _check_table_fits(graph: Graph, thresholds: ThresholdMap, partial: bool,
                      source: Mapping[str, str] | None) -> None:  # fmt: skip
    """A table made for another model is an error; a few tensors without a threshold (and rows that name
    nothing here) are a note: the ops reading or writing them run in the fallback format. With `source`
    (the source model's tensors), tensors a backend made (an unrolled LSTM's) are not the table's to know."""
    activations = [*graph.inputs, *(out for op in graph.ops for out in op.outputs)]
    known = {n for n in activations if graph.tensors[n].dtype == "float32" and (source is None or n in source)}
    total = len(known)
    missing, unknown = [n for n in thresholds.missing if n in known], thresholds.unknown
    if len(missing) > max(FEW_MISSING, total // 10) and not partial:
        raise UserError(
            f"the calibration table was made for another model: {len(missing)} of this model's {total} tensors "
            f"have no threshold (e.g. {', '.join(missing[:3])}) and {len(unknown)} of its rows name none; "
            "calibrate this model (`npuc calibrate`), or pass --allow-partial-table to run those ops in bf16"
        )
    parts = []
    if missing:
        shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
        parts.append(f"{len(missing)} tensor(s) without a threshold ({shown}) run in the fallback format")
    if unknown:
        parts.append(f"{len(unknown)} row(s) name no tensor of this model")
    if parts:
        graph.notes.append(f"calibration table: {'; '.join(parts)}")


# The modules that register schemes when imported (as compiler/targets.TARGET_MODULES lists the targets).
SCHEME_MODULES = ("npuc.backends.cv18xx.rules",)
_SCHEMES: dict[str, Scheme] = {}


def register_scheme(scheme: Scheme) -> Scheme:
    _SCHEMES[scheme.name] = scheme
    return scheme


def schemes() -> Mapping[str, Scheme]:
    """Every registered scheme by name."""
    for module in SCHEME_MODULES:
        importlib.import_module(module)
    return MappingProxyType(_SCHEMES)


# ---------------------------------------------------------------------------------------------------------
# The pass


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
    partial_table: bool = False,
) -> Graph:
    """A quantized copy of `graph` (the float graph is left untouched) for `interp.run(..., QUANT_KERNELS)`.

    `float_layers`: op names or output tensor names kept in the scheme's fallback format (bf16 for cv18xx).
    `partial_table`: a calibration table that lacks many of the model's tensors is used anyway (else an error).
    """
    known = schemes()
    if scheme not in known:
        raise UserError(f"unknown quantization scheme '{scheme}'; choose one of {sorted(known)}")
    main = known[scheme]
    fallback = known[main.fallback] if main.fallback else None
    qgraph = graph.copy_sharing_constants()  # the float weights are replaced, never written
    if isinstance(table, CalibrationTable):
        thresholds = thresholds_for_graph(qgraph, table, warn=False, table_names=table_names)
        _check_table_fits(qgraph, thresholds, partial_table, table_names)
    else:
        thresholds = copy.deepcopy(table) if table is not None else ThresholdMap()  # never edit the caller's
    keep_float = set(float_layers)
    if main.fallback is not None:
        # int8 ops keep ReLU and ReLU6; an op kept in bf16 keeps ReLU only, its split activation stays bf16
        floated = {op.name for op in qgraph.ops if keep_float & {op.name, *op.outputs}}

        def keeps(op: Op) -> bool:
            return op.kind not in main.rules or (fallback.keeps_act if op.name in floated else main.keeps_act)(op)

        added = _unfuse_activations(qgraph, keeps)
        keep_float |= floated | {name for name in added if name.removesuffix("_act") in floated}
        for op in qgraph.ops:  # the pre-activation tensors now have names of their own
            if op.name in thresholds.pre_activation:
                thresholds.thresholds.setdefault(op.outputs[0], thresholds.pre_activation[op.name])
    else:
        _unfuse_activations(qgraph, main.keeps_act)
    ctx = QuantContext(qgraph, thresholds)
    new_ops: list[Op] = []
    fell_back: dict[str, list[str]] = {}  # op kind -> ops that asked for the main format and did not get it
    for op in qgraph.ops:
        asked = not keep_float & {op.name, *op.outputs}
        rule = main.rules.get(op.kind) if asked else None
        lowered = rule(ctx, op) if rule is not None else None
        if lowered is None and fallback is not None:
            lowered = fallback.rules[op.kind](ctx, op)
            if asked and lowered is not None:
                fell_back.setdefault(op.kind, []).append(op.name)
        if lowered is None:
            with per_op(op):
                raise UserError(f"op '{op.name}' ({op.kind}) cannot be quantized by scheme '{scheme}'")
            continue
        new_ops += ctx.pending
        ctx.pending = []
        op.inputs = lowered.inputs
        op.attrs = with_quant(op.attrs, lowered.quant)
        for out in op.outputs:
            _annotate_output(ctx, out, lowered.quant)
        new_ops.append(op)
    stop_if_gaps()
    qgraph.ops = new_ops
    if fell_back:
        kinds = ", ".join(f"{len(names)} {kind} ({names[0]}{', ...' if len(names) > 1 else ''})"
                          for kind, names in fell_back.items())  # fmt: skip
        fmt, main_fmt = fallback.name.split("_")[-1], scheme.split("_")[-1]
        qgraph.notes.append(
            f"{sum(map(len, fell_back.values()))} op(s) run in {fmt}, not {main_fmt} (no {main_fmt} form, or no "
            f"threshold in the table): {kinds}"
        )
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
