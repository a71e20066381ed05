"""bpu output folders as artifacts: detected by hbdnn_contract.json; `inspect` prints the contract, `run`
executes the folder's QDQ ONNX with onnxruntime (from the files on disk).

Feeds follow the contract: an image input takes its runtime pixels (NV12 bytes, H*3/2 x W; or u8 NHWC
RGB/BGR/YUV444/Y pictures) or the QDQ model's own int8 (u8 - 128) NHWC tensor; an S8 featuremap takes
float32 or its int8 codes (dequantized with the contract's SCALE/SHIFT). S8 outputs are returned as codes,
quantized from the model's dequantized values with the contract's formula.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npuc.compiler.artifacts import ArtifactKind, ArtifactOptions, TensorSpec, register_artifact
from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.numformats.horizon_int8 import (
    horizon_scale_dequantize,
    horizon_scale_quantize,
    horizon_shift_dequantize,
    horizon_shift_quantize,
)
from npuc.frontends.colorspace import nv12_to_yuv444, to_int8_128

from .build import CONTRACT_FILE
from .contract import Contract, TensorProperties, contract_from_json
from .qdq_runtime import qdq_session

MAX_CONTRACT_BYTES = 4 << 20


def _matches(path: Path) -> bool:
    return path.is_dir() and (path / CONTRACT_FILE).is_file()


def read_contract(folder: Path) -> Contract:
    path = folder / CONTRACT_FILE
    if path.stat().st_size > MAX_CONTRACT_BYTES:
        raise CorruptFileError(f"{path}: {path.stat().st_size} bytes is too large for a contract; rebuild it")
    return contract_from_json(path.read_bytes(), str(path))


def _fmt(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _quant_text(p: TensorProperties) -> str:
    if p.quanti_type == "SHIFT":
        return f"SHIFT {list(p.shift_data)}" + (f" axis {p.quantize_axis}" if len(p.shift_data) > 1 else "")
    if p.quanti_type == "SCALE":
        axis = f" axis {p.quantize_axis}" if len(p.scale_data) > 1 else ""
        return f"SCALE {[float(f'{s:.6g}') for s in p.scale_data]} zp {list(p.zero_point_data)}{axis}"
    return "NONE"


def describe_contract(c: Contract) -> str:
    lines = [f"hbDNN contract  {c.name}  march {c.march}  quantized model {c.model_file}"]
    for title, tensors in (("inputs", c.inputs), ("outputs", c.outputs)):
        lines.append(title)
        for p in tensors:
            lines.append(
                f"  {p.name:<20} {p.tensor_type:<10} {p.tensor_layout:<5} valid {_fmt(p.valid_shape):<14} "
                f"aligned {_fmt(p.aligned_shape):<14} {p.aligned_byte_size} bytes  stride {list(p.stride)}  "
                f"{_quant_text(p)}"
            )
            if p.extra.get("input_type_rt"):
                e = p.extra
                lines.append(
                    f"  {'':<20} {e['input_type_rt']} -> {e['input_type_train']} ({e['input_space_and_range']}), "
                    f"{e['norm_type']} mean {e['mean_value']} scale {e['scale_value']}"
                )
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


def _describe(path: Path, options: ArtifactOptions) -> str:
    return describe_contract(read_contract(path))


def _session(folder: Path, c: Contract):  # noqa: ANN202 - onnxruntime session
    model = folder / c.model_file
    if not model.is_file():
        raise CorruptFileError(f"{folder}: {c.model_file} named by the contract is missing; rebuild the folder")
    try:
        return qdq_session(model.read_bytes())
    except Exception as exc:  # onnxruntime's exception types are not importable by name
        raise CorruptFileError(f"{model}: onnxruntime cannot load it ({str(exc)[:160]}); rebuild") from None


ORT_TYPES = {"tensor(int8)": "int8", "tensor(int32)": "int32", "tensor(int64)": "int64"}  # else float32


def _model_inputs(folder: Path) -> tuple[Contract, object, dict[str, TensorSpec]]:
    c = read_contract(folder)
    session = _session(folder, c)
    specs = {}
    for i in session.get_inputs():
        dtype = ORT_TYPES.get(i.type, "float32")
        specs[i.name] = TensorSpec(i.name, tuple(int(d) for d in i.shape), dtype)
    return c, session, specs


def _inputs(path: Path, options: ArtifactOptions) -> list[TensorSpec]:
    c, _, specs = _model_inputs(path)
    return [specs[p.name] for p in c.inputs]


def _image_feed(p: TensorProperties, spec: TensorSpec, value: np.ndarray) -> np.ndarray:
    n, h, w, ch = spec.shape
    if value.dtype == np.int8 and value.shape == spec.shape:
        return value
    if value.dtype != np.uint8:
        raise UserError(f"input '{p.name}' ({p.tensor_type}): feed uint8 pixels or the int8 {_fmt(spec.shape)} tensor")
    if p.tensor_type == "IMG_NV12":
        return to_int8_128(nv12_to_yuv444(value, h, w, p.name))[None]
    if value.size != n * h * w * ch:
        raise UserError(f"input '{p.name}': {value.size} pixels given, {p.tensor_type} {h}x{w} needs {n * h * w * ch}")
    pixels = value.reshape(p.valid_shape)
    if p.tensor_layout == "NCHW":
        pixels = pixels.transpose(0, 2, 3, 1)
    return to_int8_128(pixels.reshape(spec.shape))


def _dequantize(p: TensorProperties, codes: np.ndarray) -> np.ndarray:
    axis = p.quantize_axis if max(len(p.shift_data), len(p.scale_data)) > 1 else None
    if p.quanti_type == "SHIFT":
        return horizon_shift_dequantize(codes, np.array(p.shift_data), axis)
    return horizon_scale_dequantize(codes, np.array(p.scale_data), np.array(p.zero_point_data), axis)


def _quantize(p: TensorProperties, values: np.ndarray) -> np.ndarray:
    axis = p.quantize_axis if max(len(p.shift_data), len(p.scale_data)) > 1 else None
    if p.quanti_type == "SHIFT":
        return horizon_shift_quantize(values, np.array(p.shift_data), "s8", axis)
    return horizon_scale_quantize(values, np.array(p.scale_data), np.array(p.zero_point_data), "s8", axis)


def _run(path: Path, feeds: dict[str, np.ndarray], options: ArtifactOptions) -> dict[str, np.ndarray]:
    c, session, specs = _model_inputs(path)
    model_feeds = {}
    for p in c.inputs:
        if p.name not in feeds:
            raise UserError(f"no feed for input '{p.name}'; the inputs are {[q.name for q in c.inputs]}")
        value = np.asarray(feeds[p.name])
        if p.tensor_type.startswith("IMG_"):
            value = _image_feed(p, specs[p.name], value)
        elif p.quanti_type != "NONE" and value.dtype == np.int8:
            value = _dequantize(p, value)
        value = value.astype(specs[p.name].dtype) if specs[p.name].dtype != "int8" else value
        if tuple(value.shape) != specs[p.name].shape:
            raise UserError(f"input '{p.name}': shape {_fmt(value.shape)}, the model takes {_fmt(specs[p.name].shape)}")
        model_feeds[p.name] = value
    names = [p.name for p in c.outputs]
    values = session.run(names, model_feeds)
    return {p.name: (_quantize(p, v) if p.tensor_type == "S8" else v) for p, v in zip(c.outputs, values, strict=True)}


register_artifact(ArtifactKind("bpu", _matches, _describe, _inputs, _run))
