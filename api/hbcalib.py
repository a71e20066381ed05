"""Calibration from an hb_mapper config: samples from cal_data_dir go through the same preprocessing the
deployed model applies (runtime colour type, NV12 chroma subsampling, HzPreprocess), then npuc calibrates
the float model on them, so the thresholds are those of what the BPU input really sees."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from npuc.compiler import arrays
from npuc.compiler.errors import UserError
from npuc.frontends.colorspace import norm_vectors, runtime_pixels, train_picture_to_rgb, train_pixels
from npuc.frontends.hbconfig import HbConfig, InputConfig
from npuc.frontends.hbconfig_schema import CAL_DATA_TYPES
from npuc.passes.calibration.calitable import CalibrationTable


def _load_array(path: Path, spec: InputConfig, raw_dtype: str | None) -> np.ndarray:
    """An .npy array, the input's (or only) array of an .npz, or a raw file of `raw_dtype` values (hb_mapper's
    cal_data_type samples: the model input's elements, no header); every size checked before reading."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return arrays.load_arrays(path)[""]
    if suffix == ".npz":
        found = arrays.load_arrays(path)
        key = spec.name if spec.name in found else (next(iter(found)) if len(found) == 1 else None)
        if key is None:
            raise UserError(f"calibration sample {path.name}: no array named {spec.name!r}; save it with that key")
        return found[key]
    if raw_dtype is None:
        raise UserError(
            f"calibration sample {path.name}: a raw file needs calibration_parameters.cal_data_type "
            f"({' or '.join(CAL_DATA_TYPES)}); set it or save samples as .npy"
        )
    dtype = np.dtype(raw_dtype)
    want = int(np.prod(spec.shape)) * dtype.itemsize
    if path.stat().st_size != want:
        raise UserError(
            f"calibration sample {path.name}: {path.stat().st_size} bytes, but input {spec.name} {spec.shape} of "
            f"{raw_dtype} needs {want}; check cal_data_type and the input shape"
        )
    return np.fromfile(path, dtype=dtype)


def _sample_files(config: HbConfig, limit: int | None) -> list[Path]:
    """cal_data_dir's samples: pictures and .npy/.npz, and with cal_data_type any other file (raw values)."""
    from npuc.passes.calibration.preprocess import list_samples

    folder = config.cal_data_dir
    if config.cal_data_type is None or not folder.is_dir():
        return list_samples([folder], limit)
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise UserError(f"{config.source}: calibration_parameters.cal_data_dir: {folder} holds no files")
    return files[:limit] if limit is not None else files


def _sample_to_input(path: Path, spec: InputConfig, raw_dtype: str | None = None) -> np.ndarray:
    """One calibration file as the model's float input: pictures are decoded and resized to the input as
    `npuc calibrate` does (passes/calibration/pictures.py), converted to the runtime type (NV12 round trip included) and
    run through HzPreprocess; arrays of a featuremap are used as they are, arrays of an image input are the
    picture in input_type_train and input_layout_train."""
    from npuc.passes.calibration.pictures import decode_picture, normalize, resize_u8
    from npuc.passes.calibration.preprocess import IMAGE_SUFFIXES

    c_axis, h_axis, w_axis = (1, 2, 3) if spec.layout_train == "NCHW" else (3, 1, 2)
    h, w = spec.shape[h_axis], spec.shape[w_axis]
    if path.suffix.lower() in IMAGE_SUFFIXES:
        rgb = resize_u8(decode_picture(path), h, w)
    else:
        array = _load_array(path, spec, raw_dtype)
        if array.size != int(np.prod(spec.shape)):
            raise UserError(
                f"calibration sample {path.name}: {array.shape} does not fit input {spec.name} {spec.shape}"
            )
        if not spec.is_image:
            return array.astype(np.float32).reshape(spec.shape)
        hwc = np.moveaxis(array.reshape(spec.shape)[0], c_axis - 1, -1)
        rgb = train_picture_to_rgb(np.clip(np.rint(hwc), 0, 255).astype(np.uint8), spec.type_train, spec.space)
    pixels = train_pixels(runtime_pixels(rgb, spec.type_rt, spec.space, spec.name), spec.type_rt, spec.type_train,
                          spec.space)  # fmt: skip
    value = normalize(pixels, *norm_vectors(spec.norm_type, spec.mean, spec.scale, pixels.shape[-1]))[None]
    return np.ascontiguousarray(value if spec.layout_train == "NHWC" else value.transpose(0, 3, 1, 2))


def config_feeds(config: HbConfig) -> Iterator[dict[str, np.ndarray]]:
    """cal_data_dir's samples as feeds of the config's one input, through its preprocessing, one at a time."""
    if config.cal_data_dir is None:
        raise UserError(f"{config.source}: calibration_parameters.cal_data_dir: is not set; per_channel measures "
                        "each channel's range on the calibration samples")  # fmt: skip
    if len(config.inputs) != 1:
        raise UserError(f"{config.source}: calibration_parameters.per_channel: multi-input configs are not "
                        "supported; set it to False")  # fmt: skip
    spec = config.inputs[0]
    for path in _sample_files(config, None):
        yield {spec.name: _sample_to_input(path, spec, config.cal_data_type)}


def calibrate_config(config: HbConfig, model: Path, limit: int | None = None) -> CalibrationTable:
    """Calibrate `model` on cal_data_dir through the config's preprocessing (config must be bound)."""
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate

    if config.cal_data_dir is None:
        raise UserError(f"{config.source}: calibration_parameters.cal_data_dir: is not set; set it or pass --calib")
    if len(config.inputs) != 1:
        raise UserError(
            f"{config.source}: calibration_parameters.cal_data_dir: multi-input calibration from a config is not "
            "supported; calibrate with `npuc calibrate` on .npz samples and pass --calib"
        )
    spec = config.inputs[0]
    method, percentile = config.calib_method
    files = _sample_files(config, limit)
    with tempfile.TemporaryDirectory(prefix="npuc-cal-") as tmp:
        for i, path in enumerate(files):  # one file at a time: memory stays flat
            np.save(Path(tmp) / f"{i:06d}.npy", _sample_to_input(path, spec, config.cal_data_type))
        options = CalibrationOptions(method=method, percentile=percentile)
        return calibrate(model, [tmp], options=options, input_shapes={spec.name: spec.shape}).table


def calibration_inputs(config: HbConfig, model: Path) -> str:
    """A digest of everything a config's calibration reads (config must be bound): npuc's version, the model and
    its external data, every sample file's name and bytes, the input's preprocessing and the method. A table
    that records the same digest is the table calibration would write again."""
    from npuc.compiler.depfile import onnx_external_files
    from npuc.compiler.version import VERSION

    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}:{len(data)}:".encode() + data)

    def add_file(label: str, path: Path) -> None:
        file_digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                file_digest.update(chunk)
        add(label, file_digest.digest())

    add("npuc", VERSION.encode())
    for path in [model, *onnx_external_files(model)]:
        add_file("model", path)
    add("settings", repr((config.inputs, config.calib_method, config.cal_data_type)).encode())
    for path in _sample_files(config, None):
        add("sample", path.name.encode())
        add_file("bytes", path)
    return f"sha256:{digest.hexdigest()}"
