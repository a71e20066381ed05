"""The hbDNN I/O contract: `hbDNNTensorProperties` of each model input and output (dmp-lyngor-horizon.md §3.3).

One field table (PROPERTY_FIELDS) drives the JSON writer, the JSON reader and the C header writer, so the
three agree. Enumerations are the documented ones: hbDNNDataType in order from 0 (F32 = 13), layouts
NHWC = 0 / NCHW = 2 / NONE = 255, hbDNNQuantiType NONE / SHIFT / SCALE.

Alignment (X3, bernoulli2): alignedShape is 4-D. NV12 and Y inputs: only W is aligned, to 16, and stride is
all 0. NHWC with C <= 4: H to 2, W to 32. NHWC with C > 4 (and any quantized output): the C byte count is
aligned to 256·k + {0, 16, 32, 64, 128}; NCHW: the W byte count is. Dequantized float outputs are not
padded. Stride is in bytes per dimension of alignedShape; alignedByteSize is what the user allocates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from npuc.compiler.errors import CorruptFileError
from npuc.compiler.sanitize import c_comment, c_identifier

MAX_DIMS = 8  # HB_DNN_TENSOR_MAX_DIMENSIONS
DATA_TYPES = (
    "IMG_Y", "IMG_NV12", "IMG_NV12_SEPARATE", "IMG_YUV444", "IMG_RGB", "IMG_BGR", "S4", "U4", "S8", "U8", "F16",
    "S16", "U16", "F32", "S32", "U32", "F64", "S64", "U64",
)  # fmt: skip
LAYOUTS: Mapping[str, int] = MappingProxyType({"NHWC": 0, "NCHW": 2, "NONE": 255})
QUANTI_TYPES = ("NONE", "SHIFT", "SCALE")
# numpy dtype -> the DATA_TYPES entry of an unquantized tensor of that type (token ids are S64)
NUMPY_TYPES: Mapping[str, str] = MappingProxyType({
    "int8": "S8", "uint8": "U8", "float16": "F16", "int16": "S16", "uint16": "U16", "float32": "F32", "int32": "S32",
    "uint32": "U32", "float64": "F64", "int64": "S64", "uint64": "U64",
})  # fmt: skip
ELEMENT_BYTES: Mapping[str, int] = MappingProxyType(
    {"S8": 1, "U8": 1, "F16": 2, "S16": 2, "U16": 2, "F32": 4, "S32": 4, "U32": 4, "F64": 8, "S64": 8, "U64": 8}
    | {t: 1 for t in DATA_TYPES if t.startswith("IMG_")}
)
BYTE_ALIGN_STEPS = (0, 16, 32, 64, 128)  # within each 256-byte block
FORMAT = "npuc-hbdnn-contract"
VERSION = 1


def align_bytes(count: int) -> int:
    """The smallest `256·k + j` (j in 0, 16, 32, 64, 128) that is >= count."""
    block, rest = divmod(int(count), 256)
    step = next((j for j in BYTE_ALIGN_STEPS if j >= rest), None)
    return block * 256 + step if step is not None else (block + 1) * 256


def _round_up(value: int, multiple: int) -> int:
    return -(-int(value) // multiple) * multiple


@dataclass
class TensorProperties:
    """One hbDNNTensorProperties, plus the tensor's name (hbDNNGetInputName)."""

    name: str
    valid_shape: tuple[int, ...]
    aligned_shape: tuple[int, ...]
    tensor_layout: str  # key of LAYOUTS
    tensor_type: str  # entry of DATA_TYPES
    quanti_type: str = "NONE"
    shift_data: tuple[int, ...] = ()
    scale_data: tuple[float, ...] = ()
    zero_point_data: tuple[int, ...] = ()
    quantize_axis: int = 0
    aligned_byte_size: int = 0
    stride: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # npuc's notes: input_type_rt, preprocessing


