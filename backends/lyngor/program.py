"""One resolution's program: the canonical IR graph as a JSON op list plus references into the weight file.

Section JSON (UTF-8, keys in this order):
    {"resolution": i,
     "inputs":  [{"name", "shape", "dtype"}],           graph inputs (NCHW, the graph's own dtype)
     "outputs": [{"name", "shape", "dtype"}],           graph outputs, checked after re-inference
     "consts":  [{"name", "shape", "dtype", "weight"}],  "weight" indexes npuc_weight.bin's entry table
     "ops":     [{"name", "kind", "inputs", "outputs", "attrs": {...}}]}
Op kinds are the IR vocabulary (`compiler/ops.py`); "attrs" holds the fields of the kind's attribute dataclass:
tuples as lists, a fused activation as a nested object, non-finite floats as the strings "inf"/"-inf"/"nan",
and numpy arrays as {"dtype", "shape", "values"}. Decoding rebuilds the dataclasses from the same field list.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np

from npuc.compiler import ops
from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.ir import Graph
from npuc.compiler.schema import check

from .payload import WeightEntry, weight_array

_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}

# ---- the section's JSON Schema (draft 2020-12), checked before a field is read --------------------------

_DIMS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": (1 << 31) - 1}, "maxItems": 8}
_DTYPE = {"enum": ["float32", "float16", "int8", "uint8", "int16", "int32", "int64", "bool"]}
_NAME = {"type": "string", "minLength": 1, "maxLength": 4096}
_WINDOW = {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 1 << 16}}  # 0 divides by zero
_TENSOR = {"type": "object", "properties": {"name": _NAME, "shape": _DIMS, "dtype": _DTYPE},
           "required": ["name", "shape", "dtype"]}  # fmt: skip
# An enum-like string attribute must be one its kernel knows (`ops.ATTR_CHOICES`; a cast to a section dtype).
_CHOICES = [
    {"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
     "then": {"properties": {"attrs": {"properties": {name: {"enum": list(choices)}
                                                      for name, choices in attrs.items()}}}}}
    for kind, attrs in {**ops.ATTR_CHOICES, "cast": {"dtype": tuple(_DTYPE["enum"])}}.items()
]  # fmt: skip
SECTION: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "npuc_prog.bin section (one resolution's op list)",
    "type": "object",
    "properties": {
        "resolution": {"type": "integer", "minimum": 0, "maximum": 1 << 16},
        "inputs": {"type": "array", "items": _TENSOR, "minItems": 1},
        "outputs": {"type": "array", "items": _TENSOR, "minItems": 1},
        "consts": {"type": "array", "items": {**_TENSOR, "properties": {**_TENSOR["properties"],
                   "weight": {"type": "integer", "minimum": 0}}, "required": ["name", "shape", "dtype", "weight"]}},
        "ops": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "kind": {"type": "string"},
                    "inputs": {"type": "array", "items": {"type": "string"}},  # "" marks an absent optional input
                    "outputs": {"type": "array", "items": _NAME, "minItems": 1},
                    "attrs": {
                        "type": ["object", "null"],
                        "properties": {"strides": _WINDOW, "dilations": _WINDOW, "kernel": _WINDOW},
                    },
                },
                "required": ["name", "kind", "inputs", "outputs", "attrs"],
                "allOf": _CHOICES,
            },
        },
    },
    "required": ["resolution", "inputs", "outputs", "consts", "ops"],
}  # fmt: skip


# ---- attribute values --------------------------------------------------------------------------------------


def _encode_value(value: Any) -> Any:
    if is_dataclass(value):
        return {f.name: _encode_value(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, np.ndarray):
        return {"dtype": str(value.dtype), "shape": list(value.shape), "values": value.reshape(-1).tolist()}
    if isinstance(value, (tuple, list)):
        return [_encode_value(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else ("nan" if math.isnan(f) else ("inf" if f > 0 else "-inf"))
    return value


def _decode_value(value: Any, type_text: str) -> Any:
    """Rebuild one dataclass field from JSON, guided by the field's annotation text."""
    if value is None:
        if "None" not in type_text:  # a required field of the dataclass: null would reach the kernel
            raise TypeError(f"null is not of type {type_text}")
        return None
    if "Activation" in type_text:
        return ops.Activation(**_decode_fields(ops.Activation, value))
    if "ndarray" in type_text:
        return np.asarray(value["values"], dtype=value["dtype"]).reshape(value["shape"])
    if "float" in type_text and not type_text.startswith("tuple"):
        return _NONFINITE[value] if isinstance(value, str) else float(value)
    if type_text.startswith("tuple"):
        inner = "float" if "float" in type_text else "int"
        return tuple(_decode_value(v, inner) for v in value)
    plain = _PLAIN_TYPES.get(type_text.removesuffix(" | None"))
    if plain is not None and (not isinstance(value, plain) or (plain is int and isinstance(value, bool))):
        raise TypeError(f"{value!r:.40} is not of type {plain.__name__}")
    return value


