"""JSON Schemas (draft 2020-12) of the three Lyngor manifests, written from the documented field list.

They are plain dicts, kept apart from the field tables in `manifest.py` that write and read the files, so a
test can check the writer against the documentation, and `manifest.read_tree` checks every manifest it reads
against them (with `jsonschema`, through `compiler/schema.py`) before decoding a field:

- NET_PARAMS: net_params.json — every field of Lynxi's "编译生成物说明" page, with its type and spelling
  (the key "net:" keeps its colon).
- TOP_GRAPH: top_graph.json as documented — `main` {`inputs.<name>` {shape "(1, 128)", dtype, batch},
  `outputs."apu_0:<i>"` {shape, dtype}} and the subgraph object `apu_0` {inputs, outputs, is_abc "true",
  version}; TOP_GRAPH_DOCUMENTED also accepts `outputs` beside `main` and an older `apu_0` (what a 2022
  Lyngor wrote).
- APU: apu.json as documented — one key `apu_x` holding batch_size, n_slice, cmd_size, crmem_load_base_addr,
  image_size, sub_image_size (a string holding a list), sub_image_size_ex, inputs.datai<i> / outputs.datao<i>
  {dtype, name, shape string, shape_ex, size}, and for several resolutions coremem_res_index_addr,
  coremem_res_pc_offset, resolution_config.res<i> {core_phy_id, noc_config, shape}, resolution_num.
- NET_PARAMS_READ, TOP_GRAPH_DOCUMENTED, APU_READ: what a vendor tree may hold (the documented form or the older
  one the golden yolox_s build has).
- NPUC_APU: npuc's own program descriptor npuc_apu.json (`cmd_size`/`dat_size` multiples of 256, per-resolution
  `sub_image_size` strings and `sub_image_size_ex` arrays, `resolution_num`, `default_resolution`,
  `resolution_config.res<i>`).
"""

from __future__ import annotations

from typing import Any

DRAFT = "https://json-schema.org/draft/2020-12/schema"

STRING = {"type": "string"}
BOOLEAN = {"type": "boolean"}
COUNT = {"type": "integer", "minimum": 0}
POSITIVE = {"type": "integer", "minimum": 1}
DTYPE = {"enum": ["uint8", "int8", "int16", "int32", "int64", "float16", "float32"]}
MODE = {"enum": ["DP", "MP"]}
TUPLE_SHAPE = {"type": "string", "pattern": r"^\((\d+(, \d+)*,?)?\)$"}  # "(1, 128)", as top_graph.json prints
LIST_SHAPE = {"type": "string", "pattern": r"^\[(\d+(, \d+)*)?\]$"}  # "[1, 64, 64, 3]"
SHAPE_EX = {"type": "array", "items": COUNT}
MAX_NETS = 64  # one Net_<i>/ folder per network; the reader looks for each
SIZE_256 = {"type": "integer", "minimum": 256, "multipleOf": 256}


