"""`npuc build --target cv18xx`: quantize, plan memory, generate the TPU routine and write the .cvimodel.

Program shape (as tpu-mlir makes it, specs/cv18xx.md §2): an int8 model quantizes its float input with the
runtime's built-in CPU `quant` routine, then one TPU routine runs every op and dequantizes the outputs to
fp32 in their io regions. `--quant-input` / `--quant-output` keep the model's edges in int8 instead. A bf16
model converts its input on the TPU. Unlike tpu-mlir, the CPU routines' tensors share the shared region's
liveness plan instead of taking private memory of their own.

Options read from `request.options`: quant_input, quant_output, float_layers (list), allow_partial_table
(a calibration table missing many of the model's tensors is used anyway), layer_group (runs of
conv/pool/eltwise/activation ops stay in local memory, kernels/group*.py: "cycles", the default, or true, cuts
a group where its recomputed halo rows cost more than the DDR traffic it saves; "longest" keeps each group as
long as it fits, the least traffic; false: none), sync
("parallel", the default: descriptors wait only for true dependencies, or "serial": cvikernel's fully ordered
scheme; sync.py), compress_weights (bool, default on: conv filters and FC weights VLC-compressed where that is smaller,
weights.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from pathlib import Path
from typing import Any

import numpy as np

from npuc.backends.cv18xx.chips import chip_spec
from npuc.backends.cv18xx.codegen import Codegen
from npuc.backends.cv18xx.container import CviModel, cpu_param_schema, model_schema, read_cvimodel, write_cvimodel
from npuc.backends.cv18xx.emit import CmdStream
from npuc.backends.cv18xx.fbcodec import encode as fb_encode
from npuc.backends.cv18xx.generate import generate
from npuc.backends.cv18xx.inputs import INTEGER_DTYPES, settle_integer_inputs
from npuc.backends.cv18xx.kernels.group_plan import layer_groups
from npuc.backends.cv18xx.memplan import MemoryPlan, plan_memory
from npuc.backends.cv18xx.preprocess import frame_spec, fuse_preprocess, input_fields
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler import ops
from npuc.compiler.coverage import stop_if_gaps
from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_bytes
from npuc.compiler.ir import Graph, Op
from npuc.compiler.kernels.quantized.params import OpQuant, with_quant
from npuc.compiler.targets import BuildRequest, BuildResult, bool_option
from npuc.frontends.onnx_load import load_structure
from npuc.passes.calibration.calibrate import tensor_table_names
from npuc.passes.calibration.calitable import read_table
from npuc.passes.lowering.layer_group import LayerGroup
from npuc.passes.quantization.quantize import quantize
from npuc.passes.rewrite.recurrent_unroll import unroll_recurrent

DEFAULT_CHIP = "cv181x"
SCHEMES = {"int8": "cv18xx_int8", "bf16": "cv18xx_bf16"}
REGION_SHIFT = 40
DTYPE_CODES = {"float32": 0, "int32": 1, "bf16": 3, "int8": 6, "uint8": 7}
QUANT_TYPES = {"float32": 0, "bf16": 1, "int8": 2}
ALIAS_KINDS = ("reshape",)
CPU_FUNCTION_OF_KIND = {"cast": "quant", "gather": "embedding", "softmax": "softmax"}  # the runtime's routines
BUILD_TIME_ENV = "SOURCE_DATE_EPOCH"  # reproducible builds: the build time comes from here when set


def _fmt_of(graph: Graph, name: str) -> str:
    t = graph.tensors[name]
    if t.dtype == "int8":
        return "int8"
    if t.dtype in INTEGER_DTYPES:  # embedding indices (inputs.py): int32 in the cvimodel
        return "int32"
    if t.quant is not None and t.quant.scheme == "bf16":
        return "bf16"
    return "float32"


def _split_edges(qgraph: Graph, quant_input: bool, quant_output: bool) -> tuple[list[Op], list[Op], list[str]]:
    """(CPU quant ops, TPU ops, program outputs). Input casts to int8 become CPU `quant` routines (or, with
    quant_input, disappear: the model input itself is int8); output dequant casts go away with quant_output."""
    cpu, tpu = [], []
    outputs = list(qgraph.outputs)
    for op in qgraph.ops:
        src = op.inputs[0] if op.inputs else ""
        if op.kind == "cast" and src in qgraph.inputs and qgraph.tensors[op.outputs[0]].dtype == "int8":
            if quant_input:
                t = qgraph.tensors[src]
                t.dtype, t.quant = "int8", qgraph.tensors[op.outputs[0]].quant
                _rename(qgraph, op.outputs[0], src)
            else:
                cpu.append(op)
            continue
        if quant_output and op.kind == "cast" and op.outputs[0] in outputs and _fmt_of(qgraph, src) == "int8":
            outputs[outputs.index(op.outputs[0])] = src
            continue
        tpu.append(op)
    return cpu, tpu, outputs


def _is_embedding(qgraph: Graph, op: Op) -> bool:
    """A row lookup in a constant table by a model input: the runtime's CPU `embedding` routine, before the TPU."""
    return (
        op.kind == "gather"
        and op.attrs.axis == 0
        and op.inputs[1] in qgraph.inputs
        and qgraph.const(op.inputs[0]) is not None
        and len(qgraph.shape(op.inputs[0])) == 2
    )


