"""`npuc build --target bm1880`: float IR + thresholds -> int8 layers -> BMKernel cmdbuf -> `.bmodel`.

One `Command` per input-shape set (each with its own cmdbuf, neuron area and offsets); all commands share
one weight blob. The input is NCHW int8 at neuron offset 0 with its threshold; outputs carry theirs.

Options read from `request.options`:
- `opt`: "none" | "layer-group" (default) | "layer-group-weight" (BMNet's BM_OPT_NONE / LAYER_GROUP /
  LAYER_GROUP_WITH_WEIGHT_OPT, specs/bm1880.md §4.1);
- `input_shapes_list`: list of {input name: shape} (repeated --input-shape), one command each;
- `weights`: the .caffemodel of a Caffe MODEL (a .prototxt), needed to re-import it per shape;
- `name`: the bmodel's net name (default: the graph's);
- `weight_scale`: "layer" (BMNet's per-layer shift) or "channel" (per-channel power-of-two gains, lower_gains.py).
  The default follows the table (quantize.choose_weight_scale): a BMNet table builds what BMNet builds ("layer",
  the vendor's bytes), a cali_table (npuc calibrate, tpu-mlir) gets "channel"; the summary names the rule.
`request.calib_table`: a tpu-mlir cali_table or a BMNet calibration table (.pb2 binary or text prototxt).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import onnx

from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_bytes
from npuc.compiler.ir import Graph
from npuc.compiler.targets import BuildRequest, BuildResult

from .cmdbuf import encode_cmdbuf
from .codegen import Program, WeightBlob, plan_neurons
from .container import CHIP_BM1880, FMT_I8, BModel, Command, TensorInfo, write_bmodel
from .groups import OPT_LEVELS, form_units
from .quantize import LoweredNet, check_weight_scale, choose_weight_scale, load_thresholds, lower, table_kind
from .sim import input_name

DEFAULT_OPT = "layer-group"


@dataclass(frozen=True)
class CommandStats:
    """What one command costs: cmdbuf size, neuron area, DDR bytes moved by its GDMAs."""

    shape: tuple[int, ...]
    cmdbuf_bytes: int
    neuron_size: int
    ddr_bytes: int
    groups: int


def compile_command(net: LoweredNet, blob: WeightBlob, opt: str) -> tuple[Command, CommandStats]:
    """One command: layer groups, neuron plan and cmdbuf for a lowered net."""
    units = form_units(net, opt)
    offsets, neuron_size = plan_neurons(net, units)
    program = Program(net, blob, offsets)
    for unit in units:
        program.run_unit(unit)
    cmdbuf = encode_cmdbuf(program.em.instructions)

    def info(name: str, label: str, shape: tuple[int, ...]) -> TensorInfo:
        return TensorInfo(label, shape, offsets[net.storage[name]], net.thresholds[name])

    inputs = tuple(info(n, "", net.shapes[n]) for n in net.inputs)
    outputs = tuple(info(n, n, net.ir_shapes[n]) for n in net.outputs)
    command = Command(inputs, outputs, cmdbuf, max(neuron_size, 1))
    stats = CommandStats(inputs[0].shape if inputs else (), len(cmdbuf), command.neuron_size, program.em.ddr_bytes,
                         len(units))  # fmt: skip
    return command, stats


class CompiledBModel(NamedTuple):
    model: BModel
    stats: list[CommandStats]  # one per input shape
    notes: list[str]
    host_ops: list[str]  # the tail BMNet leaves to the host, "name (kind)" each


def compile_bmodel(
    graphs: list[Graph],
    table: dict[str, float],
    table_names: dict[str, str] | None,
    opt: str,
    name: str,
    weight_scale: str = "layer",
) -> CompiledBModel:
    """The bmodel of one float graph per input shape (graphs are not modified)."""
    if opt not in OPT_LEVELS:
        raise UserError(f"--opt {opt!r} is not one of {', '.join(OPT_LEVELS)}")
    check_weight_scale(weight_scale)
    blob = WeightBlob()
    commands, stats, notes, host_ops = [], [], [], []
    seen: set[tuple[int, ...]] = set()
    for graph in graphs:
        net = lower(copy.deepcopy(graph), table, table_names, channel_gains=weight_scale == "channel")
        command, st = compile_command(net, blob, opt)
        if st.shape in seen:
            raise UserError(f"input shape {'x'.join(map(str, st.shape))} is given twice; give each shape once")
        seen.add(st.shape)
        commands.append(command)
        stats.append(st)
        notes, host_ops = net.notes, net.host_ops
    model = BModel(name, CHIP_BM1880, FMT_I8, tuple(commands), (bytes(blob.data),))
    return CompiledBModel(model, stats, notes, host_ops)


def _reimport(request: BuildRequest, shapes: dict[str, tuple[int, ...]]) -> Graph:
    from npuc.passes.rewrite.canonicalize import canonicalize

    path = request.model_path
    if path.suffix.lower() == ".prototxt":
        from npuc.frontends.caffe import import_caffe

        weights = request.options.get("weights")
        graph = import_caffe(path, Path(weights) if weights else None, shapes)
    else:
        from npuc.frontends.onnx import import_onnx

        graph = import_onnx(path, shapes, output_names=request.output_names)
    canonicalize(graph)
    return graph


def graphs_per_shape(request: BuildRequest) -> list[Graph]:
    """The request's graph, and one re-imported graph per further --input-shape set."""
    sets = request.options.get("input_shapes_list") or []
    graphs = []
    for shapes in sets or [None]:
        same = shapes is None or all(
            n in request.graph.tensors and _matches_shape(request.graph, n, s) for n, s in shapes.items()
        )
        graphs.append(request.graph if same else _reimport(request, dict(shapes)))
    return graphs


