"""The JSON manifests of a Lyngor output tree: field tables, writers and a validating reader.

Tree (OUTDIR = the folder `lyn.Builder.build(out_path=...)` fills, and what `npuc build` writes):
    OUTDIR/net_params.json                network description (NET_PARAMS)
    OUTDIR/Net_0/top_graph.json           graph I/O description (TOP_GRAPH)
    OUTDIR/Net_0/apu_0/apu_x/apu.json     npuc's APU subgraph descriptor (APU_JSON)
    OUTDIR/Net_0/apu_0/apu_x/npuc_prog.bin, npuc_weight.bin   npuc's payload (see payload.py)

Sources. net_params.json (every field, its type and spelling, including the key "net:" with its colon) and
the `main`/`outputs` part of top_graph.json (shape strings like "(1, 128)", output keys "apu_0:<i>") follow
Lynxi's "编译生成物说明" page (doc.lynxi.com/lyngor). The public page stops at the `"apu_0": {` object, and
the vendor's apu.json schema is not public: for those two, npuc writes its own field list (below), in the
vendor's conventions — I/O nodes `datai<i>`/`datao<i>` with element counts `num`, shapes as list strings
"[1, 64, 64, 3]" next to `shape_ex` arrays, per-resolution `sub_image_size` (strings) and
`sub_image_size_ex` (arrays), `resolution_num` and `resolution_config.res<i>`. A vendor-built tree is read
with the documented tables only (unknown extra keys pass); its apu_0 object and apu.json are kept as raw JSON.

Input transposes are recorded as the vendor's `DLModel.load(transpose_axis=[(0, 3, 1, 2)])` does: the
permutation taking the fed (NHWC) tensor to the model's NCHW input; `top_graph.main.inputs` gives the fed shape.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from npuc.compiler.errors import CorruptFileError, UserError

from .fields import (
    ANY,
    BOOL,
    DIGITS,
    INT_LIST,
    LIST_SHAPE,
    POS_INT,
    SHAPE_EX,
    STR,
    TUPLE_SHAPE,
    UINT,
    Field,
    Table,
    bad,
    decode,
    encode,
    enum,
    keyed,
    list_of,
    multiple_of,
    obj,
    optional,
)

NET_PARAMS_FILE = "net_params.json"
NET_DIR = "Net_0"
TOP_GRAPH_FILE = "top_graph.json"
APU_DIR = "apu_0"
APU_X_DIR = "apu_x"
APU_JSON_FILE = "apu.json"
PROG_FILE = "npuc_prog.bin"
WEIGHT_FILE = "npuc_weight.bin"
SUBGRAPH = "apu_0"
MAX_MANIFEST_BYTES = 64 << 20  # a manifest larger than this is not a manifest: refuse before parsing

# dtypes a tensor at the artifact boundary may have; `INPUT_DTYPES` are what --input-dtype accepts
IO_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32")
INPUT_DTYPES = ("uint8", "int16", "float16", "float32")
OUTPUT_DTYPES = ("float16", "float32")

# ---- net_params.json (documented) --------------------------------------------------------------------------

FILE_NAME: Table = (
    Field("cpu_lib", STR, "CPU library file name (deploy_lib.so)"),
    Field("cpu_graph", STR, "CPU graph JSON file name (deploy_graph.json)"),
    Field("cpu_params", STR, "CPU parameter file name (deploy_param.params)"),
    Field("apu_lib", STR, "the op graph (apu_lib.bin)"),
    Field("io_config", STR, "graph description file name (top_graph.json)"),
)
NET_PARAMS: Table = (
    Field("version", DIGITS, "internal build stamp, e.g. 202207141006"),
    Field("target", enum("apu"), "device chosen at compile time"),
    Field("is_map", BOOL, "whether map was called; true for users"),
    Field("chip_num", enum(1), "chips used by the build; only 1 today"),
    Field("net_num", POS_INT, "networks the build produced"),
    Field("parallel_mode", enum("DP", "MP"), "DP data parallel, MP model parallel"),
    Field("run_batch", POS_INT, "batch at run time"),
    Field("cpu_arch", STR, "CPU architecture (arm)"),
    Field("cc", STR, "cross compiler (aarch64-linux-gnu-g++)"),
    Field("file_name", obj(FILE_NAME), "names of the generated files"),
    Field("net:", ANY, "network split information, usually null (the key has a colon)"),
    Field("is_dynamic_shape", BOOL, "compiled with dynamic shapes"),
    Field("build_mode", enum("abc", "hop", "auto"), "abc = CNN mode, hop = brain-inspired sparse mode"),
)

# ---- top_graph.json (main/outputs documented; apu_0 is npuc's field list) ----------------------------------

IO_DTYPE = enum(*IO_DTYPES)
MAIN_INPUT: Table = (
    Field("shape", TUPLE_SHAPE, "input shape as a string, '(1, 128)'"),
    Field("dtype", IO_DTYPE, "input data type"),
    Field("batch", POS_INT, "input batch"),
)
MAIN: Table = (Field("inputs", keyed(r".+", MAIN_INPUT), "the network's inputs by name"),)
GRAPH_OUTPUT: Table = (
    Field("shape", TUPLE_SHAPE, "output shape as a string"),
    Field("dtype", IO_DTYPE, "output data type"),
)
NODE_IN: Table = (
    Field("name", STR, "model input name"),
    Field("shape", LIST_SHAPE, "shape of the data fed (before transpose_axis), '[1, 64, 64, 3]'"),
    Field("shape_ex", SHAPE_EX, "the same shape as an array"),
    Field("dtype", IO_DTYPE, "data type fed"),
    Field("num", UINT, "element count"),
    Field("transpose_axis", optional(SHAPE_EX), "fed layout -> model layout permutation, or null"),
)
NODE_OUT: Table = (
    Field("name", STR, "model output name"),
    Field("shape", LIST_SHAPE, "output shape"),
    Field("shape_ex", SHAPE_EX, "the same shape as an array"),
    Field("dtype", IO_DTYPE, "data type returned"),
    Field("num", UINT, "element count"),
)
SUBGRAPH_TABLE: Table = (
    Field("input_num", UINT, "number of datai nodes"),
    Field("output_num", UINT, "number of datao nodes"),
    Field("inputs", keyed(r"datai\d+", NODE_IN), "input nodes"),
    Field("outputs", keyed(r"datao\d+", NODE_OUT), "output nodes"),
    Field("apu_dir", STR, "folder of the subgraph's apu.json under Net_0/apu_0"),
    Field("resolution_num", POS_INT, "number of input resolutions compiled"),
)
TOP_GRAPH: Table = (
    Field("main", obj(MAIN), "the main network"),
    Field("outputs", keyed(r"apu_\d+:\d+", GRAPH_OUTPUT), "network outputs, '<subgraph>:<index>'"),
    Field(SUBGRAPH, obj(SUBGRAPH_TABLE), "the APU subgraph"),
)
TOP_GRAPH_VENDOR: Table = TOP_GRAPH[:2] + (Field(SUBGRAPH, ANY, "vendor subgraph object (not public)", False),)

# ---- apu.json (npuc's field list) --------------------------------------------------------------------------

APU_IN: Table = NODE_IN + (
    Field("sub_image_size", list_of(LIST_SHAPE), "the input's shape in each resolution, as strings"),
    Field("sub_image_size_ex", list_of(SHAPE_EX), "the same shapes as arrays"),
)
APU_OUT: Table = NODE_OUT + (
    Field("sub_image_size", list_of(LIST_SHAPE), "the output's shape in each resolution, as strings"),
    Field("sub_image_size_ex", list_of(SHAPE_EX), "the same shapes as arrays"),
)
ROUTE: Table = (Field("src", STR, "datai<i> or core<k>"), Field("dst", STR, "core<k> or datao<i>"))
RESOLUTION: Table = (
    Field("res_index", UINT, "this resolution's index (the N of resN)"),
    Field("input_shape", keyed(r"datai\d+", None, LIST_SHAPE), "fed shapes"),
    Field("input_shape_ex", keyed(r"datai\d+", None, SHAPE_EX), "fed shapes as arrays"),
    Field("output_shape", keyed(r"datao\d+", None, LIST_SHAPE), "output shapes"),
    Field("output_shape_ex", keyed(r"datao\d+", None, SHAPE_EX), "output shapes as arrays"),
    Field("core_ids", INT_LIST, "logical cores running this resolution"),
    Field("route_table", list_of(obj(ROUTE)), "data routes: input node -> core -> output node"),
    Field("cmd_section", UINT, "index of this resolution's section in the program file"),
)
APU_JSON: Table = (
    Field("producer", enum("npuc"), "who wrote the payload"),
    Field("format_version", POS_INT, "version of the npuc payload format"),
    Field("chip", enum("ka200"), "target chip"),
    Field("build_mode", enum("abc"), "CNN mode"),
    Field("parallel_mode", enum("DP", "MP"), "DP data parallel, MP model parallel"),
    Field("run_batch", POS_INT, "batch at run time"),
    Field("compute_dtype", enum("float16"), "arithmetic of every op"),
    Field("core_num", POS_INT, "logical cores used"),
    Field("cmd_file", STR, "program file name"),
    Field("cmd_size", multiple_of(256), "program file size in bytes"),
    Field("dat_file", STR, "weight file name"),
    Field("dat_size", multiple_of(256), "weight file size in bytes"),
    Field("inputs", keyed(r"datai\d+", APU_IN), "input nodes"),
    Field("outputs", keyed(r"datao\d+", APU_OUT), "output nodes"),
    Field("resolution_num", POS_INT, "number of resolutions"),
    Field("default_resolution", UINT, "resolution used when the caller does not choose"),
    Field("resolution_config", keyed(r"res\d+", RESOLUTION), "per-resolution shapes, cores and routes"),
)


# ---- writing -----------------------------------------------------------------------------------------------


def _format(value: Any, indent: str) -> str:
    """JSON with 2-space indent, but lists of scalars (shape_ex, core_ids) on one line."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {_format(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + _format(v, inner) for v in value) + f"\n{indent}]"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def dump_json(table: Table, values: dict[str, Any]) -> bytes:
    """Deterministic manifest bytes: table order, 2-space indent, UTF-8, trailing newline."""
    return (_format(encode(table, values), "") + "\n").encode()


