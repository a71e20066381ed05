"""Fused preprocessing (`--input-dtype uint8 --pixel-format F`): the cvimodel takes the camera's raw frame.

As tpu-mlir's `--fuse_preprocess --customization_format F` does, the model input becomes the uint8 frame (its
shape: NCHW for planar and gray frames, NHWC for packed ones) and the TPU routine starts with one step that
makes the model's first tensor of it, replacing the input's quantizing cast:
- each model channel k is read from frame channel `source[k]` (colour order: rgb/bgr frames for a bgr/rgb
  model swap channels on the load; packed frames are read with a pixel stride, the TDMA permute);
- int8: a per-channel 256-entry table uint8 -> int8 (lane k holds channel k's table), entry p being exactly
  what the CPU quant routine makes of the float (p - mean[k]) * scale[k] at the input threshold;
- bf16: the load converts uint8 to bf16 (exact), then per channel x * scale[k] + (-mean[k] * scale[k]).
The input tensor record is filled as tpu-mlir fills it: UINT8, the frame's shape, pixel_format (tpu-mlir's
customization_format name), aligned, and scale [1, 1, 1] / mean [0, 0, 0] - tpu-mlir's FusePreprocess resets the
input's scale and mean once the TPU applies them, and its codegen writes `mean` as scale * mean of those; it
writes no PreProcessHints for cv18xx.

`--color`, `--mean`, `--scale` describe the model (its channel order and normalisation, in 0..255 units); unset,
they come from the calibration table's `# preprocess:` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op
from npuc.passes.calitable import CalibrationTable
from npuc.passes.compare import recorded_preprocess
from npuc.passes.preprocess import Preprocess

# --pixel-format -> (tpu-mlir's customization_format, the frame's channel order, layout)
PIXEL_FORMATS = {
    "rgb_planar": ("RGB_PLANAR", "rgb", "planar"),
    "bgr_planar": ("BGR_PLANAR", "bgr", "planar"),
    "rgb_packed": ("RGB_PACKED", "rgb", "packed"),
    "bgr_packed": ("BGR_PACKED", "bgr", "packed"),
    "gray": ("GRAYSCALE", "gray", "planar"),
    "nv12": ("YUV_NV12", "yuv", "nv12"),
    "nv21": ("YUV_NV21", "yuv", "nv21"),
    "yuv420_planar": ("YUV420_PLANAR", "yuv", "yuv420"),
}
FRAME_OPTIONS = ("pixel_format", "aligned_input", "mean", "scale", "color")
KIND = "fused_preprocess"


@dataclass(frozen=True)
class FrameSpec:
    """The frame the runtime feeds and the model's own preprocessing."""

    pixel_format: str
    aligned: bool
    pre: Preprocess

    @property
    def vendor_name(self) -> str:
        return PIXEL_FORMATS[self.pixel_format][0]

    @property
    def order(self) -> str:
        return PIXEL_FORMATS[self.pixel_format][1]

    @property
    def packed(self) -> bool:
        return PIXEL_FORMATS[self.pixel_format][2] == "packed"


@dataclass
class FusedPreprocess:
    """Attributes of the fused step: model channel k <- frame channel source[k], its mean/scale; int8 tables."""

    source: tuple[int, ...]
    packed: bool
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    tables: np.ndarray | None = None  # (channels, 256) int8


def frame_spec(options: dict[str, Any], table: CalibrationTable | None, where: str) -> FrameSpec | None:
    """The frame of `--input-dtype uint8`, checked; None for a float input. A frame option without
    --input-dtype uint8 is an error (nothing would read it)."""
    dtype = options.get("input_dtype")
    if dtype is None:
        stray = [k for k in FRAME_OPTIONS if k in options]
        if stray:
            flag = "--" + stray[0].replace("_", "-")
            raise UserError(f"{flag} describes the uint8 frame of fused preprocessing: add --input-dtype uint8 "
                            "or remove it")  # fmt: skip
        return None
    if options.get("quant_input"):
        raise UserError("--quant-input and --input-dtype uint8 both set the input's type; keep one")
    if dtype != "uint8":
        raise UserError(f"--input-dtype {dtype} is not a cv18xx input; use uint8 (the camera frame, preprocessed on "
                        "the TPU) or leave it out (float32 input)")  # fmt: skip
    given = [k for k in ("mean", "scale", "color") if k in options]
    flags = Preprocess(
        mean=tuple(options.get("mean", (0.0,))),
        scale=tuple(options.get("scale", (1.0,))),
        color=options.get("color", "rgb"),
    )
    pre = flags if table is None else recorded_preprocess(table, flags, given, where)
    fmt = options.get("pixel_format") or ("gray" if pre.color == "gray" else f"{pre.color}_planar")
    if fmt not in PIXEL_FORMATS:
        raise UserError(f"--pixel-format {fmt} is not one of {', '.join(PIXEL_FORMATS)}")
    spec = FrameSpec(fmt, bool(options.get("aligned_input")), pre)
    if spec.order == "yuv":
        raise UserError(f"--pixel-format {fmt}: YUV frames (colour conversion on the TPU) have no cv18xx kernel yet; "
                        "feed rgb/bgr planar or packed frames")  # fmt: skip
    if spec.aligned:
        raise UserError(
            "--aligned-input (VPSS-aligned rows and planes) has no cv18xx kernel yet; feed unaligned frames"
        )
    return spec


