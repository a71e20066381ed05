"""Pictures as model inputs, made the way tpu-mlir's preprocessing makes them, so that a table calibrated on
the same photos agrees with tpu-mlir's and every command (calibrate, compare, run, the hb_mapper YAML path,
cv18xx frames) feeds a model the same numbers:

- decoded by OpenCV: colour pictures as tpu-mlir's `cv2.imread(path, IMREAD_COLOR)` gives them (EXIF
  orientation applied, which Pillow does not do), grey models' pictures as `IMREAD_GRAYSCALE` gives them;
- resized as uint8 by `cv2.resize` (INTER_LINEAR), stretched to the resize size, or with keep_aspect_ratio
  scaled to fit inside it (sizes truncated) and padded with pad_value, centred or at the top left (letterbox);
- centre-cropped to the model's input (the crop starts at H//2 - h//2, as tpu-mlir's does);
- `(pixel - mean) * scale` per channel in float32.

Sizes are checked from the picture's header (Pillow reads only the header) before anything is decoded.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np

from npuc.compiler.errors import UserError

MAX_PICTURE_PIXELS = 1 << 27  # 134 M pixels (e.g. 16k x 8k); beyond it a file is a decompression bomb, not a photo
MAX_PICTURE_BYTES = 1 << 28  # an encoded picture larger than 256 MiB is not a calibration photo
Floats = tuple[float, ...] | np.ndarray
PAD_TYPES = ("center", "normal")  # tpu-mlir's --pad_type: the resized picture centred, or at the top left


def decode_picture(path: Path, gray: bool = False) -> np.ndarray:
    """The picture at `path` as HxWx3 RGB uint8, or HxWx1 when `gray` (decoded grey, as tpu-mlir reads grey
    models' pictures)."""
    import cv2
    from PIL import Image

    from npuc.compiler.fileio import read_limited

    data = read_limited(path, "picture", MAX_PICTURE_BYTES)
    too_many = (f"sample {path.name}: {{}} pixels is more than {MAX_PICTURE_PIXELS} (a decompression bomb or a "
                "scan); resize it first")  # fmt: skip
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # npuc's own bound follows
            with Image.open(io.BytesIO(data)) as header:  # the header only: sizes before any pixel is decoded
                width, height = header.size
    except Image.DecompressionBombError:  # Pillow's own, larger bound
        raise UserError(too_many.format("its header's size in")) from None
    except (OSError, ValueError, SyntaxError) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else repr(exc)
        raise UserError(f"sample {path.name}: cannot decode picture ({reason}); replace or remove the file") from None
    if width * height > MAX_PICTURE_PIXELS:
        raise UserError(too_many.format(f"{width}x{height}"))
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_GRAYSCALE if gray else cv2.IMREAD_COLOR)
    if img is None:
        raise UserError(f"sample {path.name}: OpenCV cannot decode this picture; replace or remove the file")
    return img[..., None] if gray else np.ascontiguousarray(img[..., ::-1])


def resize_u8(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """`img` (HxWxC uint8) resized to `height` x `width` by OpenCV's bilinear uint8 resize."""
    import cv2

    if img.shape[:2] == (height, width):
        return img.copy()
    out = cv2.resize(img, (width, height), interpolation=cv2.INTER_LINEAR)
    return out.reshape(height, width, img.shape[2])


def letterbox(img: np.ndarray, height: int, width: int, pad_value: int = 0, pad_type: str = "center") -> np.ndarray:
    """`img` scaled to fit inside `height` x `width` keeping its aspect ratio, the rest filled with `pad_value`."""
    if pad_type not in PAD_TYPES:
        raise UserError(f"--pad-type {pad_type!r} is not one of {', '.join(PAD_TYPES)}")
    ih, iw = img.shape[:2]
    ratio = min(width / iw, height / ih)
    rw, rh = max(int(iw * ratio), 1), max(int(ih * ratio), 1)
    top, left = ((height - rh) // 2, (width - rw) // 2) if pad_type == "center" else (0, 0)
    out = np.full((height, width, img.shape[2]), pad_value, np.uint8)
    out[top : top + rh, left : left + rw] = resize_u8(img, rh, rw)
    return out


def center_crop(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """The `height` x `width` centre of `img` (the window starts at H//2 - height//2, W//2 - width//2)."""
    top, left = img.shape[0] // 2 - height // 2, img.shape[1] // 2 - width // 2
    return img[top : top + height, left : left + width]


def normalize(pixels: np.ndarray, mean: Floats, scale: Floats) -> np.ndarray:
    """`(pixel - mean) * scale` per channel (the last axis) in float32, tpu-mlir's arithmetic."""
    return (pixels.astype(np.float32) - np.asarray(mean, np.float32)) * np.asarray(scale, np.float32)


def _gray(rgb: np.ndarray) -> np.ndarray:
    import cv2

    return rgb if rgb.shape[2] == 1 else cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY)[..., None]


# the channel order a model takes, from an HxWx3 RGB uint8 picture (gray: OpenCV's BT.601 conversion; a picture
# decoded grey passes as it is)
COLOR_ORDERS: Mapping[str, Callable[[np.ndarray], np.ndarray]] = MappingProxyType(
    {"rgb": lambda a: a, "bgr": lambda a: a[..., ::-1], "gray": _gray}
)
