"""Camera frames made on the host from pictures, for a fused-preprocessing cvimodel (preprocess.py): what
`npuc run MODEL --input photo.jpg` feeds, laid out as the input tensor's pixel_format and `aligned` say."""

from __future__ import annotations

import numpy as np

from npuc.backends.cv18xx.preprocess import PIXEL_FORMATS, FrameLayout, FrameSpec, frame_layout
from npuc.compiler.errors import UserError
from npuc.passes.calibration.pictures import COLOR_ORDERS, resize_u8
from npuc.passes.calibration.preprocess import Preprocess

# BT.601 limited range, the inverse of kernels/csc.py's formulas: rows Y, U, V of (R, G, B) gains, then offsets
RGB_TO_YUV = np.array([[0.257, 0.504, 0.098], [-0.148, -0.291, 0.439], [0.439, -0.368, -0.071]], np.float32)
YUV_OFFSETS = np.array([16.0, 128.0, 128.0], np.float32)


def _u8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def yuv_planes(rgb: np.ndarray, layout: str) -> list[np.ndarray]:
    """An HxWx3 uint8 RGB picture (even sides) as the 2-D byte planes of an nv12 / nv21 / yuv420 frame: Y, then
    the interleaved chroma rows or the U and V planes; chroma is the mean of each 2x2 block."""
    h, w = rgb.shape[:2]
    yuv = rgb.astype(np.float32) @ RGB_TO_YUV.T + YUV_OFFSETS
    chroma = yuv[..., 1:].reshape(h // 2, 2, w // 2, 2, 2).mean(axis=(1, 3))
    u, v = _u8(chroma[..., 0]), _u8(chroma[..., 1])
    if layout == "yuv420":
        return [_u8(yuv[..., 0]), u, v]
    pairs = np.stack([v, u] if layout == "nv21" else [u, v], axis=-1)
    return [_u8(yuv[..., 0]), pairs.reshape(h // 2, w)]


def _place(spec: FrameSpec, f: FrameLayout, frame: np.ndarray, n: int, c: int, h: int, w: int) -> np.ndarray:
    """An unaligned NCHW / NHWC frame (uint8) copied into a buffer of `f`'s strides, n pictures."""
    pictures = np.zeros((n, f.picture), np.uint8)
    if spec.packed or spec.order == "gray":  # rows of w*c (packed) or w (grey) bytes, `row` apart
        width = w * c if spec.packed else w
        pictures[:, : h * f.row].reshape(n, h, f.row)[..., :width] = frame.reshape(n, h, width)
    else:
        planes = pictures.reshape(n, c, f.plane)[..., : h * f.row].reshape(n, c, h, f.row)
        planes[..., :w] = frame.reshape(n, c, h, w)
    return pictures.reshape(-1)


def picture_frame(rgb: np.ndarray, vendor_name: str, shape: tuple[int, ...], aligned: bool = False,
                  chip: str = "cv181x") -> np.ndarray:  # fmt: skip
    """An HxWx3 RGB picture as the uint8 input of a tensor with this pixel_format, 4-D shape and alignment on
    `chip`: resized to the frame's size as calibrate resizes (OpenCV's uint8 bilinear), as a camera gives it.
    Unaligned it has the tensor's shape (a YUV frame fills the start of its NCHW-sized tensor);
    aligned it is the tensor's flat bytes."""
    fmt = next((k for k, v in PIXEL_FORMATS.items() if v[0] == vendor_name), None)
    if fmt is None:
        raise UserError(f"input pixel_format {vendor_name!r}: npuc cannot make such a frame from a picture")
    spec = FrameSpec(fmt, aligned, Preprocess())
    n, c, h, w = (shape[0], shape[3], shape[1], shape[2]) if spec.packed else tuple(shape)
    img = resize_u8(rgb, h, w)
    f = frame_layout(spec, chip, (n, c, h, w))
    if spec.order == "yuv":
        if n != 1:
            raise UserError(f"a YUV frame input is one picture, this one holds {n}")
        planes = yuv_planes(img, PIXEL_FORMATS[fmt][2])
        out = np.zeros(f.picture if aligned else int(np.prod(shape)), np.uint8)
        offsets = [0, f.u_offset, f.v_offset]
        for plane, offset, row in zip(planes, offsets, [f.row, f.chroma_row, f.chroma_row]):
            out[offset : offset + plane.shape[0] * row].reshape(-1, row)[:, : plane.shape[1]] = plane
        return out if aligned else out.reshape(shape)
    frame = COLOR_ORDERS[spec.order](img)
    frame = _u8(frame) if spec.packed else _u8(frame).transpose(2, 0, 1)
    frame = np.ascontiguousarray(np.broadcast_to(frame[None], (n, *frame.shape)))
    return _place(spec, f, frame, n, c, h, w) if aligned else frame
