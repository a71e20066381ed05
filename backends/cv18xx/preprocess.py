"""Fused preprocessing (`--input-dtype uint8 --pixel-format F`): the cvimodel takes the camera's raw frame.

As tpu-mlir's `--fuse_preprocess --customization_format F` does, the model input becomes the uint8 frame (its
shape: NHWC for packed frames, else the model's NCHW; a YUV frame fills the start of its NCHW-sized tensor) and
the TPU routine starts with the steps that make the model's first tensor of it, replacing the input's
quantizing cast. A YUV frame first becomes uint8 RGB planes in the model's channel order (kernels/csc.py,
tpu-mlir's BT.601 formulas in bf16); then, for every format:
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
from npuc.passes.calibration.calitable import CalibrationTable
from npuc.passes.calibration.compare import recorded_preprocess
from npuc.passes.calibration.preprocess import Preprocess

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
CSC_KIND = "fused_yuv_to_rgb"


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


@dataclass(frozen=True)
class FrameLayout:
    """Byte strides of a frame in its buffer: per picture, per plane (planar; YUV: the U and V plane offsets),
    per row (YUV: the Y rows, then the chroma rows)."""

    picture: int
    plane: int
    row: int
    chroma_row: int = 0
    u_offset: int = 0
    v_offset: int = 0


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def frame_layout(spec: FrameSpec, chip: str, shape: tuple[int, int, int, int]) -> FrameLayout:
    """Where a frame's bytes are (tpu-mlir's setPixelAlign / aligned_image_size): with --aligned-input, VPSS
    rows, chroma rows and planes are padded - cv183x to 32 / 32 / 4096 bytes, the others to 64 / 64 / 64 (a
    yuv420_planar Y row to twice the row alignment); unaligned, everything is packed."""
    n, c, h, w = shape
    row_align, plane_align = ((32, 0x1000) if chip == "cv183x" else (64, 64)) if spec.aligned else (1, 1)
    layout = PIXEL_FORMATS[spec.pixel_format][2]
    if spec.order == "yuv":
        y_row = _align(w, 2 * row_align if layout == "yuv420" else row_align)
        chroma_row = _align(w // 2 if layout == "yuv420" else w, row_align)
        u = _align(h * y_row, plane_align)
        v = _align(u + h // 2 * chroma_row, plane_align) if layout == "yuv420" else u
        return FrameLayout(_align(v + h // 2 * chroma_row, plane_align), 0, y_row, chroma_row, u, v)
    if spec.packed or spec.order == "gray":  # tpu-mlir pads packed and grey rows only
        row = _align(w * (c if spec.packed else 1), row_align)
        return FrameLayout(row * h * (1 if spec.packed else c), row * h, row)
    row = _align(w, row_align)
    plane = _align(row * h, plane_align)
    return FrameLayout(plane * c, plane, row)


@dataclass
class FusedPreprocess:
    """Attributes of the fused step: model channel k <- frame channel source[k], its mean/scale; int8 tables;
    where the frame's bytes are."""

    source: tuple[int, ...]
    packed: bool
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    layout: FrameLayout
    tables: np.ndarray | None = None  # (channels, 256) int8


@dataclass
class FusedCsc:
    """A YUV frame's colour conversion to uint8 planes: `layout` nv12 | nv21 | yuv420, `planes` the model's
    channel order as r/g/b (kernels/csc.py)."""

    layout: str
    planes: tuple[str, ...]
    frame: FrameLayout


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
    return FrameSpec(fmt, bool(options.get("aligned_input")), pre)


def _source_channels(spec: FrameSpec, channels: int, name: str) -> tuple[int, ...]:
    """Frame channel of each model channel (the colour-order change)."""
    model, frame = spec.pre.color, spec.order
    wanted = 1 if frame == "gray" else 3
    if frame == "yuv" and channels == 3 and model != "gray":
        return tuple(range(channels))  # the colour conversion writes the planes in the model's order
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


def fuse_preprocess(qgraph: Graph, cpu_ops: list[Op], tpu_ops: list[Op], spec: FrameSpec,
                    chip: str) -> tuple[list[str], int]:  # fmt: skip
    """Make the model's single image input the uint8 frame and put the fused steps first in `tpu_ops` in place
    of the input's cast; returns the uint8 tensors (the input, then a YUV frame's RGB planes) and the frame
    tensor's byte size."""
    if len(qgraph.inputs) != 1:
        raise UserError(f"--input-dtype uint8 feeds one image input; the model has {len(qgraph.inputs)} inputs")
    name = qgraph.inputs[0]
    shape = tuple(qgraph.shape(name))
    if len(shape) != 4 or qgraph.input_layouts.get(name, "nchw") != "nchw":
        raise UserError(f"--input-dtype uint8: input '{name}' ({'x'.join(map(str, shape))}) is not an NCHW image")
    entry = next((op for op in cpu_ops + tpu_ops if op.kind == "cast" and op.inputs == [name]), None)
    if entry is None or any(name in op.inputs for op in cpu_ops + tpu_ops if op is not entry):
        raise UserError(f"--input-dtype uint8: input '{name}' is read by more than its conversion to the model's "
                        "number format; the frame can only feed an image input")  # fmt: skip
    n, c, h, w = shape
    out = qgraph.tensors[entry.outputs[0]]
    frame = frame_layout(spec, chip, shape)
    attrs = FusedPreprocess(
        source=_source_channels(spec, c, name),
        packed=spec.packed,
        mean=_per_channel(spec.pre.mean, c, "--mean"),
        scale=_per_channel(spec.pre.scale, c, "--scale"),
        layout=frame if spec.order != "yuv" else FrameLayout(c * h * w, h * w, w),
    )
    if out.dtype == "int8":
        attrs.tables = int8_tables(attrs.mean, attrs.scale, out.quant.threshold)
    (cpu_ops if entry in cpu_ops else tpu_ops).remove(entry)
    planar = name
    if spec.order == "yuv":  # the frame's tensor keeps the model's NCHW shape, as tpu-mlir's does
        planar = qgraph.unique_name(f"{name}_rgb")
        qgraph.add_tensor(planar, shape, "uint8")
        layout = PIXEL_FORMATS[spec.pixel_format][2]
        csc = FusedCsc(layout, tuple(spec.pre.color), frame)
        tpu_ops.insert(0, Op(f"{name}_yuv_to_rgb", CSC_KIND, [name], [planar], csc))
    tpu_ops.insert(1 if planar != name else 0, Op(entry.name, KIND, [planar], list(entry.outputs), attrs))
    t = qgraph.tensors[name]
    t.dtype, t.quant = "uint8", None
    t.shape = (n, h, w, c) if spec.packed else (n, c, h, w)
    return list(dict.fromkeys([name, planar])), frame_bytes(spec, chip, shape)


def input_fields(spec: FrameSpec) -> dict[str, Any]:
    """The tensor_map fields of the frame input, as tpu-mlir writes them (the module docstring); `size` comes
    from the memory plan (frame_bytes)."""
    return {"pixel_format": spec.vendor_name, "aligned": spec.aligned, "scale": [1.0] * 3, "mean": [0.0] * 3}


def frame_bytes(spec: FrameSpec, chip: str, shape: tuple[int, ...]) -> int:
    """The frame tensor's `size`: n pictures of the layout's stride (tpu-mlir: only an aligned frame differs
    from the tensor's element count)."""
    return shape[0] * frame_layout(spec, chip, shape).picture if spec.aligned else int(np.prod(shape))