def _softmax_tail(qgraph: Graph) -> list[Op]:
    """Softmax ops that end the model run on the CPU in fp32 (the runtime's built-in `softmax`, as tpu-mlir
    does): the TPU dequantizes their input to fp32 (a bf16 input gets a bf16 -> fp32 cast of its own), the CPU
    routine writes the model output."""
    producers = qgraph.producers()
    tail = []
    for op in list(qgraph.ops):
        if op.kind != "softmax":
            continue
        users = [u for u in qgraph.ops if op.outputs[0] in u.inputs]
        dequant = users[0] if len(users) == 1 and users[0].kind == "cast" else None
        feeder = producers.get(op.inputs[0])
        if dequant is None or dequant.outputs[0] not in qgraph.outputs or feeder is None:
            continue
        if feeder.kind != "cast":
            if _fmt_of(qgraph, op.inputs[0]) != "bf16":
                continue
            feeder = _bf16_to_fp32_cast(qgraph, op)
        fed = qgraph.tensors[feeder.outputs[0]]
        fed.dtype, fed.quant = "float32", None
        feeder.attrs.quant.output = None
        qgraph.ops.remove(dequant)
        qgraph.ops.remove(op)
        op.outputs = [dequant.outputs[0]]
        tail.append(op)
    return tail


def _bf16_to_fp32_cast(qgraph: Graph, softmax: Op) -> Op:
    """A cast inserted before `softmax` that writes its bf16 input as fp32 words for the CPU routine."""
    src = softmax.inputs[0]
    out = qgraph.unique_name(f"{src}_f32")
    src_quant = qgraph.tensors[src].quant
    qgraph.add_tensor(out, qgraph.shape(src), "float32").quant = src_quant
    cast = Op(out, "cast", [src], [out], with_quant(ops.Cast("float32"), OpQuant("cast", (src_quant,), src_quant)))
    qgraph.ops.insert(qgraph.ops.index(softmax), cast)
    softmax.inputs = [out]
    return cast


def _softmax_islands(qgraph: Graph) -> list[Op]:
    """bf16 softmax ops inside the graph (the DFL head of a YOLOv8, an attention block): the runtime's CPU
    `softmax` between two TPU routines, in fp32. The TPU writes the input as fp32 words (a bf16 -> fp32 cast)
    and reads the result back through an fp32 -> bf16 cast; tpu-mlir computes these on the TPU instead."""
    islands = []
    for op in list(qgraph.ops):
        if op.kind != "softmax" or _fmt_of(qgraph, op.inputs[0]) != "bf16":
            continue
        feeder = _bf16_to_fp32_cast(qgraph, op)
        fed = qgraph.tensors[feeder.outputs[0]]
        fed.dtype, fed.quant = "float32", None
        feeder.attrs.quant.output = None
        out = op.outputs[0]
        f32 = qgraph.unique_name(f"{out}_f32")
        qgraph.add_tensor(f32, qgraph.shape(out), "float32")
        out_quant = qgraph.tensors[out].quant
        back = Op(f32, "cast", [f32], [out], with_quant(ops.Cast("bf16"), OpQuant("cast", (None,), out_quant)))
        qgraph.ops.insert(qgraph.ops.index(op) + 1, back)
        op.outputs = [f32]
        islands.append(op)
    return islands


def _segments(tpu_ops: list[Op], islands: list[Op]) -> list[list[Op]]:
    """The TPU ops cut at each CPU island, in graph order (so every op follows the islands it depends on)."""
    segments: list[list[Op]] = [[]]
    for op in tpu_ops:
        if op in islands:
            segments.append([])
        else:
            segments[-1].append(op)
    return segments


