"""Calibration from an hb_mapper config: samples from cal_data_dir go through the same preprocessing the
deployed model applies (runtime colour type, NV12 chroma subsampling, HzPreprocess), then npuc calibrates
the float model on them, so the thresholds are those of what the BPU input really sees."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from npuc.compiler.errors import UserError
from npuc.passes.calitable import CalibrationTable
from npuc.passes.colorspace import runtime_pixels, train_picture_to_rgb

from .hbconfig import HbConfig, InputConfig


def _load_array(path: Path, name: str) -> np.ndarray:
    """A .npy array, or the `name` (or only) array of an .npz, without pickles."""
    try:
        with open(path, "rb") as f:
            loaded = np.load(f, allow_pickle=False)
            if isinstance(loaded, np.lib.npyio.NpzFile):
                key = name if name in loaded.files else (loaded.files[0] if len(loaded.files) == 1 else None)
                if key is None:
                    raise UserError(f"calibration sample {path.name}: no array named {name!r}; save it with that key")
                return loaded[key]
            return loaded
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"calibration sample {path.name}: not a readable array ({exc}); re-save it") from None


def _sample_to_input(path: Path, spec: InputConfig) -> np.ndarray:
    """One calibration file as the model's float input: pictures are resized to the input, converted to the
    runtime type (NV12 round trip included) and run through HzPreprocess; arrays of a featuremap are used
    as they are, arrays of an image input are the picture in input_type_train and input_layout_train."""
    from npuc.passes.preprocess import IMAGE_SUFFIXES, decode_image, resize_bilinear

    c_axis, h_axis, w_axis = (1, 2, 3) if spec.layout_train == "NCHW" else (3, 1, 2)
    h, w = spec.shape[h_axis], spec.shape[w_axis]
    if path.suffix.lower() in IMAGE_SUFFIXES:
        rgb = np.clip(np.rint(resize_bilinear(decode_image(path), h, w)), 0, 255).astype(np.uint8)
    else:
        array = _load_array(path, spec.name)
        if array.size != int(np.prod(spec.shape)):
            raise UserError(
                f"calibration sample {path.name}: {array.shape} does not fit input {spec.name} {spec.shape}"
            )
        if not spec.is_image:
            return array.astype(np.float32).reshape(spec.shape)
        hwc = np.moveaxis(array.reshape(spec.shape)[0], c_axis - 1, -1)
        rgb = train_picture_to_rgb(np.clip(np.rint(hwc), 0, 255).astype(np.uint8), spec.type_train, spec.space)
    pixels = runtime_pixels(rgb, spec.type_rt, spec.space, spec.name)
    value = spec.affine().apply(pixels)[None]  # 1 x H x W x C
    return np.ascontiguousarray(value if spec.layout_train == "NHWC" else value.transpose(0, 3, 1, 2))


def calibrate_config(config: HbConfig, model: Path, limit: int | None = None) -> CalibrationTable:
    """Calibrate `model` on cal_data_dir through the config's preprocessing (config must be bound)."""
    from npuc.passes.calibrate import CalibrationOptions, calibrate
    from npuc.passes.preprocess import list_samples

    if config.cal_data_dir is None:
        raise UserError(f"{config.source}: calibration_parameters.cal_data_dir: is not set; set it or pass --calib")
    if len(config.inputs) != 1:
        raise UserError(
            f"{config.source}: calibration_parameters.cal_data_dir: multi-input calibration from a config is not "
            "supported; calibrate with `npuc calibrate` on .npz samples and pass --calib"
        )
    spec = config.inputs[0]
    method, percentile = config.calib_method
    files = list_samples([config.cal_data_dir], limit)
    with tempfile.TemporaryDirectory(prefix="npuc-cal-") as tmp:
        for i, path in enumerate(files):  # one file at a time: memory stays flat
            np.save(Path(tmp) / f"{i:06d}.npy", _sample_to_input(path, spec))
        options = CalibrationOptions(method=method, percentile=percentile)
        return calibrate(model, [tmp], options=options, input_shapes={spec.name: spec.shape}).table
