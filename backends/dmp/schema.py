"""JSON Schema (draft 2020-12) of the `<NET>_layers.json` twin of a DV700 layer table, checked before the table
is rebuilt into records (`layers.network_from_dict`).

The conv command's fields take their ranges from the C types of the field tables in `layers.py` (RUN_FIELDS,
CONV_FIELDS: what the generated C++ stores them in); the rest are written here. Every object is closed: the
writer (`dataclasses.asdict`) writes exactly these keys.
"""

from __future__ import annotations

from typing import Any

from .layers import CONV_FIELDS, FORMAT, LAYER_TYPES, MAX_RUNS, RUN_FIELDS, VERSION, Field

MAX_OFFSET = 1 << 40  # beyond any offset, size or dimension a DV700 table holds
C_RANGES = {"uint16": 0xFFFF, "uint32": 0xFFFFFFFF}

COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}
OFFSET_OR_NULL = {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_OFFSET}
DIMS = {"type": "array", "items": COUNT, "maxItems": 8}
NAMES = {"type": "array", "items": {"type": "string"}}
TEXT = {"type": "string"}


def closed(properties: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def c_fields(table: tuple[Field, ...]) -> dict[str, Any]:
    """Each field of a C struct table as an integer in its C type's range."""
    return {f.name: {"type": "integer", "minimum": 0, "maximum": C_RANGES[f.ctype]} for f in table}


RUN = closed({**c_fields(RUN_FIELDS), "weight_offs": COUNT, "weight_size": COUNT, "ops": NAMES}, ("m",))
CONV = closed(
    {
        **c_fields(CONV_FIELDS),
        "runs": {"type": "array", "items": RUN, "minItems": 1, "maxItems": MAX_RUNS},
        "eltwise_offs": OFFSET_OR_NULL,
        "u8tofp16_offs": OFFSET_OR_NULL,
        "to_bgr": {"enum": [0, 1]},
    },
    ("w", "h", "c", "runs"),
)
LAYER = closed(
    {
        "name": TEXT,
        "type": {"enum": list(LAYER_TYPES)},
        "input_offs": COUNT,
        "output_offs": COUNT,
        "output_size": COUNT,
        "input_dim": DIMS,
        "output_dim": DIMS,
        "is_output": {"type": "boolean"},
        "is_f32_output": {"type": "boolean"},
        "is_input_hw_layout": {"type": "boolean"},
        "conv": {"anyOf": [{"type": "null"}, CONV]},
        "softmax_axis": {"type": ["integer", "null"], "minimum": -8, "maximum": 8},
        "custom_type": {"type": ["string", "null"]},
        "custom_params": {"type": "object", "additionalProperties": {"type": ["integer", "number", "string"]}},
        "input_layers": {"type": "array", "items": COUNT},
        "ops": NAMES,
    },
    ("name", "type", "input_offs", "output_offs", "output_size", "input_dim", "output_dim"),
)
BINDING = closed(
    {
        "name": TEXT,
        "shape": DIMS,
        "offs": COUNT,
        "dims": {**DIMS, "minItems": 3, "maxItems": 3},  # W, H, C
        "layout": {"enum": ["whc8", "hwc", "u8"]},
        "dtype": {"enum": ["float16", "float32", "uint8"]},
        "view": {"enum": ["nchw", "nhwc", "flat"]},
        "perm": {"type": ["array", "null"], "items": COUNT},
    },
    ("name", "shape", "offs", "dims", "layout", "dtype", "view"),
)
LAYERS_JSON: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "npuc DMP layer table (<NET>_layers.json)",
    **closed(
        {
            "format": {"const": FORMAT},
            "version": {"const": VERSION},
            "name": TEXT,
            "layers": {"type": "array", "items": LAYER, "minItems": 1},
            "weights_size": COUNT,
            "io_size": COUNT,
            "inputs": {"type": "array", "items": BINDING, "minItems": 1},
            "outputs": {"type": "array", "items": BINDING, "minItems": 1},
            "weight_format": {"enum": ["fp16", "8bit"]},
            "input_convert": {"type": "object"},
            "hardware": {"type": "object", "additionalProperties": COUNT},
            "weights_transposed": {"type": "boolean"},
        },
        ("format", "version", "name", "layers", "weights_size", "io_size", "inputs", "outputs", "weight_format"),
    ),
}
