"""JSON Schemas (draft 2020-12) of the three Lyngor manifests, written from the documented field list.

They are plain dicts, kept apart from the field tables in `manifest.py` that write and read the files, so a
test can check the writer against the documentation with the `jsonschema` package (a dev dependency; npuc
itself never imports it):

- NET_PARAMS: net_params.json — every field of Lynxi's "编译生成物说明" page, with its type and spelling
  (the key "net:" keeps its colon).
- TOP_GRAPH_DOCUMENTED: top_graph.json as documented — `main.inputs.<name>` {shape "(1, 128)", dtype, batch}
  and `outputs."apu_0:<i>"` {shape, dtype}; the vendor's `apu_0` object is not public, so any value passes.
- TOP_GRAPH: the same plus npuc's `apu_0` object (`datai<i>`/`datao<i>` nodes with element counts `num`).
- APU: npuc's apu.json (`cmd_size`/`dat_size` multiples of 256, per-resolution `sub_image_size` strings and
  `sub_image_size_ex` arrays, `resolution_num`, `default_resolution`, `resolution_config.res<i>`).
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
            "net_num": POSITIVE,
            "parallel_mode": MODE,
            "run_batch": POSITIVE,
            "cpu_arch": STRING,
            "cc": STRING,
            "file_name": closed({k: STRING for k in ("cpu_lib", "cpu_graph", "cpu_params", "apu_lib", "io_config")}),
            "net:": {"type": ["object", "array", "null"]},  # network split info, usually null
            "is_dynamic_shape": BOOLEAN,
            "build_mode": {"enum": ["abc", "hop", "auto"]},
        }
    ),
}

MAIN = closed({"inputs": {"type": "object", "additionalProperties": closed(
    {"shape": TUPLE_SHAPE, "dtype": DTYPE, "batch": POSITIVE}), "minProperties": 1}})  # fmt: skip
GRAPH_OUTPUTS = keyed(r"^apu_\d+:\d+$", closed({"shape": TUPLE_SHAPE, "dtype": DTYPE}), 1)

TOP_GRAPH_DOCUMENTED: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "top_graph.json (documented part)",
    "type": "object",
    "properties": {"main": MAIN, "outputs": GRAPH_OUTPUTS, "apu_0": {}},
    "required": ["main", "outputs"],
}

NODE = {"name": STRING, "shape": LIST_SHAPE, "shape_ex": SHAPE_EX, "dtype": DTYPE, "num": COUNT}
NODE_IN = {**NODE, "transpose_axis": {"type": ["array", "null"], "items": COUNT}}
PER_RESOLUTION = {
    "sub_image_size": {"type": "array", "items": LIST_SHAPE, "minItems": 1},
    "sub_image_size_ex": {"type": "array", "items": SHAPE_EX, "minItems": 1},
}

TOP_GRAPH: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "top_graph.json (npuc)",
    **closed(
        {
            "main": MAIN,
            "outputs": GRAPH_OUTPUTS,
            "apu_0": closed(
                {
                    "input_num": POSITIVE,
                    "output_num": POSITIVE,
                    "inputs": keyed(r"^datai\d+$", closed(NODE_IN), 1),
                    "outputs": keyed(r"^datao\d+$", closed(NODE), 1),
                    "apu_dir": {"const": "apu_x"},
                    "resolution_num": POSITIVE,
                }
            ),
        }
    ),
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

APU: dict[str, Any] = {
    "$schema": DRAFT,
    "title": "apu.json (npuc)",
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

# manifest path inside a tree -> its schema (npuc trees); vendor trees use NET_PARAMS and TOP_GRAPH_DOCUMENTED
TREE_SCHEMAS: dict[str, dict[str, Any]] = {
    "net_params.json": NET_PARAMS,
    "Net_0/top_graph.json": TOP_GRAPH,
    "Net_0/apu_0/apu_x/apu.json": APU,
}