_PLAIN_TYPES = {"str": str, "int": int, "bool": bool}  # annotations whose JSON value is taken as it is


def _decode_fields(cls: type, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{cls.__name__} attrs must be an object")
    names = {f.name for f in fields(cls)}
    unknown = set(value) - names
    if unknown:
        raise TypeError(f"unknown {cls.__name__} field {sorted(unknown)[0]!r}")
    return {f.name: _decode_value(value[f.name], str(f.type)) for f in fields(cls) if f.name in value}


# ---- graph <-> section -------------------------------------------------------------------------------------


def encode_section(graph: Graph, resolution: int, weight_index: dict[bytes, int], weights: list[np.ndarray]) -> bytes:
    """Serialize `graph`; its constants are appended to `weights` (shared: identical arrays are stored once)."""
    consts = []
    used = {name for op in graph.ops for name in op.inputs if name}
    for name in sorted(used):
        tensor = graph.tensors[name]
        if tensor.data is None:
            continue
        stored = weight_array(tensor.data)
        key = str(stored.dtype).encode() + str(stored.shape).encode() + b"|" + stored.tobytes()
        if key not in weight_index:
            weight_index[key] = len(weights)
            weights.append(stored)
        consts.append({"name": name, "shape": list(tensor.shape), "dtype": tensor.dtype, "weight": weight_index[key]})
    doc = {
        "resolution": resolution,
        "inputs": [_tensor_doc(graph, n) for n in graph.inputs],
        "outputs": [_tensor_doc(graph, n) for n in graph.outputs],
        "consts": consts,
        "ops": [
            {"name": op.name, "kind": op.kind, "inputs": op.inputs, "outputs": op.outputs,
             "attrs": _encode_value(op.attrs) if op.attrs is not None else None}
            for op in graph.ops
        ],
    }  # fmt: skip
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _tensor_doc(graph: Graph, name: str) -> dict[str, Any]:
    t = graph.tensors[name]
    return {"name": name, "shape": list(t.shape), "dtype": t.dtype}


def decode_section(data: bytes, weights: list[WeightEntry], where: str) -> Graph:
    """Rebuild the IR graph of one section; every structural problem is a CorruptFileError naming the spot."""
    try:
        doc = check(json.loads(data.decode("utf-8")), SECTION, where, "rebuild the tree")
        graph = Graph(name=f"resolution{doc['resolution']}")
        for t in doc["inputs"]:
            graph.add_tensor(t["name"], _dims(t["shape"]), t["dtype"])
            graph.inputs.append(t["name"])
        for c in doc["consts"]:
            graph.add_const(c["name"], _const(c, weights))
        for i, o in enumerate(doc["ops"]):
            opdef = ops.OPS.get(o["kind"])
            if opdef is None:
                raise CorruptFileError(f"{where}: op {i} has unknown kind {o['kind']!r}; rebuild with this npuc")
            missing = [n for n in o["inputs"] if n and n not in graph.tensors]
            if missing:
                raise CorruptFileError(
                    f"{where}: op {i} reads '{missing[0]}', which no earlier op, input or const defines"
                )
            attrs = opdef.attrs(**_decode_fields(opdef.attrs, o["attrs"] or {}))
            graph.add_op(o["kind"], list(o["inputs"]), list(o["outputs"]), attrs, name=str(o["name"]))
        graph.outputs = [t["name"] for t in doc["outputs"]]
        graph.verify()
        for t in doc["outputs"]:
            if graph.tensors[t["name"]].shape != _dims(t["shape"]):
                raise CorruptFileError(f"{where}: output {t['name']!r} does not have its recorded shape {t['shape']}")
    except CorruptFileError:
        raise
    except UserError as exc:
        raise CorruptFileError(f"{where}: {exc}") from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, UnicodeDecodeError) as exc:
        raise CorruptFileError(
            f"{where}: malformed program section ({type(exc).__name__}: {str(exc)[:80]}); rebuild the tree"
        ) from None
    return graph


def _dims(shape: list[int]) -> tuple[int, ...]:
    return tuple(shape)  # the schema checked the values


def _const(doc: dict[str, Any], weights: list[WeightEntry]) -> np.ndarray:
    index = doc["weight"]
    if index >= len(weights):
        raise IndexError(f"const {doc['name']!r} refers to weight {index!r} of {len(weights)}")
    entry = weights[index]
    shape = _dims(doc["shape"])
    if int(np.prod(shape, dtype=np.int64)) != entry.count:
        raise ValueError(f"const {doc['name']!r} shape {list(shape)} does not hold {entry.count} stored values")
    value = entry.array(shape)
    # fp16 weights compute as float32 carriers holding exact fp16 values; integers keep the graph's dtype
    return value.astype(np.float32) if entry.dtype == "float16" else value.astype(doc["dtype"])
