"""Input preprocessing as Horizon's hb_mapper defines it (specs/dmp-lyngor-horizon.md §3.2).

- Colour spaces: RGB/BGR <-> YUV444 with ITU-R BT.601 coefficients, full range (`regular`, [0,255]) or
  video range (`bt601_video`, Y in [16,235]); NV12 is YUV420 semi-planar: the H x W luma plane, then one
  interleaved U,V pair per 2x2 block (H/2 x W rows of bytes). NV12 needs even H and W.
- The model's runtime input (`input_type_rt`) is converted to its training colour space
  (`input_type_train`); the allowed pairs are the vendor's (TRAIN_FROM_RT).
- HzPreprocess: the deployed model is fed int8 = u8 - 128 and computes `((x + 128) - mean) * scale` per
  channel after the colour conversion. Every step is affine per pixel, so the whole chain is one
  channel matrix plus bias (`PreprocessAffine`): the same numbers drive the numpy reference, the QDQ
  model's preprocessing node and calibration, so a config calibrates on what the deployed model sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from npuc.compiler.errors import UserError

# BT.601 RGB -> YCbCr: rows Y, U (Cb), V (Cr); offsets added after the matrix (0..255 inputs).
_BT601_MATRIX = np.array(
    [[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]], dtype=np.float64
)
# Video range scales Y to 219/255 and chroma to 224/255 levels and lifts Y to 16.
_VIDEO_GAIN = np.array([219.0, 224.0, 224.0]) / 255.0


@dataclass(frozen=True)
class YuvSpace:
    """One YUV encoding: `yuv = matrix @ rgb + offset` on 0..255 values."""

    matrix: np.ndarray  # 3x3, rows Y, U, V; columns R, G, B
    offset: np.ndarray  # 3

    def inverse(self) -> tuple[np.ndarray, np.ndarray]:
        """`rgb = inv @ yuv + inv_offset`."""
        inv = np.linalg.inv(self.matrix)
        return inv, -inv @ self.offset


YUV_SPACES: Mapping[str, YuvSpace] = MappingProxyType(
    {
        "regular": YuvSpace(_BT601_MATRIX, np.array([0.0, 128.0, 128.0])),
        "bt601_video": YuvSpace(_BT601_MATRIX * _VIDEO_GAIN[:, None], np.array([16.0, 128.0, 128.0])),
    }
)

# Channel order of each colour type (what a 3-channel pixel holds); gray has one channel.
CHANNELS: Mapping[str, int] = MappingProxyType({"rgb": 3, "bgr": 3, "yuv444": 3, "nv12": 3, "gray": 1})
# input_type_train <- allowed input_type_rt (vendor table)
TRAIN_FROM_RT: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "yuv444": ("nv12", "yuv444"),
        "rgb": ("nv12", "yuv444", "rgb", "bgr"),
        "bgr": ("nv12", "yuv444", "rgb", "bgr"),
        "gray": ("gray",),
        "featuremap": ("featuremap",),
    }
)
INT8_OFFSET = 128  # the deployed model takes int8 = u8 - 128 for every image type


def _u8(values: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def _space(name: str) -> YuvSpace:
    if name not in YUV_SPACES:
        raise UserError(f"input_space_and_range {name!r} is not one of {', '.join(YUV_SPACES)}")
    return YUV_SPACES[name]


def rgb_to_yuv444(rgb: np.ndarray, space: str = "regular") -> np.ndarray:
    """...x3 RGB (0..255) -> ...x3 YUV444 uint8, rounded half to even."""
    s = _space(space)
    return _u8(np.asarray(rgb, np.float64) @ s.matrix.T + s.offset)


def yuv444_to_rgb(yuv: np.ndarray, space: str = "regular") -> np.ndarray:
    """...x3 YUV444 -> ...x3 RGB uint8, rounded half to even and clipped."""
    inv, inv_offset = _space(space).inverse()
    return _u8(np.asarray(yuv, np.float64) @ inv.T + inv_offset)


def check_even_hw(name: str, height: int, width: int, rt: str = "nv12") -> None:
    """NV12 (and YUV444 as hb_mapper takes it) needs even H and W."""
    if height % 2 or width % 2:
        raise UserError(
            f"input '{name}': input_type_rt {rt} needs even height and width, got {height}x{width}; "
            "change input_shape (or resize the model input) to even sizes"
        )


def yuv444_to_nv12(yuv: np.ndarray, name: str = "input") -> np.ndarray:
    """HxWx3 YUV444 -> (H*3/2)xW NV12 bytes; each chroma sample is its 2x2 block's mean (half to even)."""
    yuv = np.asarray(yuv)
    if yuv.ndim != 3 or yuv.shape[2] != 3:
        raise UserError(f"input '{name}': YUV444 picture must be HxWx3, got shape {yuv.shape}")
    h, w = yuv.shape[:2]
    check_even_hw(name, h, w)
    blocks = yuv[..., 1:].astype(np.float64).reshape(h // 2, 2, w // 2, 2, 2).mean(axis=(1, 3))
    uv = _u8(blocks).reshape(h // 2, w)  # U,V interleaved along the row
    return np.concatenate([yuv[..., 0].astype(np.uint8), uv], axis=0)


def nv12_to_yuv444(nv12: np.ndarray, height: int, width: int, name: str = "input") -> np.ndarray:
    """(H*3/2)xW NV12 bytes (or the flat buffer) -> HxWx3 YUV444, chroma repeated over its 2x2 block."""
    check_even_hw(name, height, width)
    flat = np.asarray(nv12, dtype=np.uint8).reshape(-1)
    want = height * width * 3 // 2
    if flat.size != want:
        raise UserError(
            f"input '{name}': NV12 buffer has {flat.size} bytes, a {height}x{width} picture needs {want}; "
            "feed H*3/2 rows of W bytes"
        )
    luma = flat[: height * width].reshape(height, width)
    uv = flat[height * width :].reshape(height // 2, width // 2, 2)
    chroma = np.repeat(np.repeat(uv, 2, axis=0), 2, axis=1)
    return np.concatenate([luma[..., None], chroma], axis=2)


def rgb_to_nv12(rgb: np.ndarray, space: str = "regular", name: str = "input") -> np.ndarray:
    """HxWx3 RGB uint8 -> NV12 bytes, as a camera pipeline would deliver the picture."""
    return yuv444_to_nv12(rgb_to_yuv444(rgb, space), name)


def rgb_to_gray(rgb: np.ndarray) -> np.ndarray:
    """...x3 RGB -> ...x1 BT.601 luma, uint8."""
    return _u8(np.asarray(rgb, np.float64) @ _BT601_MATRIX[0])[..., None]


def to_int8_128(u8: np.ndarray) -> np.ndarray:
    """The deployed model's image input: u8 - 128 as int8 (hb_mapper's *_128 types)."""
    return (np.asarray(u8, dtype=np.int16) - INT8_OFFSET).astype(np.int8)


# ---------------------------------------------------------------------------------------------------------
# The whole preprocessing as one per-pixel affine map


def _train_from_yuv(space: str) -> Mapping[str, np.ndarray]:
    inv, _ = _space(space).inverse()
    return {"yuv444": np.eye(3), "rgb": inv, "bgr": inv[::-1]}


def _color_matrix(rt: str, train: str, space: str) -> tuple[np.ndarray, np.ndarray]:
    """(A, c) with `train_pixel = A @ rt_pixel + c` on 0..255 values (rt nv12 is YUV444 after upsampling)."""
    if rt not in TRAIN_FROM_RT.get(train, ()):
        allowed = ", ".join(TRAIN_FROM_RT.get(train, ())) or "none"
        raise UserError(
            f"input_type_rt {rt} cannot feed input_type_train {train} (allowed: {allowed}); "
            "fix input_type_rt or input_type_train"
        )
    if rt in ("nv12", "yuv444"):
        yuv_off = _space(space).offset
        a = _train_from_yuv(space)[train]
        return a, -a @ yuv_off if train != "yuv444" else np.zeros(3)
    if rt == "gray":
        return np.eye(1), np.zeros(1)
    swap = np.eye(3)[::-1]  # rgb <-> bgr
    return (np.eye(3) if rt == train else swap), np.zeros(3)


@dataclass(frozen=True)
class PreprocessAffine:
    """`y[c] = Σ_k weight[c, k] · x[k] + bias[c]` maps the int8 runtime pixel x (u8 - 128, rt channel order)
    to the model's normalized input y (train colour space, `((v + 128) - mean) · scale`)."""

    weight: np.ndarray  # C_train x C_rt, float64
    bias: np.ndarray  # C_train

    def apply(self, x_int8: np.ndarray, channel_axis: int = -1) -> np.ndarray:
        """Run on int8 pixels with channels along `channel_axis`; float32 out, same layout."""
        x = np.moveaxis(np.asarray(x_int8, np.float64), channel_axis, -1)
        y = x @ self.weight.T + self.bias
        return np.moveaxis(y, -1, channel_axis).astype(np.float32)


def norm_vectors(
    norm_type: str, mean: tuple[float, ...] | None, scale: tuple[float, ...] | None, channels: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and scale as norm_type keeps them (unused parts become 0 and 1)."""
    use_mean = norm_type in ("data_mean_and_scale", "data_mean")
    use_scale = norm_type in ("data_mean_and_scale", "data_scale")
    m = np.broadcast_to(np.asarray(mean if use_mean and mean else (0.0,), np.float64), (channels,))
    s = np.broadcast_to(np.asarray(scale if use_scale and scale else (1.0,), np.float64), (channels,))
    return m.copy(), s.copy()


def preprocess_affine(
    rt: str,
    train: str,
    norm_type: str = "no_preprocess",
    mean: tuple[float, ...] | None = None,
    scale: tuple[float, ...] | None = None,
    space: str = "regular",
) -> PreprocessAffine:
    """The HzPreprocess chain of one image input: int8 rt pixel -> normalized train-space value."""
    if train == "featuremap" or rt == "featuremap":
        raise UserError("featuremap inputs take no image preprocessing; the model is fed its tensor as is")
    a, c = _color_matrix(rt, train, space)
    m, s = norm_vectors(norm_type, mean, scale, a.shape[0])
    # train = A (x + 128) + c ; y = (train - m) * s
    weight = a * s[:, None]
    bias = (a @ np.full(a.shape[1], float(INT8_OFFSET)) + c - m) * s
    return PreprocessAffine(weight, bias)


def train_pixels(x_int8: np.ndarray, rt: str, train: str, space: str = "regular") -> np.ndarray:
    """The int8 runtime pixels (HxWxC, rt order) as 0..255 values of the training colour space, float32: the
    colour half of the HzPreprocess chain, whose normalisation (passes/calibration/pictures.normalize) then runs in the
    float32 arithmetic `npuc calibrate` uses, so both paths give the same bits for the same picture."""
    a, c = _color_matrix(rt, train, space)
    return ((np.asarray(x_int8, np.float64) + INT8_OFFSET) @ a.T + c).astype(np.float32)


def hz_preprocess(x_int8: np.ndarray, mean: np.ndarray, scale: np.ndarray, channel_axis: int = -1) -> np.ndarray:
    """HzPreprocess alone: `((x + 128) - mean) · scale` per channel, float32."""
    x = np.moveaxis(np.asarray(x_int8, np.float64), channel_axis, -1)
    y = ((x + INT8_OFFSET) - np.asarray(mean, np.float64)) * np.asarray(scale, np.float64)
    return np.moveaxis(y, -1, channel_axis).astype(np.float32)


def runtime_pixels(rgb: np.ndarray, rt: str, space: str = "regular", name: str = "input") -> np.ndarray:
    """An HxWx3 RGB uint8 picture as the deployed model's int8 input pixels (HxWxC, rt channel order):
    nv12 goes through the NV12 round trip (chroma subsampling) a camera frame has."""
    rgb = np.asarray(rgb, np.uint8)
    h, w = rgb.shape[:2]
    by_type = {
        "rgb": lambda: rgb,
        "bgr": lambda: rgb[..., ::-1],
        "gray": lambda: rgb_to_gray(rgb),
        "yuv444": lambda: rgb_to_yuv444(rgb, space),
        "nv12": lambda: nv12_to_yuv444(rgb_to_nv12(rgb, space, name), h, w, name),
    }
    if rt not in by_type:
        raise UserError(f"input '{name}': input_type_rt {rt} is not an image type ({', '.join(by_type)})")
    return to_int8_128(by_type[rt]())


def train_picture_to_rgb(picture: np.ndarray, train: str, space: str = "regular") -> np.ndarray:
    """An HxWxC uint8 picture in `input_type_train` colours as HxWx3 RGB (gray is repeated)."""
    by_type = {
        "rgb": lambda p: p,
        "bgr": lambda p: p[..., ::-1],
        "yuv444": lambda p: yuv444_to_rgb(p, space),
        "gray": lambda p: np.repeat(p[..., :1], 3, axis=-1),
    }
    if train not in by_type:
        raise UserError(f"input_type_train {train} is not a picture type ({', '.join(by_type)})")
    return np.ascontiguousarray(by_type[train](np.asarray(picture, np.uint8)))
