"""The JSON manifests of a Lyngor output tree: field tables, writers and a validating reader.

Tree (OUTDIR = the folder `lyn.Builder.build(out_path=...)` fills, and what `npuc build` writes):
    OUTDIR/net_params.json                   network description (NET_PARAMS)
    OUTDIR/Net_0/top_graph.json              graph I/O description (TOP_GRAPH)
    OUTDIR/Net_0/apu_0/apu_x/apu.json        the SDK's run configuration (APU_DOC)
    OUTDIR/Net_0/apu_0/apu_x/npuc_apu.json   npuc's program descriptor (NPUC_APU)
    OUTDIR/Net_0/apu_0/apu_x/npuc_prog.bin, npuc_weight.bin   npuc's payload (see payload.py)

Sources. net_params.json, top_graph.json and apu.json follow Lynxi's "编译生成物说明" page
(doc.lynxi.com/lyngor; specs/dmp-lyngor-horizon.md §2.3): every documented key, with its type and spelling
(the key "net:" with its colon, shapes as strings "(1, 128)" and "[1, 64, 64, 3]", `sub_image_size` as a string
holding a list). npuc writes the document's form; it reads that and the older form a 2022 Lyngor wrote
(`map_batch` for `run_batch`, no `version`/`is_dynamic_shape`/`build_mode`; `outputs` inside `main`; an apu.json
without `n_slice`, `crmem_load_base_addr`, `sub_image_size_ex`, `shape_ex`). In npuc's apu.json the payload
files take the documented roles: `cmd_size` is npuc_prog.bin's size, `image_size`/`sub_image_size` the weight
image's, `crmem_load_base_addr` 0 (npuc's payload is position independent). What the SDK file has no field for
(file names, per-resolution program sections, layouts) is npuc's own npuc_apu.json.

Input transposes are recorded as the vendor's `DLModel.load(transpose_axis=[(0, 3, 1, 2)])` does: the
permutation taking the fed (NHWC) tensor to the model's NCHW input; `top_graph.main.inputs` gives the fed shape.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.fileio import read_limited
from npuc.compiler.schema import check

from . import schemas
from .fields import (
    ANY,
    BOOL,
    DIGITS,
    INT_LIST,
    INT_LIST_TEXT,
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
NPUC_APU_FILE = "npuc_apu.json"
PROG_FILE = "npuc_prog.bin"
WEIGHT_FILE = "npuc_weight.bin"
SUBGRAPH = "apu_0"
MAX_MANIFEST_BYTES = 64 << 20  # a manifest larger than this is not a manifest: refuse before parsing

# dtypes a tensor at the artifact boundary may have; `INPUT_DTYPES` are what --input-dtype accepts
IO_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32")
INPUT_DTYPES = ("uint8", "int16", "float16", "float32")
OUTPUT_DTYPES = ("float16", "float32")


def relaxed(table: Table, names: tuple[str, ...]) -> Table:
    """`table` with the named fields optional (what an older vendor build leaves out)."""
    return tuple(replace(f, required=False) if f.name in names else f for f in table)


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

OLDER_NET_PARAMS = ("version", "run_batch", "is_dynamic_shape", "build_mode")  # absent from a 2022 build
NET_PARAMS_READ: Table = relaxed(NET_PARAMS, OLDER_NET_PARAMS) + (
    Field("map_batch", POS_INT, "the older name of run_batch", False),
)

# ---- top_graph.json (documented) -------------------------------------------------------------------------

IO_DTYPE = enum(*IO_DTYPES)
MAIN_INPUT: Table = (
    Field("shape", TUPLE_SHAPE, "input shape as a string, '(1, 128)'"),
    Field("dtype", IO_DTYPE, "input data type"),
    Field("batch", POS_INT, "input batch"),
)
GRAPH_OUTPUT: Table = (
    Field("shape", TUPLE_SHAPE, "output shape as a string"),
    Field("dtype", IO_DTYPE, "output data type"),
)
GRAPH_OUTPUTS = keyed(r"apu_\d+:\d+", GRAPH_OUTPUT)
MAIN: Table = (
    Field("inputs", keyed(r".+", MAIN_INPUT), "the network's inputs by name"),
    Field("outputs", GRAPH_OUTPUTS, "network outputs, '<subgraph>:<index>'"),
)
SUBGRAPH_DOC: Table = (
    Field("inputs", keyed(r".+", MAIN_INPUT), "the subgraph's inputs, as main.inputs"),
    Field("outputs", GRAPH_OUTPUTS, "the subgraph's outputs"),
    Field("is_abc", enum("true", "false"), "CNN (abc) mode, as a string"),
    Field("version", DIGITS, "lyngor build stamp"),
)
TOP_GRAPH: Table = (
    Field("main", obj(MAIN), "the main network"),
    Field(SUBGRAPH, obj(SUBGRAPH_DOC), "the APU subgraph"),
)
# read: `outputs` inside `main` (what Lyngor writes) or beside it (the document's example); an older subgraph
# object without is_abc/version
TOP_GRAPH_READ: Table = (
    Field("main", obj(relaxed(MAIN, ("outputs",))), "the main network"),
    Field("outputs", GRAPH_OUTPUTS, "network outputs beside main", False),
    Field(SUBGRAPH, obj(relaxed(SUBGRAPH_DOC, ("is_abc", "version"))), "the APU subgraph", False),
)

# ---- apu.json (documented) ---------------------------------------------------------------------------------

APU_NODE: Table = (
    Field("dtype", IO_DTYPE, "data type"),
    Field("name", STR, "model input / output node name"),
    Field("shape", LIST_SHAPE, "shape as a string, '[1, 64, 64, 3]'"),
    Field("shape_ex", SHAPE_EX, "the same shape as an int array"),
    Field("size", UINT, "element count"),
)
RESOLUTION_DOC: Table = (
    Field("core_phy_id", INT_LIST, "physical ids of the cores whose resolution index is set"),
    Field("noc_config", ANY, "NoC lookup-table entries per core and the first NoC register address"),
    Field("shape", SHAPE_EX, "the input dims of this resolution"),
)


def _apu_x(node: Table) -> Table:
    return (
        Field("batch_size", POS_INT, "batch the model was compiled for"),
        Field("n_slice", POS_INT, "batch the model actually supports"),
        Field("cmd_size", multiple_of(256), "byte size of cmd.bin"),
        Field("crmem_load_base_addr", UINT, "DDR load base address of dat.bin"),
        Field("image_size", UINT, "byte size of core.bin: the sum of sub_image_size"),
        Field("sub_image_size", INT_LIST_TEXT, "core.bin size per chip, a string holding a list"),
        Field("sub_image_size_ex", UINT, "the core.bin size"),
        Field("inputs", keyed(r"datai\d+", node), "input nodes"),
        Field("outputs", keyed(r"datao\d+", node), "output nodes"),
        Field("coremem_res_index_addr", UINT, "multi-resolution: where a core keeps its resolution index", False),
        Field("coremem_res_pc_offset", UINT, "multi-resolution: written with the index before loadnn", False),
        Field("resolution_config", keyed(r"res\d+", RESOLUTION_DOC), "multi-resolution: per resolution", False),
        Field("resolution_num", POS_INT, "multi-resolution: number of resolutions", False),
    )


APU_DOC: Table = (Field("apu_x", obj(_apu_x(APU_NODE)), "the APU subgraph's run configuration"),)
OLDER_APU_X = ("n_slice", "crmem_load_base_addr", "sub_image_size_ex")  # absent from a 2022 build
APU_DOC_READ: Table = (
    Field("apu_x", obj(relaxed(_apu_x(relaxed(APU_NODE, ("shape_ex",))), OLDER_APU_X)), "run configuration"),
)

# ---- npuc's program descriptor (npuc_apu.json) --------------------------------------------------------------

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
NPUC_APU: Table = (
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
    """A validated Lyngor output tree (decoded manifests: shapes as tuples).

    net_params has `run_batch` whatever the form; top_graph has `outputs` at the top level whatever the form;
    `apu_doc` is the documented apu.json's `apu_x` object (None if the tree has none); `apu` is npuc's program
    descriptor (npuc_apu.json), None for a vendor tree."""

    root: Path
    net_params: dict[str, Any]
    top_graph: dict[str, Any]
    apu_doc: dict[str, Any] | None
    apu: dict[str, Any] | None
    producer: str  # "npuc" or "vendor"

    @property
    def apu_x(self) -> Path:
        return self.root / NET_DIR / APU_DIR / APU_X_DIR


def is_tree(path: Path) -> bool:
    return path.is_dir() and (path / NET_PARAMS_FILE).is_file()


def load_json(path: Path, where: str, schema: dict[str, Any]) -> Any:
    """A manifest's JSON, checked against its schema (`schemas.py`) before anything reads a field."""
    if not path.is_file():
        raise CorruptFileError(f"{where}: file is missing; the output tree is incomplete, rebuild it")
    try:
        data = json.loads(read_limited(path, "Lyngor manifest", MAX_MANIFEST_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        detail = f"line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else "bad UTF-8"
        raise CorruptFileError(f"{where}: not valid JSON ({detail}); the file is truncated or edited") from None
    return check(data, schema, where, "rebuild the tree")


def read_tree(root: Path) -> LyngorTree:
    """Read and validate a Lyngor tree written by npuc or by the vendor's `lyn.Builder` (either form)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: not a folder; pass the build output folder (the one holding net_params.json)")
    apu_x = root / NET_DIR / APU_DIR / APU_X_DIR
    ours = (apu_x / NPUC_APU_FILE).is_file()
    net_schema = schemas.NET_PARAMS if ours else schemas.NET_PARAMS_READ
    net_json = load_json(root / NET_PARAMS_FILE, NET_PARAMS_FILE, net_schema)
    net = decode(NET_PARAMS if ours else NET_PARAMS_READ, net_json)
    net.setdefault("run_batch", net.get("map_batch"))  # the schema requires one of the two
    io_config = net["file_name"]["io_config"]
    for i in range(net["net_num"]):
        if not (root / f"Net_{i}").is_dir():
            raise bad(NET_PARAMS_FILE, f"net_num is {net['net_num']} but Net_{i}/ is missing", "rebuild the tree")
    top_where = f"{NET_DIR}/{io_config}"
    top_schema = schemas.TOP_GRAPH if ours else schemas.TOP_GRAPH_DOCUMENTED
    top_json = load_json(root / NET_DIR / io_config, top_where, top_schema)
    top = decode(TOP_GRAPH if ours else TOP_GRAPH_READ, top_json)
    top["outputs"] = _graph_outputs(top, top_where)
    _check_outputs(top, top_where)
    apu_where = f"{NET_DIR}/{APU_DIR}/{APU_X_DIR}/{APU_JSON_FILE}"
    apu_doc = None
    if ours or (apu_x / APU_JSON_FILE).is_file():
        apu_json = load_json(apu_x / APU_JSON_FILE, apu_where, schemas.APU if ours else schemas.APU_READ)
        apu_doc = decode(APU_DOC if ours else APU_DOC_READ, apu_json)["apu_x"]
        _check_apu_doc(apu_doc, apu_where)
    if not ours:
        return LyngorTree(root, net, top, apu_doc, None, "vendor")
    npuc_where = f"{NET_DIR}/{APU_DIR}/{APU_X_DIR}/{NPUC_APU_FILE}"
    apu = decode(NPUC_APU, load_json(apu_x / NPUC_APU_FILE, npuc_where, schemas.NPUC_APU))
    _check_npuc(net, top, apu_doc, apu, apu_x, npuc_where)
    return LyngorTree(root, net, top, apu_doc, apu, "npuc")


def _graph_outputs(top: dict[str, Any], where: str) -> dict[str, Any]:
    """The network outputs, nested in `main` (as Lyngor writes them) or beside it (the document's example)."""
    nested, beside = top["main"].get("outputs"), top.get("outputs")
    if nested is None and beside is None:
        raise bad(where, "no 'outputs' in main or beside it", "rebuild the tree")
    if nested is not None and beside is not None and nested != beside:
        raise bad(where, "main.outputs and outputs differ", "rebuild the tree")
    return nested if nested is not None else beside


def _check_apu_doc(apu: dict[str, Any], where: str) -> None:
    for key, node in [*apu["inputs"].items(), *apu["outputs"].items()]:
        if "shape_ex" in node and tuple(node["shape"]) != tuple(node["shape_ex"]):
            raise bad(f"{where}: {key}", f"shape {list(node['shape'])} differs from shape_ex", "rebuild the tree")
        if node["size"] != int(np.prod(node["shape"], dtype=np.int64)):
            raise bad(f"{where}: {key}", f"size {node['size']} is not the element count of the shape", "rebuild")
    if sum(apu["sub_image_size"]) != apu["image_size"]:
        raise bad(where, f"image_size {apu['image_size']} is not the sum of sub_image_size", "rebuild the tree")


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


def _check_npuc(
    net: dict[str, Any], top: dict[str, Any], doc: dict[str, Any], apu: dict[str, Any], folder: Path, where: str
) -> None:
    """npuc's descriptor against the documented manifests and the payload files beside it."""
    apu_in = _indexed(apu["inputs"], "datai", f"{where}: inputs")
    apu_out = _indexed(apu["outputs"], "datao", f"{where}: outputs")
    if [n["name"] for n in apu_in] != list(top["main"]["inputs"]):
        raise bad(f"{where}: inputs", "node names differ from top_graph.json main.inputs", "rebuild the tree")
    if sorted(top["outputs"]) != sorted(f"{SUBGRAPH}:{i}" for i in range(len(apu_out))):
        raise bad(f"{TOP_GRAPH_FILE}: outputs", f"keys are not {SUBGRAPH}:0..{len(apu_out) - 1}", "rebuild")
    doc_nodes = [*_indexed(doc["inputs"], "datai", "apu.json"), *_indexed(doc["outputs"], "datao", "apu.json")]
    if len(doc_nodes) != len(apu_in) + len(apu_out):
        raise bad(where, f"{len(apu_in) + len(apu_out)} nodes but apu.json has {len(doc_nodes)}", "rebuild the tree")
    for i, (node, documented) in enumerate(zip([*apu_in, *apu_out], doc_nodes)):
        _check_node(node, f"{where}: node {i}")
        if (node["name"], tuple(node["shape_ex"]), node["dtype"]) != (
            documented["name"], tuple(documented["shape_ex"]), documented["dtype"]
        ):  # fmt: skip
            raise bad(where, f"node {node['name']!r} differs from apu.json's", "rebuild the tree")
    n_res = apu["resolution_num"]
    if doc.get("resolution_num", 1) != n_res or not 0 <= apu["default_resolution"] < n_res:
        raise bad(where, "resolution_num/default_resolution disagree with apu.json", "rebuild the tree")
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
    if doc["cmd_size"] != apu["cmd_size"] or doc["batch_size"] != apu["run_batch"]:
        raise bad(where, "cmd_size/run_batch differ from apu.json's", "rebuild the tree")