def _source_channels(spec: FrameSpec, channels: int, name: str) -> tuple[int, ...]:
    """Frame channel of each model channel (the colour-order change)."""
    model, frame = spec.pre.color, spec.order
    wanted = 1 if frame == "gray" else 3
    if channels != wanted or (model == "gray") != (frame == "gray"):
        raise UserError(f"--pixel-format {spec.pixel_format} gives {wanted} channel(s) of {frame}, but input '{name}' "
                        f"takes {channels} channel(s) of {model} (--color); pick a matching format")  # fmt: skip
    return tuple(range(channels)) if model == frame else tuple(reversed(range(channels)))


def _per_channel(values: tuple[float, ...], channels: int, flag: str) -> tuple[float, ...]:
    if len(values) not in (1, channels):
        raise UserError(f"{flag} has {len(values)} values but the input has {channels} channels; give 1 or {channels}")
    return tuple(float(v) for v in np.broadcast_to(np.asarray(values, np.float64), (channels,)))


def int8_tables(mean: tuple[float, ...], scale: tuple[float, ...], threshold: float) -> np.ndarray:
    """(channels, 256) int8: entry p of channel k is the CPU quant routine's int8 of float32((p - mean) * scale)
    (round half away from zero of x * 127/threshold in float32, saturated)."""
    p = np.arange(256, dtype=np.float32)[None, :]
    x = (p - np.asarray(mean, np.float32)[:, None]) * np.asarray(scale, np.float32)[:, None]
    x = x * np.float32(127.0 / threshold)
    rounded = np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))
    return np.clip(rounded, -128, 127).astype(np.int8)


def fuse_preprocess(qgraph: Graph, cpu_ops: list[Op], tpu_ops: list[Op], spec: FrameSpec) -> str:
    """Make the model's single image input the uint8 frame and put the fused step first in `tpu_ops` in place
    of the input's cast; returns the input's name."""
    if len(qgraph.inputs) != 1:
        raise UserError(f"--input-dtype uint8 feeds one image input; the model has {len(qgraph.inputs)} inputs")
    name = qgraph.inputs[0]
    shape = tuple(qgraph.shape(name))
    if len(shape) != 4 or qgraph.input_layouts.get(name, "nchw") != "nchw":
        raise UserError(f"--input-dtype uint8: input '{name}' ({'x'.join(map(str, shape))}) is not an NCHW image")
    entry = next((op for op in cpu_ops + tpu_ops if op.kind == "cast" and op.inputs == [name]), None)
    if entry is None or any(name in op.inputs for op in cpu_ops + tpu_ops if op is not entry):
        raise UserError(f"--input-dtype uint8: input '{name}' is read by more than its conversion to the model's "
                        "number format; use --quant-input-free builds of a plain image model")  # fmt: skip
    n, c, h, w = shape
    out = qgraph.tensors[entry.outputs[0]]
    attrs = FusedPreprocess(
        source=_source_channels(spec, c, name),
        packed=spec.packed,
        mean=_per_channel(spec.pre.mean, c, "--mean"),
        scale=_per_channel(spec.pre.scale, c, "--scale"),
    )
    if out.dtype == "int8":
        attrs.tables = int8_tables(attrs.mean, attrs.scale, out.quant.threshold)
    (cpu_ops if entry in cpu_ops else tpu_ops).remove(entry)
    tpu_ops.insert(0, Op(entry.name, KIND, [name], list(entry.outputs), attrs))
    t = qgraph.tensors[name]
    t.dtype, t.quant = "uint8", None
    t.shape = (n, h, w, c) if spec.packed else (n, c, h, w)
    return name


def picture_frame(rgb: np.ndarray, vendor_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """An HxWx3 RGB picture as the uint8 frame of an input tensor with this pixel_format and 4-D shape: resized
    bilinearly (as calibrate resizes) to the frame's size and rounded to uint8, as a camera would give it."""
    from npuc.passes.preprocess import COLOR_ORDERS, resize_bilinear

    fmt = next((k for k, v in PIXEL_FORMATS.items() if v[0] == vendor_name), None)
    if fmt is None or PIXEL_FORMATS[fmt][1] == "yuv":
        raise UserError(f"input pixel_format {vendor_name!r}: npuc cannot make such a frame from a picture")
    _, order, layout = PIXEL_FORMATS[fmt]
    n, h, w = (shape[0], shape[1], shape[2]) if layout == "packed" else (shape[0], shape[2], shape[3])
    img = COLOR_ORDERS[order](resize_bilinear(rgb, h, w))
    frame = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    frame = frame if layout == "packed" else frame.transpose(2, 0, 1)
    return np.ascontiguousarray(np.broadcast_to(frame[None], (n, *frame.shape)))


def input_fields(spec: FrameSpec) -> dict[str, Any]:
    """The tensor_map fields of the frame input, as tpu-mlir writes them (the module docstring)."""
    return {"pixel_format": spec.vendor_name, "aligned": spec.aligned, "scale": [1.0] * 3, "mean": [0.0] * 3}
