"""Build an npuc Lyngor tree: one fp16 program section per resolution, shared fp16 weights, three manifests.

`build_tree(request)` is the target's build: the native tree, or the vendor delegate (delegate.py).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_tree
from npuc.compiler.ir import Graph
from npuc.compiler.targets import BuildRequest, BuildResult

from . import manifest as mf
from .options import NHWC_TO_NCHW, LyngorOptions, parse_options
from .payload import FORMAT_VERSION, write_program, write_weights
from .program import encode_section

FILE_NAMES = {  # net_params.json file_name: the documented names of the vendor's products
    "cpu_lib": "deploy_lib.so",
    "cpu_graph": "deploy_graph.json",
    "cpu_params": "deploy_param.params",
    "apu_lib": "apu_lib.bin",
    "io_config": mf.TOP_GRAPH_FILE,
}


def version_stamp(environ: dict[str, str] | None = None) -> str:
    """net_params.json `version` as the vendor formats it (yyyymmddHHMM), from SOURCE_DATE_EPOCH or 0."""
    epoch = (os.environ if environ is None else environ).get("SOURCE_DATE_EPOCH", "0")
    try:
        stamp = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise UserError(f"SOURCE_DATE_EPOCH={epoch!r} is not a Unix timestamp; set it to integer seconds") from None
    return stamp.strftime("%Y%m%d%H%M")


# ---- resolutions -------------------------------------------------------------------------------------------


def resolution_graphs(request: BuildRequest, opts: LyngorOptions) -> list[Graph]:
    """One canonical graph per --input-shape set (just the request's graph without a list)."""
    if len(opts.input_shapes_list) <= 1 and all(
        request.graph.tensors[n].shape == s for d in opts.input_shapes_list for n, s in d.items()
    ):
        return [request.graph]
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.rewrite.canonicalize import canonicalize

    graphs = []
    for shapes in opts.input_shapes_list:
        graph = import_onnx(request.model_path, shapes, output_names=request.output_names)
        canonicalize(graph)
        graphs.append(graph)
    first = graphs[0]
    for i, g in enumerate(graphs[1:], 1):
        if g.inputs != first.inputs or g.outputs != first.outputs or g.input_layouts != first.input_layouts:
            raise UserError(
                f"input_shapes_list[{i}] gives a graph with other inputs/outputs than entry 0; use shapes that "
                "only change sizes"
            )
    return graphs


def fed_shape(graph: Graph, name: str, layout: str) -> tuple[int, ...]:
    shape = graph.tensors[name].shape
    return tuple(shape[i] for i in (0, 2, 3, 1)) if layout == "nhwc" else shape


# ---- manifests ---------------------------------------------------------------------------------------------


@dataclass
class TreeParts:
    files: dict[str, bytes]  # relative path -> bytes
    summary: dict[str, object]


def compile_tree(graphs: list[Graph], opts: LyngorOptions) -> TreeParts:
    """Every file of an npuc Lyngor tree for `graphs` (one per resolution, same inputs/outputs)."""
    weights: list[np.ndarray] = []
    index: dict[bytes, int] = {}
    sections = [encode_section(g, i, index, weights) for i, g in enumerate(graphs)]
    prog, dat = write_program(sections), write_weights(weights)
    g0 = graphs[0]
    fed = [{n: fed_shape(g, n, opts.input_layout[n]) for n in g.inputs} for g in graphs]
    outs = [{n: g.tensors[n].shape for n in g.outputs} for g in graphs]
    in_keys = [f"datai{i}" for i in range(len(g0.inputs))]
    out_keys = [f"datao{i}" for i in range(len(g0.outputs))]

    def node(name: str, shape: tuple[int, ...], dtype: str, is_input: bool) -> dict[str, object]:
        values: dict[str, object] = {
            "name": name, "shape": shape, "shape_ex": shape, "dtype": dtype, "num": int(np.prod(shape, dtype=np.int64))
        }  # fmt: skip
        if is_input:
            values["transpose_axis"] = NHWC_TO_NCHW if opts.input_layout[name] == "nhwc" else None
        return values

    top_in = {k: node(n, fed[0][n], opts.input_dtype[n], True) for k, n in zip(in_keys, g0.inputs)}
    top_out = {k: node(n, outs[0][n], opts.output_dtype, False) for k, n in zip(out_keys, g0.outputs)}
    apu_in = {
        k: {**v, "sub_image_size": [f[v["name"]] for f in fed], "sub_image_size_ex": [f[v["name"]] for f in fed]}
        for k, v in top_in.items()
    }
    apu_out = {
        k: {**v, "sub_image_size": [o[v["name"]] for o in outs], "sub_image_size_ex": [o[v["name"]] for o in outs]}
        for k, v in top_out.items()
    }
    resolutions = {}
    for i in range(len(graphs)):
        ins = {k: fed[i][n] for k, n in zip(in_keys, g0.inputs)}
        res_outs = {k: outs[i][n] for k, n in zip(out_keys, graphs[i].outputs)}
        routes = [{"src": k, "dst": f"core{i}"} for k in in_keys] + [{"src": f"core{i}", "dst": k} for k in out_keys]
        resolutions[f"res{i}"] = {
            "res_index": i, "input_shape": ins, "input_shape_ex": ins, "output_shape": res_outs,
            "output_shape_ex": res_outs, "core_ids": [i], "route_table": routes, "cmd_section": i,
        }  # fmt: skip
    net_params = {
        "version": version_stamp(), "target": "apu", "is_map": True, "chip_num": 1, "net_num": 1,
        "parallel_mode": opts.parallel_mode, "run_batch": opts.run_batch, "cpu_arch": "arm",
        "cc": "aarch64-linux-gnu-g++", "file_name": FILE_NAMES, "net:": None, "is_dynamic_shape": False,
        "build_mode": "abc",
    }  # fmt: skip
    stamp = net_params["version"]
    main_inputs = {
        n: {"shape": fed[0][n], "dtype": opts.input_dtype[n], "batch": fed[0][n][0] if fed[0][n] else 1}
        for n in g0.inputs
    }
    graph_outputs = {
        f"{mf.SUBGRAPH}:{i}": {"shape": outs[0][n], "dtype": opts.output_dtype} for i, n in enumerate(g0.outputs)
    }
    top_graph = {
        "main": {"inputs": main_inputs, "outputs": graph_outputs},
        mf.SUBGRAPH: {"inputs": main_inputs, "outputs": graph_outputs, "is_abc": "true", "version": stamp},
    }
    apu_doc = {"apu_x": documented_apu(top_in, top_out, len(prog), len(dat), opts.run_batch, fed, in_keys)}
    apu = {
        "producer": "npuc", "format_version": FORMAT_VERSION, "chip": "ka200", "build_mode": "abc",
        "parallel_mode": opts.parallel_mode, "run_batch": opts.run_batch, "compute_dtype": "float16",
        "core_num": len(graphs), "cmd_file": mf.PROG_FILE, "cmd_size": len(prog), "dat_file": mf.WEIGHT_FILE,
        "dat_size": len(dat), "inputs": apu_in, "outputs": apu_out, "resolution_num": len(graphs),
        "default_resolution": 0, "resolution_config": resolutions,
    }  # fmt: skip
    apu_x = f"{mf.NET_DIR}/{mf.APU_DIR}/{mf.APU_X_DIR}"
    files = {
        mf.NET_PARAMS_FILE: mf.dump_json(mf.NET_PARAMS, net_params),
        f"{mf.NET_DIR}/{mf.TOP_GRAPH_FILE}": mf.dump_json(mf.TOP_GRAPH, top_graph),
        f"{apu_x}/{mf.APU_JSON_FILE}": mf.dump_json(mf.APU_DOC, apu_doc),
        f"{apu_x}/{mf.NPUC_APU_FILE}": mf.dump_json(mf.NPUC_APU, apu),
        f"{apu_x}/{mf.PROG_FILE}": prog,
        f"{apu_x}/{mf.WEIGHT_FILE}": dat,
    }
    summary = {"resolutions": len(graphs), "cmd_size": len(prog), "dat_size": len(dat), "weights": len(weights)}
    return TreeParts(files, summary)


def documented_apu(
    inputs: dict[str, dict], outputs: dict[str, dict], cmd_size: int, image_size: int, batch: int,
    fed: list[dict[str, tuple[int, ...]]], in_keys: list[str],
) -> dict[str, object]:  # fmt: skip
    """apu.json's `apu_x` object, every documented key: npuc's program file is the command stream (cmd_size),
    its weight image the core image (one chip: sub_image_size [image_size]); loaded wherever the runtime puts
    it (crmem_load_base_addr 0). Several resolutions add the documented resolution keys; npuc's payload does not
    use the vendor's NoC, so noc_config is empty and the core ids are npuc's logical cores."""

    def node(values: dict) -> dict[str, object]:
        return {k: values[k] for k in ("dtype", "name", "shape", "shape_ex")} | {"size": values["num"]}

    doc: dict[str, object] = {
        "batch_size": batch, "n_slice": batch, "cmd_size": cmd_size, "crmem_load_base_addr": 0,
        "image_size": image_size, "sub_image_size": [image_size], "sub_image_size_ex": image_size,
        "inputs": {k: node(v) for k, v in inputs.items()}, "outputs": {k: node(v) for k, v in outputs.items()},
    }  # fmt: skip
    if len(fed) > 1:
        first = inputs[in_keys[0]]["name"]
        doc |= {
            "coremem_res_index_addr": 0, "coremem_res_pc_offset": 0, "resolution_num": len(fed),
            "resolution_config": {
                f"res{i}": {"core_phy_id": [i], "noc_config": {}, "shape": shape[first]} for i, shape in enumerate(fed)
            },
        }  # fmt: skip
    return doc


# ---- writing -----------------------------------------------------------------------------------------------


def write_tree_atomic(output: Path, files: dict[str, bytes], finish: Callable[[Path], None] | None = None) -> None:
    """Write the tree atomically (compiler.fileio); `finish(tmp)` runs on the complete temporary tree."""
    atomic_write_tree(output, files, finish, what="a Lyngor build")


def build_tree(request: BuildRequest) -> BuildResult:
    """The `lyngor` target's build: native npuc tree, or (options delegate=True) the vendor delegate."""
    opts = parse_options(request.options, request.graph)
    if request.chip not in (None, "ka200"):
        raise UserError(f"chip '{request.chip}' is not a Lyngor chip; use --chip ka200")
    if request.quant not in (None, "fp16", "float16"):
        raise UserError(f"--quant {request.quant}: the lyngor target computes in fp16 only; use --quant fp16")
    if opts.delegate:
        from .delegate import build_delegate

        return build_delegate(request, opts)
    parts = compile_tree(resolution_graphs(request, opts), opts)
    write_tree_atomic(request.output, parts.files)
    return BuildResult([Path(request.output)], {"target": "lyngor", **parts.summary}, chip="ka200", quant="fp16",
                       weight_bytes=parts.summary["dat_size"])  # fmt: skip