def _matches_shape(graph: Graph, name: str, shape) -> bool:
    layout = graph.input_layouts.get(name, "nchw")
    ir = graph.tensors[name].shape
    user = (ir[0], ir[2], ir[3], ir[1]) if layout == "nhwc" and len(ir) == 4 else ir
    return tuple(user) == tuple(shape)


def source_table_names(request: BuildRequest) -> dict[str, str] | None:
    if request.model_path.suffix.lower() != ".onnx" or not request.model_path.is_file():
        return None
    from npuc.passes.calibration.calibrate import tensor_table_names

    return tensor_table_names(onnx.load(str(request.model_path), load_external_data=False))


def build(request: BuildRequest) -> BuildResult:
    """Compile and write the .bmodel atomically; the summary has sizes and DDR traffic per command."""
    start = time.perf_counter()
    if request.quant not in (None, "int8"):
        raise UserError(f"--quant {request.quant} is not a bm1880 number format; BM1880 runs int8 only")
    if request.chip not in (None, "bm1880"):
        raise UserError(f"--chip {request.chip} is not a bm1880 chip; use --chip bm1880 or leave it out")
    if request.calib_table is None:
        raise UserError(
            "a bm1880 build needs thresholds: pass --calib TABLE (a tpu-mlir cali_table from `npuc calibrate`, "
            "or a BMNet calibration .pb2/.prototxt)"
        )
    opt = str(request.options.get("opt", DEFAULT_OPT))
    table = load_thresholds(request.calib_table)
    graphs = graphs_per_shape(request)
    name = str(request.options.get("name") or request.graph.name)
    weight_scale, why = choose_weight_scale(request.options, table_kind(request.calib_table))
    model, stats, notes, host_ops = compile_bmodel(graphs, table, source_table_names(request), opt, name, weight_scale)
    notes = [*notes, why] if why else notes
    data = write_bmodel(model)
    output = Path(request.output)
    atomic_write_bytes(output, data)
    summary: dict[str, Any] = {
        "opt": opt,
        "weight_scale": weight_scale,
        "bytes": len(data),
        "weight_bytes": len(model.weights[0]),
        "commands": [
            {
                "shape": "x".join(map(str, s.shape)),
                "cmdbuf": s.cmdbuf_bytes,
                "neuron_size": s.neuron_size,
                "ddr_bytes": s.ddr_bytes,
                "groups": s.groups,
            }
            for s in stats
        ],  # fmt: skip
        "seconds": round(time.perf_counter() - start, 3),
    }
    graph = request.graph
    for index, name in enumerate(graph.inputs):  # BMNet inputs are NCHW and unnamed: say what changed
        if graph.input_layouts.get(name, "nchw") == "nhwc":
            n, c, h, w = graph.shape(name)
            notes.append(
                f"input '{name}' is NHWC in the ONNX model; bmodel input #{index} takes it as NCHW {n}x{c}x{h}x{w} "
                "(transpose it before feeding; `npuc run` calls it "
                f"'{input_name(index)}')"
            )
    return BuildResult([output], summary, list(notes), chip="bm1880", quant="int8",
                       weight_bytes=summary["weight_bytes"], host_ops=len(host_ops))  # fmt: skip