# ---- reading -----------------------------------------------------------------------------------------------


@dataclass
class LyngorTree:
    """A validated Lyngor output tree (decoded manifests: shapes as tuples)."""

    root: Path
    net_params: dict[str, Any]
    top_graph: dict[str, Any]
    apu: dict[str, Any] | None  # npuc's apu.json; None for a vendor tree
    producer: str  # "npuc" or "vendor"

    @property
    def apu_x(self) -> Path:
        return self.root / NET_DIR / APU_DIR / APU_X_DIR


def is_tree(path: Path) -> bool:
    return path.is_dir() and (path / NET_PARAMS_FILE).is_file()


def load_json(path: Path, where: str) -> Any:
    if not path.is_file():
        raise CorruptFileError(f"{where}: file is missing; the output tree is incomplete, rebuild it")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise CorruptFileError(f"{where}: {path.stat().st_size} bytes is too large for a manifest")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        detail = f"line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else "bad UTF-8"
        raise CorruptFileError(f"{where}: not valid JSON ({detail}); the file is truncated or edited") from None


def read_tree(root: Path) -> LyngorTree:
    """Read and validate a Lyngor tree written by npuc or by the vendor's `lyn.Builder`."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: not a folder; pass the build output folder (the one holding net_params.json)")
    net = decode(NET_PARAMS, load_json(root / NET_PARAMS_FILE, str(root / NET_PARAMS_FILE)), NET_PARAMS_FILE, False)
    io_config = net["file_name"]["io_config"]
    if not re.fullmatch(r"[\w.-]+\.json", io_config):
        raise bad(f"{NET_PARAMS_FILE}: file_name.io_config", f"{io_config!r} is not a plain JSON file name", "fix it")
    for i in range(net["net_num"]):
        if not (root / f"Net_{i}").is_dir():
            raise bad(NET_PARAMS_FILE, f"net_num is {net['net_num']} but Net_{i}/ is missing", "rebuild the tree")
    apu_path = root / NET_DIR / APU_DIR / APU_X_DIR / APU_JSON_FILE
    ours = apu_path.is_file() and (apu_path.parent / PROG_FILE).is_file()
    top_where = f"{NET_DIR}/{io_config}"
    top_raw = load_json(root / NET_DIR / io_config, top_where)
    top = decode(TOP_GRAPH if ours else TOP_GRAPH_VENDOR, top_raw, top_where, strict=ours)
    _check_outputs(top, top_where)
    if not ours:
        return LyngorTree(root, net, top, None, "vendor")
    apu_where = f"{NET_DIR}/{APU_DIR}/{APU_X_DIR}/{APU_JSON_FILE}"
    apu = decode(APU_JSON, load_json(apu_path, apu_where), apu_where)
    _check_npuc(net, top, apu, apu_path.parent, apu_where)
    return LyngorTree(root, net, top, apu, "npuc")


def _check_outputs(top: dict[str, Any], where: str) -> None:
    by_graph: dict[str, list[int]] = {}
    for key in top["outputs"]:
        graph, index = key.split(":")
        by_graph.setdefault(graph, []).append(int(index))
    for graph, indices in by_graph.items():
        if sorted(indices) != list(range(len(indices))):
            raise bad(f"{where}: outputs", f"{graph} output indices {sorted(indices)} are not 0..n-1", "rebuild")


def _indexed(nodes: dict[str, Any], prefix: str, where: str) -> list[dict[str, Any]]:
    """Nodes `prefix0..prefixN-1` in index order (keys must be exactly those)."""
    expected = [f"{prefix}{i}" for i in range(len(nodes))]
    if sorted(nodes, key=lambda k: int(k[len(prefix) :])) != expected:
        raise bad(where, f"node keys {sorted(nodes)} are not {prefix}0..{prefix}{len(nodes) - 1}", "rebuild")
    return [nodes[k] for k in expected]


def _check_node(node: dict[str, Any], where: str) -> None:
    if tuple(node["shape"]) != tuple(node["shape_ex"]):
        raise bad(where, f"shape {list(node['shape'])} differs from shape_ex {list(node['shape_ex'])}", "rebuild")
    if node["num"] != int(np.prod(node["shape_ex"], dtype=np.int64)):
        raise bad(where, f"num {node['num']} is not the element count of {list(node['shape_ex'])}", "rebuild")
    if "sub_image_size" in node:
        if [tuple(s) for s in node["sub_image_size"]] != [tuple(s) for s in node["sub_image_size_ex"]]:
            raise bad(where, "sub_image_size and sub_image_size_ex differ", "rebuild the tree")


def _check_npuc(net: dict[str, Any], top: dict[str, Any], apu: dict[str, Any], folder: Path, where: str) -> None:
    sub = top[SUBGRAPH]
    top_in = _indexed(sub["inputs"], "datai", f"{TOP_GRAPH_FILE}: {SUBGRAPH}.inputs")
    top_out = _indexed(sub["outputs"], "datao", f"{TOP_GRAPH_FILE}: {SUBGRAPH}.outputs")
    if (sub["input_num"], sub["output_num"]) != (len(top_in), len(top_out)):
        raise bad(f"{TOP_GRAPH_FILE}: {SUBGRAPH}", "input_num/output_num do not count the nodes", "rebuild")
    if [n["name"] for n in top_in] != list(top["main"]["inputs"]):
        raise bad(f"{TOP_GRAPH_FILE}: {SUBGRAPH}.inputs", "node names differ from main.inputs", "rebuild")
    if sorted(top["outputs"]) != sorted(f"{SUBGRAPH}:{i}" for i in range(len(top_out))):
        raise bad(f"{TOP_GRAPH_FILE}: outputs", f"keys are not {SUBGRAPH}:0..{len(top_out) - 1}", "rebuild")
    apu_in = _indexed(apu["inputs"], "datai", f"{where}: inputs")
    apu_out = _indexed(apu["outputs"], "datao", f"{where}: outputs")
    for i, (a, b) in enumerate([*zip(top_in, apu_in), *zip(top_out, apu_out)]):
        for node in (a, b):
            _check_node(node, f"{where}: node {i}")
        if a["name"] != b["name"] or a["shape_ex"] != b["shape_ex"] or a["dtype"] != b["dtype"]:
            raise bad(where, f"node {b['name']!r} differs from top_graph.json's", "rebuild the tree")
    n_res = apu["resolution_num"]
    if sub["resolution_num"] != n_res or not 0 <= apu["default_resolution"] < n_res:
        raise bad(where, "resolution_num/default_resolution disagree with top_graph.json", "rebuild the tree")
    if sorted(apu["resolution_config"]) != sorted(f"res{i}" for i in range(n_res)):
        raise bad(f"{where}: resolution_config", f"keys are not res0..res{n_res - 1}", "rebuild the tree")
    for node in [*apu_in, *apu_out]:
        if len(node["sub_image_size_ex"]) != n_res:
            raise bad(where, f"node {node['name']!r} lists {len(node['sub_image_size_ex'])} sizes", "rebuild")
    for i in range(n_res):
        res = apu["resolution_config"][f"res{i}"]
        if res["res_index"] != i:
            raise bad(f"{where}: resolution_config.res{i}", f"res_index is {res['res_index']}", "rebuild")
        if sorted(res["input_shape_ex"]) != sorted(apu["inputs"]) or sorted(res["output_shape_ex"]) != sorted(
            apu["outputs"]
        ):
            raise bad(f"{where}: resolution_config.res{i}", "shape keys differ from the I/O nodes", "rebuild")
        for key, node in [*apu["inputs"].items(), *apu["outputs"].items()]:
            shapes = res["input_shape_ex"] if key.startswith("datai") else res["output_shape_ex"]
            if tuple(shapes[key]) != tuple(node["sub_image_size_ex"][i]):
                raise bad(f"{where}: resolution_config.res{i}", f"{key} shape differs from sub_image_size", "rebuild")
    if net["run_batch"] != apu["run_batch"] or net["parallel_mode"] != apu["parallel_mode"]:
        raise bad(where, "run_batch/parallel_mode differ from net_params.json", "rebuild the tree")
    for key, size_key in (("cmd_file", "cmd_size"), ("dat_file", "dat_size")):
        name = apu[key]
        if not re.fullmatch(r"[\w.-]+", name) or not (folder / name).is_file():
            raise bad(f"{where}: {key}", f"{name!r} is not a file beside apu.json", "rebuild the tree")
        actual = (folder / name).stat().st_size
        if actual != apu[size_key]:
            raise bad(f"{where}: {size_key}", f"{apu[size_key]} but {name} has {actual} bytes", "rebuild the tree")