def aligned_shape(valid: tuple[int, ...], layout: str, tensor_type: str, is_output: bool) -> tuple[int, ...]:
    """alignedShape by the X3 rules in the module docstring."""
    shape = list(valid)
    if len(shape) != 4:
        return tuple(shape)
    if tensor_type in ("IMG_NV12", "IMG_NV12_SEPARATE", "IMG_Y"):
        shape[3] = _round_up(shape[3], 16)  # NCHW-shaped image: W is the last dim
        return tuple(shape)
    if tensor_type in ("F32", "F64") and is_output:
        return tuple(shape)  # dequantized output: not padded
    size = ELEMENT_BYTES[tensor_type]
    if layout == "NHWC" and shape[3] <= 4 and not is_output:
        shape[1], shape[2] = _round_up(shape[1], 2), _round_up(shape[2], 32)
    elif layout == "NHWC" or is_output:
        axis = 3 if layout == "NHWC" else 1
        shape[axis] = align_bytes(shape[axis] * size) // size
    else:
        shape[3] = align_bytes(shape[3] * size) // size
    return tuple(shape)


def byte_layout(aligned: tuple[int, ...], tensor_type: str) -> tuple[int, tuple[int, ...]]:
    """(alignedByteSize, stride): NV12 is H·W·3/2 bytes with stride all 0; others dense strides."""
    if tensor_type in ("IMG_NV12", "IMG_NV12_SEPARATE"):
        h, w = aligned[2], aligned[3]
        return h * w * 3 // 2, (0,) * len(aligned)
    if tensor_type == "IMG_Y":
        return aligned[2] * aligned[3], (0,) * len(aligned)
    size = ELEMENT_BYTES[tensor_type]
    strides = [size] * len(aligned)
    for i in range(len(aligned) - 2, -1, -1):
        strides[i] = strides[i + 1] * aligned[i + 1]
    return int(np.prod(aligned, dtype=np.int64)) * size, tuple(strides)


def make_properties(
    name: str, valid: tuple[int, ...], layout: str, tensor_type: str, is_output: bool, **quant: Any
) -> TensorProperties:
    aligned = aligned_shape(valid, layout, tensor_type, is_output)
    nbytes, stride = byte_layout(aligned, tensor_type)
    return TensorProperties(
        name, tuple(valid), aligned, layout, tensor_type, aligned_byte_size=nbytes, stride=stride, **quant
    )


# ---------------------------------------------------------------------------------------------------------
# The field table: (JSON key, attribute, C renderer)


def _c_shape(shape: tuple[int, ...]) -> str:
    dims = list(shape) + [0] * (MAX_DIMS - len(shape))
    return f"{{.dimensionSize = {{{', '.join(map(str, dims))}}}, .numDimensions = {len(shape)}}}"


def _c_array(values: tuple[int, ...]) -> str:
    return "{" + ", ".join(map(str, list(values) + [0] * (MAX_DIMS - len(values)))) + "}"


PROPERTY_FIELDS: tuple[tuple[str, str, Callable[[Any], Any], Callable[[Any], Any]], ...] = (
    # json key, attribute, from JSON, to JSON
    ("name", "name", str, str),
    ("validShape", "valid_shape", lambda v: tuple(int(d) for d in v), list),
    ("alignedShape", "aligned_shape", lambda v: tuple(int(d) for d in v), list),
    ("tensorLayout", "tensor_layout", str, str),
    ("tensorType", "tensor_type", str, str),
    ("quantiType", "quanti_type", str, str),
    ("shiftData", "shift_data", lambda v: tuple(int(d) for d in v), list),
    ("scaleData", "scale_data", lambda v: tuple(float(d) for d in v), list),
    ("zeroPointData", "zero_point_data", lambda v: tuple(int(d) for d in v), list),
    ("quantizeAxis", "quantize_axis", int, int),
    ("alignedByteSize", "aligned_byte_size", int, int),
    ("stride", "stride", lambda v: tuple(int(d) for d in v), list),
    ("npuc", "extra", dict, dict),
)