def closed(properties: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object with exactly these keys (all required unless listed in `optional`)."""
    return {
        "type": "object",
        "properties": properties,
        "required": [k for k in properties if k not in optional],
        "additionalProperties": False,
    }


def keyed(pattern: str, value: dict[str, Any], min_keys: int = 0) -> dict[str, Any]:
    """An object whose keys all match `pattern` and whose values all match `value`."""
    return {
        "type": "object",
        "patternProperties": {pattern: value},
        "additionalProperties": False,
        "minProperties": min_keys,
    }


NET_PARAMS: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "net_params.json",
    **closed(
        {
            "version": {"type": "string", "pattern": r"^\d{12}$"},  # build stamp yyyymmddHHMM
            "target": {"const": "apu"},
            "is_map": BOOLEAN,
            "chip_num": {"const": 1},
            "net_num": {"type": "integer", "minimum": 1, "maximum": MAX_NETS},
            "parallel_mode": MODE,
            "run_batch": POSITIVE,
            "cpu_arch": STRING,
            "cc": STRING,
            "file_name": closed(
                {
                    **{k: STRING for k in ("cpu_lib", "cpu_graph", "cpu_params", "apu_lib")},
                    "io_config": {"type": "string", "pattern": r"^[\w.-]+\.json$"},  # read from Net_0/: a plain name
                }
            ),
            "net:": {"type": ["object", "array", "null"]},  # network split info, usually null
            "is_dynamic_shape": BOOLEAN,
            "build_mode": {"enum": ["abc", "hop", "auto"]},
        }
    ),
}

MAIN_INPUTS = {"type": "object", "additionalProperties": closed(
    {"shape": TUPLE_SHAPE, "dtype": DTYPE, "batch": POSITIVE}), "minProperties": 1}  # fmt: skip
GRAPH_OUTPUTS = keyed(r"^apu_\d+:\d+$", closed({"shape": TUPLE_SHAPE, "dtype": DTYPE}), 1)
STAMP = {"type": "string", "pattern": r"^\d+$"}

TOP_GRAPH: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "top_graph.json",
    **closed(
        {
            "main": closed({"inputs": MAIN_INPUTS, "outputs": GRAPH_OUTPUTS}),
            "apu_0": closed(
                {
                    "inputs": MAIN_INPUTS,
                    "outputs": GRAPH_OUTPUTS,
                    "is_abc": {"enum": ["true", "false"]},
                    "version": STAMP,
                }
            ),
        }
    ),
}

TOP_GRAPH_DOCUMENTED: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "top_graph.json (either documented form)",
    "type": "object",
    "properties": {
        "main": closed({"inputs": MAIN_INPUTS, "outputs": GRAPH_OUTPUTS}, optional=("outputs",)),
        "outputs": GRAPH_OUTPUTS,
        "apu_0": {"type": "object"},
    },
    "required": ["main"],
    "anyOf": [{"required": ["outputs"]}, {"properties": {"main": {"required": ["outputs"]}}}],
}

APU_NODE = closed({"dtype": DTYPE, "name": STRING, "shape": LIST_SHAPE, "shape_ex": SHAPE_EX, "size": COUNT})
INT_LIST_TEXT = {"type": "string", "pattern": r"^\[\s*(\d+\s*(,\s*\d+\s*)*)?\]$"}  # "[16128640]"
MULTI_RESOLUTION = ("coremem_res_index_addr", "coremem_res_pc_offset", "resolution_config", "resolution_num")
APU: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "apu.json",
    **closed(
        {
            "apu_x": closed(
                {
                    "batch_size": POSITIVE,
                    "n_slice": POSITIVE,
                    "cmd_size": SIZE_256,
                    "crmem_load_base_addr": COUNT,
                    "image_size": COUNT,
                    "sub_image_size": INT_LIST_TEXT,
                    "sub_image_size_ex": COUNT,
                    "inputs": keyed(r"^datai\d+$", APU_NODE, 1),
                    "outputs": keyed(r"^datao\d+$", APU_NODE, 1),
                    "coremem_res_index_addr": COUNT,
                    "coremem_res_pc_offset": COUNT,
                    "resolution_config": keyed(
                        r"^res\d+$",
                        closed(
                            {
                                "core_phy_id": {"type": "array", "items": COUNT},
                                "noc_config": {"type": "object"},
                                "shape": SHAPE_EX,
                            }
                        ),  # fmt: skip
                        1,
                    ),
                    "resolution_num": POSITIVE,
                },
                optional=MULTI_RESOLUTION,
            )
        }
    ),
}

NODE = {"name": STRING, "shape": LIST_SHAPE, "shape_ex": SHAPE_EX, "dtype": DTYPE, "num": COUNT}
NODE_IN = {**NODE, "transpose_axis": {"type": ["array", "null"], "items": COUNT}}
PER_RESOLUTION = {
    "sub_image_size": {"type": "array", "items": LIST_SHAPE, "minItems": 1},
    "sub_image_size_ex": {"type": "array", "items": SHAPE_EX, "minItems": 1},
}

ROUTE = closed(
    {
        "src": {"type": "string", "pattern": r"^(datai|core)\d+$"},
        "dst": {"type": "string", "pattern": r"^(core|datao)\d+$"},
    }
)
RESOLUTION = closed(
    {
        "res_index": COUNT,
        "input_shape": keyed(r"^datai\d+$", LIST_SHAPE, 1),
        "input_shape_ex": keyed(r"^datai\d+$", SHAPE_EX, 1),
        "output_shape": keyed(r"^datao\d+$", LIST_SHAPE, 1),
        "output_shape_ex": keyed(r"^datao\d+$", SHAPE_EX, 1),
        "core_ids": {"type": "array", "items": COUNT, "minItems": 1},
        "route_table": {"type": "array", "items": ROUTE, "minItems": 2},
        "cmd_section": COUNT,
    }
)

NPUC_APU: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "npuc_apu.json",
    **closed(
        {
            "producer": {"const": "npuc"},
            "format_version": {"const": 1},
            "chip": {"const": "ka200"},
            "build_mode": {"const": "abc"},
            "parallel_mode": MODE,
            "run_batch": POSITIVE,
            "compute_dtype": {"const": "float16"},
            "core_num": POSITIVE,
            "cmd_file": STRING,
            "cmd_size": SIZE_256,
            "dat_file": STRING,
            "dat_size": SIZE_256,
            "inputs": keyed(r"^datai\d+$", closed({**NODE_IN, **PER_RESOLUTION}), 1),
            "outputs": keyed(r"^datao\d+$", closed({**NODE, **PER_RESOLUTION}), 1),
            "resolution_num": POSITIVE,
            "default_resolution": COUNT,
            "resolution_config": keyed(r"^res\d+$", RESOLUTION, 1),
        }
    ),
}

# ---- what the reader accepts from a vendor tree: the documented form, or the older one a 2022 Lyngor wrote
# (map_batch for run_batch; no version/is_dynamic_shape/build_mode; apu.json without n_slice,
# crmem_load_base_addr, sub_image_size_ex, shape_ex; fields the document does not list pass through).

OLDER_NET_PARAMS = ("version", "run_batch", "is_dynamic_shape", "build_mode")


def opened(schema: dict[str, Any], optional: tuple[str, ...], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """`schema` (a closed object) with the `optional` fields no longer required and unknown fields allowed."""
    return {
        **schema,
        "properties": {**schema["properties"], **(extra or {})},
        "required": [k for k in schema["required"] if k not in optional],
        "additionalProperties": True,
    }


NET_PARAMS_READ: dict[str, Any] = {
    **opened(NET_PARAMS, OLDER_NET_PARAMS, {"map_batch": POSITIVE}),
    "title": "net_params.json (documented or older form)",
    "description": "net_params.json with run_batch (or the older map_batch)",
    "anyOf": [{"required": ["run_batch"]}, {"required": ["map_batch"]}],
}
OLDER_APU_X = ("n_slice", "crmem_load_base_addr", "sub_image_size_ex")
APU_NODE_READ = opened(APU_NODE, ("shape_ex",))
APU_X = APU["properties"]["apu_x"]
APU_READ: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "apu.json (documented or older form)",
    **closed(
        {
            "apu_x": {
                **opened(APU_X, OLDER_APU_X),
                "properties": {
                    **APU_X["properties"],
                    "inputs": keyed(r"^datai\d+$", APU_NODE_READ, 1),
                    "outputs": keyed(r"^datao\d+$", APU_NODE_READ, 1),
                },
            }
        }
    ),
}

# manifest path inside a tree -> its schema (npuc trees); vendor trees: TOP_GRAPH_DOCUMENTED and their own forms
TREE_SCHEMAS: dict[str, dict[str, Any]] = {
    "net_params.json": NET_PARAMS,
    "Net_0/top_graph.json": TOP_GRAPH,
    "Net_0/apu_0/apu_x/apu.json": APU,
    "Net_0/apu_0/apu_x/npuc_apu.json": NPUC_APU,
}