def _nhwc_inputs(qgraph: Graph, cpu_ops: list[Op], tpu_ops: list[Op]) -> None:
    """Inputs fed NHWC (an absorbed input transpose) enter the TPU as fed and are transposed to NCHW there,
    right after the step that makes them TPU data: the CPU quant routine's output (int8), the TPU's bf16
    conversion (bf16), or the int8 input itself (--quant-input)."""
    for src, layout in qgraph.input_layouts.items():
        if layout != "nhwc":
            continue
        n, c, h, w = qgraph.shape(src)
        qgraph.tensors[src].shape = (n, h, w, c)
        entry = next((op for op in cpu_ops + tpu_ops if op.kind == "cast" and op.inputs[0] == src), None)
        if entry is None:  # the int8 input is read by the TPU ops themselves
            nchw = qgraph.unique_name(f"{src}_nchw")
            qgraph.add_tensor(nchw, (n, c, h, w), "int8").quant = qgraph.tensors[src].quant
            _rename(qgraph, src, nchw)
            fed, made, at = src, nchw, 0
        else:
            made = entry.outputs[0]
            fed = qgraph.unique_name(f"{made}_nhwc")
            qgraph.add_tensor(fed, (n, h, w, c), qgraph.tensors[made].dtype).quant = qgraph.tensors[made].quant
            entry.outputs = [fed]
            at = tpu_ops.index(entry) + 1 if entry in tpu_ops else 0
        quant = qgraph.tensors[made].quant
        mode = "bf16" if quant.scheme == "bf16" else "int8"
        attrs = with_quant(ops.Transpose((0, 3, 1, 2)), OpQuant(mode, (quant,), quant))
        tpu_ops.insert(at, Op(f"{fed}_to_nchw", "transpose", [fed], [made], attrs))


def _rename(graph: Graph, old: str, new: str) -> None:
    for op in graph.ops:
        op.inputs = [new if n == old else n for n in op.inputs]


def _read_outside(graph: Graph, seg: list[Op]) -> set[str]:
    """Outputs of the segment's ops that an op of another segment (or a CPU routine) reads: a layer group
    must write them to gmem, not keep them in local memory."""
    inside = {id(op) for op in seg}
    made = {out for op in seg for out in op.outputs}
    return {name for op in graph.ops if id(op) not in inside for name in op.inputs if name in made}


def _aliases(graph: Graph, ops: list[Op], pinned: set[str]) -> dict[str, str]:
    return {
        op.outputs[0]: op.inputs[0]
        for op in ops
        if op.kind in ALIAS_KINDS and op.outputs[0] not in pinned and op.inputs[0] not in pinned
    }


def _cpu_args(**values: Any) -> bytes:
    """A CPU routine's `cvi.cpu_op.Parameter`: str, float and int attributes in the given order."""
    schema = cpu_param_schema()
    attrs = []
    for key, value in values.items():
        kind = {str: "str", float: "float", int: "int"}[type(value)]
        if kind == "float":
            value = float(np.float32(value))
        record = schema.new(f"{kind.capitalize()}Attr", key=key, value=value)
        attrs.append(schema.new("Attribute", **{f"{kind}_attr": record}))
    return fb_encode(schema, schema.new("Parameter", attributes=attrs))


def _tensor_record(graph: Graph, name: str, fmt: str, plan: MemoryPlan, model_input: bool,
                   frame: dict[str, Any] | None = None) -> Any:  # fmt: skip
    schema = model_schema()
    place = plan.places[name]
    t = graph.tensors[name]
    dims = list(graph.shape(name)) or [1]
    if len(dims) > 4:
        dims = [*dims[:3], int(np.prod(dims[3:]))]
    dims += [1] * (4 - len(dims))
    qscale = 1.0
    if fmt == "int8" and t.quant is not None:
        qscale = 127.0 / t.quant.threshold if model_input else float(t.quant.scale)
    return schema.new(
        "Tensor",
        tensor_id=0,
        name=name,
        offset=(place.region << REGION_SHIFT) + place.offset,
        dtype=DTYPE_CODES[fmt],
        shape=schema.new("Shape", dim=dims),
        quant=schema.new("QuantInfo", type=0, max_value=0.0, min_value=0.0, zero_point=0.0, qscale=float(qscale)),
        overwrote=name in plan.overwritten,
        size=place.size,
        **(frame or {}),  # a fused-preprocess frame: pixel_format, aligned, scale, mean (preprocess.py)
    )