def properties_to_json(p: TensorProperties) -> dict[str, Any]:
    out = {key: to_json(getattr(p, attr)) for key, attr, _, to_json in PROPERTY_FIELDS}
    out["tensorLayoutValue"] = LAYOUTS[p.tensor_layout]
    out["tensorTypeValue"] = DATA_TYPES.index(p.tensor_type)
    out["quantiTypeValue"] = QUANTI_TYPES.index(p.quanti_type)
    return out


def properties_from_json(data: Any, where: str) -> TensorProperties:
    if not isinstance(data, dict):
        raise CorruptFileError(f"{where}: not an object; rebuild the contract with `npuc build --target bpu`")
    values = {}
    for key, attr, from_json, _ in PROPERTY_FIELDS:
        if key not in data:
            raise CorruptFileError(f"{where}: field '{key}' is missing; rebuild the contract")
        try:
            values[attr] = from_json(data[key])
        except (TypeError, ValueError):
            raise CorruptFileError(f"{where}.{key}: {str(data[key])[:40]!r} has the wrong type; rebuild") from None
    p = TensorProperties(**values)
    _check(p, where)
    return p


def _check(p: TensorProperties, where: str) -> None:
    problems = []
    if p.tensor_layout not in LAYOUTS:
        problems.append(f"tensorLayout {p.tensor_layout!r}")
    if p.tensor_type not in DATA_TYPES:
        problems.append(f"tensorType {p.tensor_type!r}")
    if p.quanti_type not in QUANTI_TYPES:
        problems.append(f"quantiType {p.quanti_type!r}")
    if not 0 < len(p.valid_shape) <= MAX_DIMS or any(d < 1 or d > 1 << 20 for d in p.valid_shape):
        problems.append(f"validShape {p.valid_shape}")
    if p.quanti_type != "NONE":
        data = p.shift_data if p.quanti_type == "SHIFT" else p.scale_data
        per_axis = len(data) > 1
        if not data or (
            per_axis and (not 0 <= p.quantize_axis < len(p.valid_shape) or len(data) != p.valid_shape[p.quantize_axis])
        ):
            problems.append(f"{p.quanti_type} data of length {len(data)} (axis {p.quantize_axis})")
    if problems:
        raise CorruptFileError(f"{where}: invalid {', '.join(problems)}; rebuild the contract")


# ---------------------------------------------------------------------------------------------------------
# Whole contract: JSON and C header


@dataclass
class Contract:
    name: str
    march: str
    model_file: str  # the QDQ ONNX beside the contract
    inputs: list[TensorProperties]
    outputs: list[TensorProperties]
    notes: list[str] = field(default_factory=list)


def contract_to_json(c: Contract) -> bytes:
    data = {
        "format": FORMAT,
        "version": VERSION,
        "name": c.name,
        "march": c.march,
        "quantized_model": c.model_file,
        "inputs": [properties_to_json(p) for p in c.inputs],
        "outputs": [properties_to_json(p) for p in c.outputs],
        "notes": c.notes,
    }
    return (json.dumps(data, indent=2, sort_keys=False) + "\n").encode()


def contract_from_json(raw: bytes, where: str) -> Contract:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"{where}: not JSON ({exc}); rebuild with `npuc build --target bpu`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CorruptFileError(f"{where}: not an npuc hbDNN contract (format field); rebuild it")
    if data.get("version") != VERSION:
        raise CorruptFileError(f"{where}: contract version {data.get('version')!r}, npuc reads {VERSION}; rebuild")
    lists = {}
    for key in ("inputs", "outputs"):
        if not isinstance(data.get(key), list) or not data[key]:
            raise CorruptFileError(f"{where}: '{key}' must be a non-empty list; rebuild the contract")
        lists[key] = [properties_from_json(p, f"{where}:{key}[{i}]") for i, p in enumerate(data[key])]
    model_file = str(data.get("quantized_model", ""))
    if not model_file or "/" in model_file or "\\" in model_file or model_file.startswith("."):
        raise CorruptFileError(f"{where}: quantized_model {model_file!r} must be a file name in the same folder")
    return Contract(
        str(data.get("name", "")),
        str(data.get("march", "")),
        model_file,
        lists["inputs"],
        lists["outputs"],
        list(data.get("notes", [])),
    )


def _c_properties(prefix: str, p: TensorProperties) -> list[str]:
    arrays, fields = [], []
    ident = f"{prefix}_{c_identifier(p.name, 't_')}"
    shift = scale = "{0}"
    if p.quanti_type == "SHIFT":
        arrays.append(f"static uint8_t {ident}_shift[] = {{{', '.join(map(str, p.shift_data))}}};")
        shift = f"{{.shiftLen = {len(p.shift_data)}, .shiftData = {ident}_shift}}"
    if p.quanti_type == "SCALE":
        arrays.append(f"static float {ident}_scale[] = {{{', '.join(f'{v!r}f' for v in map(float, p.scale_data))}}};")
        arrays.append(f"static int8_t {ident}_zero_point[] = {{{', '.join(map(str, p.zero_point_data))}}};")
        scale = (
            f"{{.scaleLen = {len(p.scale_data)}, .scaleData = {ident}_scale, "
            f".zeroPointLen = {len(p.zero_point_data)}, .zeroPointData = {ident}_zero_point}}"
        )
    fields = [
        f"    .validShape = {_c_shape(p.valid_shape)},",
        f"    .alignedShape = {_c_shape(p.aligned_shape)},",
        f"    .tensorLayout = {LAYOUTS[p.tensor_layout]}, /* {p.tensor_layout} */",
        f"    .tensorType = {DATA_TYPES.index(p.tensor_type)}, /* {p.tensor_type} */",
        f"    .shift = {shift},",
        f"    .scale = {scale},",
        f"    .quantiType = {QUANTI_TYPES.index(p.quanti_type)}, /* {p.quanti_type} */",
        f"    .quantizeAxis = {p.quantize_axis},",
        f"    .alignedByteSize = {p.aligned_byte_size},",
        f"    .stride = {_c_array(p.stride)},",
    ]
    head = [f"/* {c_comment(p.name)} */", f"static const hbDNNTensorProperties {ident} = {{"]
    return [*arrays, *head, *fields, "};", ""]


STANDALONE_TYPES = """\
#ifdef NPUC_HBDNN_STANDALONE /* the documented structs, for builds without Horizon's dnn/hb_dnn.h */
typedef struct { int32_t dimensionSize[8]; int32_t numDimensions; } hbDNNTensorShape;
typedef struct { int32_t shiftLen; uint8_t *shiftData; } hbDNNQuantiShift;
typedef struct { int32_t scaleLen; float *scaleData; int32_t zeroPointLen; int8_t *zeroPointData; } hbDNNQuantiScale;
typedef struct {
    hbDNNTensorShape validShape; hbDNNTensorShape alignedShape; int32_t tensorLayout; int32_t tensorType;
    hbDNNQuantiShift shift; hbDNNQuantiScale scale; int32_t quantiType; int32_t quantizeAxis;
    int32_t alignedByteSize; int32_t stride[8];
} hbDNNTensorProperties;
#else
#include "dnn/hb_dnn.h"
#endif
"""


def contract_to_header(c: Contract) -> bytes:
    prefix = c_identifier(c.name, "t_")
    guard = f"NPUC_{prefix.upper()}_HBDNN_CONTRACT_H"
    lines = [
        f"/* hbDNN I/O contract of {c_comment(c.name)} (march {c_comment(c.march)}), written by npuc. */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "#include <stdint.h>",
        STANDALONE_TYPES,
        f"#define {prefix.upper()}_INPUT_COUNT {len(c.inputs)}",
        f"#define {prefix.upper()}_OUTPUT_COUNT {len(c.outputs)}",
        "",
    ]
    for i, p in enumerate(c.inputs):
        lines += _c_properties(f"{prefix}_input{i}", p)
    for i, p in enumerate(c.outputs):
        lines += _c_properties(f"{prefix}_output{i}", p)
    lines += [f"#endif /* {guard} */", ""]
    return "\n".join(lines).encode()