def source_table_names(request: BuildRequest) -> dict[str, str] | None:
    """Calibration-table row of every tensor of the source ONNX model (BN-folded tensors go by their conv)."""
    if request.model_path.suffix.lower() != ".onnx" or not request.model_path.is_file():
        return None
    return tensor_table_names(load_structure(request.model_path))  # the weights are not read again


def _build_time() -> str:
    epoch = os.environ.get(BUILD_TIME_ENV)
    when = datetime.datetime.fromtimestamp(int(epoch) if epoch else 0, datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _compile(request: BuildRequest) -> tuple[bytes, dict[str, Any], list[str]]:
    """The .cvimodel bytes and a summary for one build request."""
    opts = request.options
    chip = chip_spec(request.chip or DEFAULT_CHIP)
    quant = request.quant or "int8"
    if quant not in SCHEMES:
        raise UserError(f"--quant {quant} is not a cv18xx number format; use int8 or bf16")
    table = None if request.calib_table is None else read_table(request.calib_table)
    spec = frame_spec(opts, table, str(request.calib_table))
    if quant == "int8":
        if request.calib_table is None:
            raise UserError(
                "an int8 cv18xx build needs a calibration table: make one with `npuc calibrate MODEL --data DIR "
                "-o TABLE` and pass --calib TABLE, or build with --quant bf16"
            )
    graph = request.graph.copy_sharing_constants()
    input_notes = settle_integer_inputs(graph) + unroll_recurrent(graph)
    qgraph = quantize(graph, table, SCHEMES[quant], opts.get("float_layers", ()), source_table_names(request),
                      partial_table=bool(opts.get("allow_partial_table")))  # fmt: skip
    qgraph.notes[:0] = input_notes
    if spec is not None and "pixel_format" not in opts:
        qgraph.notes.append(f"--input-dtype uint8 without --pixel-format: the input takes a {spec.pixel_format} frame "
                            "(the model's channel order, planar)")  # fmt: skip
    tail_ops = _softmax_tail(qgraph)
    islands = _softmax_islands(qgraph)
    cpu_ops, tpu_ops, outputs = _split_edges(qgraph, bool(opts.get("quant_input")), bool(opts.get("quant_output")))
    frames, frame_size = fuse_preprocess(qgraph, cpu_ops, tpu_ops, spec, chip.name) if spec is not None else ([], 0)
    embeddings = [op for op in tpu_ops if _is_embedding(qgraph, op)]
    cpu_ops += embeddings
    tpu_ops = [op for op in tpu_ops if op not in embeddings]
    _nhwc_inputs(qgraph, cpu_ops, tpu_ops)
    tpu_outputs = [op.inputs[0] if op.outputs[0] in outputs else None for op in tail_ops]
    tpu_outputs = [o for o in outputs if o not in {op.outputs[0] for op in tail_ops}] + [
        t for t in tpu_outputs if t is not None
    ]
    fmt = {name: _fmt_of(qgraph, name) for name in qgraph.tensors if not qgraph.tensors[name].is_const}
    fmt.update(dict.fromkeys(frames, "uint8"))
    inputs = list(qgraph.inputs)
    cpu_touched = [op.outputs[0] for op in cpu_ops] + [n for op in [*tail_ops, *islands] for n in op.inputs]
    cpu_touched += [op.outputs[0] for op in islands]
    pinned = set(inputs) | set(outputs) | set(cpu_touched)
    stream = lambda: CmdStream(chip, sync=opts.get("sync", "parallel"))  # noqa: E731
    compress = bool_option(opts, "compress_weights", True)
    cg = Codegen(chip, qgraph, MemoryPlan(), fmt, stream(), compress_weights=compress)
    grouping = layer_group_mode(opts)
    segments = [
        layer_groups(cg, seg, pinned | set(tpu_outputs) | _read_outside(qgraph, seg), cut=grouping == "cycles")
        if grouping
        else seg
        for seg in _segments([op for op in tpu_ops], islands)
    ]
    units = [u for seg in segments for u in seg]
    # One liveness plan over the whole program, CPU routines included: what a CPU routine writes or reads lives
    # in the shared region like any activation (tpu-mlir plans each TPU routine apart, so it keeps them in
    # private memory, a region of its own per program).
    schedule = [*cpu_ops, *segments[0]]
    for island, seg in zip(islands, segments[1:]):
        schedule += [island, *seg]
    schedule += tail_ops
    tpu_only = [op for op in tpu_ops if op not in islands]
    cg.plan = plan_memory(qgraph, schedule, fmt, inputs + outputs, [], _aliases(qgraph, tpu_only, pinned))
    if frames:  # an aligned frame is larger than its elements; it is alone in its io region (offset 0)
        cg.plan.places[frames[0]] = dataclasses.replace(cg.plan.places[frames[0]], size=frame_size)
    streams = []
    for seg in segments:
        cg.stream = stream()
        generate(cg, seg)
        streams.append(cg.stream)
    stop_if_gaps()  # a trial build (npuc inspect --target) has seen every segment's ops
    model = _assemble(request, chip.name, qgraph, cg, cpu_ops, segments, streams, islands, tail_ops, inputs, outputs,
                      tpu_outputs, {frames[0]: input_fields(spec)} if frames else {})  # fmt: skip
    data = write_cvimodel(model)
    read_cvimodel(data, "the generated cvimodel")  # the reader's validation is the writer's self-check
    summary = {
        "chip": chip.name,
        "quant": quant,
        "size": len(data),
        "weight_bytes": len(cg.weights.section()),
        "shared_gmem": cg.plan.shared_size,
        "private_gmem": cg.plan.private_size,
        "layer_groups": sum(isinstance(u, LayerGroup) for u in units),
        "grouped_ops": sum(len(u.ops) for u in units if isinstance(u, LayerGroup)),
        "group_tiles": sum(len(list(u.tiles(qgraph))) for u in units if isinstance(u, LayerGroup)),
        **{key: sum(st.counts()[key] for st in streams) for key in streams[0].counts()},
        **({"cpu_softmax_routines": len(islands)} if islands else {}),
    }
    cpu = [CPU_FUNCTION_OF_KIND[op.kind] for op in [*cpu_ops, *islands, *tail_ops]]
    summary["cpu_functions"] = len(cpu)
    if chip.name == "cv180x" and cpu:  # specs/cv18xx.md §2: its runtime is built with ENABLE_CPU_FUNC=OFF
        qgraph.notes.append(
            f"the cv180x runtime has no CPU functions, and this model needs {len(cpu)} ({', '.join(sorted(set(cpu)))}):"
            " it runs on the simulator, not on a board; --quant-input feeds int8 instead of a CPU quant, and a"
            " softmax at the end can be left to the application (cut the model before it)"
        )
    return data, summary, qgraph.notes


def compile_cvimodel(request: BuildRequest) -> tuple[bytes, dict[str, Any]]:
    """The .cvimodel bytes and the build summary."""
    data, summary, _ = _compile(request)
    return data, summary


def _assemble(
    request: BuildRequest,
    chip: str,
    g: Graph,
    cg: Codegen,
    cpu_ops: list[Op],
    segments: list[list[Op | LayerGroup]],
    streams: list[CmdStream],
    islands: list[Op],
    tail_ops: list[Op],
    inputs: list[str],
    outputs: list[str],
    tpu_outputs: list[str],
    frames: dict[str, dict[str, Any]],
) -> CviModel:
    schema = model_schema()
    routine_types = schema.enums["RoutineType"].values
    routines = []

    def cpu_routine(op: Op, function: str, args: bytes, in_tensors: list[str] | None = None) -> Any:
        return schema.new(
            "Routine",
            type=routine_types["CPU"],
            in_tensors=in_tensors or [op.inputs[0]],
            out_tensors=[op.outputs[0]],
            cpu_routine=schema.new("CpuRoutine", function_section=function, function_args=args),
        )

    for op in cpu_ops:
        if op.kind == "gather":  # the table is a weight the runtime finds by name (weight_map, with its shape)
            table = g.const(op.inputs[0])
            rows = (table if table.dtype == np.int8 else bf16_bits(table)).reshape(*table.shape, 1, 1)
            cg.weights.add(op.inputs[0], rows, "i8" if table.dtype == np.int8 else "bf16")
            routines.append(cpu_routine(op, CPU_FUNCTION_OF_KIND[op.kind], _cpu_args(), [op.inputs[1], op.inputs[0]]))
            continue
        scale = 127.0 / g.tensors[op.outputs[0]].quant.threshold
        routines.append(cpu_routine(op, "quant", _cpu_args(**{"from": "FP32", "scale": scale, "to": "INT8"})))
    order = list(g.tensors)
    later_reads: list[set[str]] = []  # per segment: what the islands, later segments and tail ops read
    for k in range(len(segments)):
        rest = [*islands[k:], *(u for seg in segments[k + 1 :] for u in seg), *tail_ops]
        later_reads.append({n for u in rest for n in u.inputs})
    for k, seg in enumerate(segments):
        produced = {out for op in seg for out in op.outputs}
        seg_inputs = sorted({n for op in seg for n in op.inputs if n and n not in produced and n in cg.fmt},
                            key=order.index)  # fmt: skip
        if len(segments) == 1:
            seg_outputs = list(tpu_outputs)
        else:
            seg_outputs = [n for n in order if n in produced and (n in later_reads[k] or n in tpu_outputs)]
        routines.append(
            schema.new(
                "Routine",
                type=routine_types["TPU"],
                in_tensors=seg_inputs,
                out_tensors=seg_outputs,
                tpu_routine=schema.new("TpuRoutine", cmdbuf_section=f"subfunc_{k}"),
            )
        )
        if k < len(islands):
            axis = islands[k].attrs.axis % len(g.shape(islands[k].inputs[0]))
            routines.append(cpu_routine(islands[k], "softmax", _cpu_args(axis=axis)))
    for op in tail_ops:
        axis = op.attrs.axis % len(g.shape(op.inputs[0]))
        routines.append(cpu_routine(op, "softmax", _cpu_args(axis=axis)))
    tpu_ops = [u for seg in segments for u in seg]
    names = [*inputs, *(o for op in [*cpu_ops, *tpu_ops, *islands, *tail_ops] for o in op.outputs)]
    tensor_map = [_tensor_record(g, n, cg.fmt[n], cg.plan, n in inputs, frames.get(n)) for n in dict.fromkeys(names)]
    weight_map = [
        schema.new(
            "Weight",
            name=e.name,
            offset=(1 << REGION_SHIFT) + e.offset,
            size=e.size,
            shape=schema.new("Shape", dim=list(e.shape)),
            type=e.dtype,
        )  # fmt: skip
        for e in cg.weights.entries
    ]
    program = schema.new(
        "Program",
        batch_num=0,
        neuron_size=0,
        input_tensors=list(inputs),
        output_tensors=list(outputs),
        tensor_map=tensor_map,
        routines=routines,
        shared_gmem=cg.plan.shared_size,
        private_gmem=cg.plan.private_size,
    )
    section_types = schema.enums["SectionType"].values
    sections = [
        schema.new("Section", type=section_types["WEIGHT"], name="weight"),
        *(schema.new("Section", type=section_types["CMDBUF"], name=f"subfunc_{k}") for k in range(len(streams))),
    ]
    body = schema.new(
        "Model",
        version=schema.new("Version", major_=1, minor_=4, sub_minor=0),
        name=request.options.get("name") or request.model_path.stem,
        build_time=_build_time(),
        weight_map=weight_map,
        programs=[program],
        sections=sections,
        target=chip,
        mlir_version="npuc",
    )
    blobs = {"weight": cg.weights.section(), **{f"subfunc_{k}": st.to_bytes() for k, st in enumerate(streams)}}
    return CviModel(chip, body, blobs)


LAYER_GROUP_MODES = ("cycles", "longest")


def layer_group_mode(opts: dict[str, Any]) -> str | None:
    """`layer_group`: "cycles" (also true, the default), "longest", or None for false."""
    value = opts.get("layer_group", True)
    if isinstance(value, str) and value.lower() in LAYER_GROUP_MODES:
        return value.lower()
    try:
        return "cycles" if bool_option(opts, "layer_group", True) else None
    except UserError:
        raise UserError(f"option layer_group={value!r}: give {', '.join(LAYER_GROUP_MODES)}, true or false") from None


def build(request: BuildRequest) -> BuildResult:
    data, summary, notes = _compile(request)
    given = request.output  # an existing path (a folder, /dev/null) is kept as given and refused on writing
    out = given if given.suffix or os.path.exists(given) or not given.name else given.with_suffix(".cvimodel")
    atomic_write_bytes(Path(out), data)
    return BuildResult([Path(out)], summary, notes, chip=summary["chip"], quant=summary["quant"],
                       weight_bytes=summary["weight_bytes"], host_ops=summary["cpu_functions"])  # fmt: skip
