"""Real images (scikit-image's bundled photos) and the preprocessing recipes of the real models.

Everything is offline and deterministic: ``model_inputs(name, n)`` gives ``n`` feed dicts for a model of
``models.fetch.REAL_MODELS`` at its pinned input shape, built from real photos and scanned text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npuc.compiler.errors import UserError
from npuc.models.fetch import get_model

COLOR_IMAGES: tuple[str, ...] = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "colorwheel",
    "retina",
)
GRAY_IMAGES: tuple[str, ...] = ("camera", "coins", "page", "text", "moon", "clock", "grass", "brick", "cell")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R BT.601, as OpenCV uses


def load_image(name: str) -> np.ndarray:
    """A bundled scikit-image picture as uint8: HxWx3 RGB for photos, HxW for grey images."""
    if name not in COLOR_IMAGES + GRAY_IMAGES:
        known = ", ".join(COLOR_IMAGES + GRAY_IMAGES)
        raise UserError(f"unknown image {name!r}; choose one of: {known}")
    import skimage.data

    img = np.asarray(getattr(skimage.data, name)())
    return np.ascontiguousarray(img[..., :3]) if img.ndim == 3 else img


def as_rgb(img: np.ndarray) -> np.ndarray:
    """HxWx3 view of a grey (HxW or HxWx1) or RGB(A) image, keeping its dtype."""
    if img.ndim == 2:
        img = img[..., None]
    if img.ndim != 3 or img.shape[2] not in (1, 3, 4):
        raise UserError(f"image of shape {img.shape} is not HxW, HxWx1, HxWx3 or HxWx4; pass a picture")
    return np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img[..., :3]


def rotate(img: np.ndarray, degrees: int) -> np.ndarray:
    """Rotate clockwise by a multiple of 90 degrees (exact, no resampling)."""
    if degrees % 90:
        raise UserError(f"rotation {degrees} is not a multiple of 90 degrees")
    return np.ascontiguousarray(np.rot90(img, k=(-degrees // 90) % 4))


def page_rotations() -> list[tuple[int, np.ndarray]]:
    """``skimage.data.page()`` turned 0/90/180/270 degrees clockwise; the angle is the orientation
    classifier's label (its classes "0", "90", "180", "270" name clockwise turns)."""
    page = load_image("page")
    return [(deg, rotate(page, deg)) for deg in (0, 90, 180, 270)]


def _axis_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Half-pixel centres, edge-clamped: the convention of OpenCV INTER_LINEAR and ONNX Resize (linear).
    pos = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    pos = np.clip(pos, 0.0, n_in - 1)
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, (pos - lo).astype(np.float32)


def resize_bilinear(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of an HxW or HxWxC image to ``height`` x ``width``, as float32."""
    if img.ndim not in (2, 3) or min(img.shape[:2]) < 1 or height < 1 or width < 1:
        raise UserError(f"cannot resize an image of shape {img.shape} to {height}x{width}")
    src = img.astype(np.float32, copy=False)
    tail = (1,) * (src.ndim - 2)
    y0, y1, fy = _axis_taps(src.shape[0], height)
    x0, x1, fx = _axis_taps(src.shape[1], width)
    fy = fy.reshape((-1, 1) + tail)
    fx = fx.reshape((1, -1) + tail)
    rows = src[y0] * (1.0 - fy) + src[y1] * fy
    return rows[:, x0] * (1.0 - fx) + rows[:, x1] * fx


def resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize as float32; big reductions average integer blocks first so bilinear does not alias."""
    if img.ndim not in (2, 3) or height < 1 or width < 1:
        return resize_bilinear(img, height, width)  # raises the UserError for the bad request
    factor = min(img.shape[0] // height, img.shape[1] // width)
    if factor >= 2:
        h, w = (img.shape[0] // factor) * factor, (img.shape[1] // factor) * factor
        blocks = img[:h, :w].astype(np.float32).reshape((h // factor, factor, w // factor, factor) + img.shape[2:])
        img = blocks.mean(axis=(1, 3))
    return resize_bilinear(img, height, width)


def convert_color(rgb: np.ndarray, order: str) -> np.ndarray:
    """HxWx3 RGB to ``order``: "rgb", "bgr" or "gray" (HxWx1, BT.601 luma)."""
    converters: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "rgb": lambda a: a,
        "bgr": lambda a: a[..., ::-1],
        "gray": lambda a: (a.astype(np.float32) @ LUMA)[..., None],
    }
    if order not in converters:
        raise UserError(f"colour order {order!r} is not one of {sorted(converters)}")
    return converters[order](rgb)


def normalize(img: np.ndarray, scale: float, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """``(img * scale - mean) / std`` per channel (the last axis), as float32."""
    m = np.asarray(mean, dtype=np.float32)
    s = np.asarray(std, dtype=np.float32)
    return ((img.astype(np.float32) * np.float32(scale) - m) / s).astype(np.float32)


def to_layout(hwc: np.ndarray, layout: str) -> np.ndarray:
    """A batch of one: [1,C,H,W] for "nchw", [1,H,W,C] for "nhwc"."""
    if layout == "nchw":
        return np.ascontiguousarray(hwc.transpose(2, 0, 1)[None])
    if layout == "nhwc":
        return np.ascontiguousarray(hwc[None])
    raise UserError(f"layout {layout!r} is not 'nchw' or 'nhwc'")


# -- fitting a picture into the model's fixed input size ------------------------------------------------


def _fit_stretch(img: np.ndarray, h: int, w: int, short: int) -> np.ndarray:
    return resize(img, h, w)


def _fit_short_crop(img: np.ndarray, h: int, w: int, short: int) -> np.ndarray:
    # Resize the short side to `short` (at least covering h x w), then take the centre h x w.
    k = max(short / min(img.shape[:2]), h / img.shape[0], w / img.shape[1])
    rh, rw = max(h, round(img.shape[0] * k)), max(w, round(img.shape[1] * k))
    big = resize(img, rh, rw)
    top, left = (rh - h) // 2, (rw - w) // 2
    return big[top : top + h, left : left + w]


def _fit_height_pad(img: np.ndarray, h: int, w: int, short: int) -> np.ndarray:
    # Text-line classifiers: keep the aspect ratio at height h, squeeze to w if wider, pad right with 0.
    rw = min(w, int(np.ceil(h * img.shape[1] / img.shape[0])))
    out = np.zeros((h, w) + img.shape[2:], dtype=np.float32)
    out[:, :rw] = resize(img, h, rw)
    return out


FITS: dict[str, Callable[[np.ndarray, int, int, int], np.ndarray]] = {
    "stretch": _fit_stretch,
    "short_crop": _fit_short_crop,
    "height_pad": _fit_height_pad,
}


@dataclass(frozen=True)
class Recipe:
    """How a model wants its picture: size fit, colour order, value normalisation, layout."""

    fit: str  # a key of FITS
    color: str  # "rgb", "bgr" or "gray"
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    short: int = 0  # short-side target of the "short_crop" fit
    pad_after_norm: bool = False  # "height_pad": padding is 0 in the normalised domain
    transpose_hw: bool = False  # the tensor's H axis runs along the picture's width


RECIPES: dict[str, Recipe] = {
    "pplcnet_orientation": Recipe("short_crop", "rgb", 1 / 255, IMAGENET_MEAN, IMAGENET_STD, short=256),
    "mbv3_textline_cls": Recipe("height_pad", "bgr", 1 / 255, (0.5,) * 3, (0.5,) * 3, pad_after_norm=True),
    # MTCNN keeps the Caffe/MATLAB habit of column-major pictures: the reference code feeds the RGB
    # picture with H and W exchanged (face scores 0.999 transposed vs 0.3 untransposed on LFW faces).
    "mtcnn_pnet": Recipe("short_crop", "rgb", 1.0, (127.5,) * 3, (128.0,) * 3, transpose_hw=True),
    "mtcnn_rnet": Recipe("stretch", "rgb", 1.0, (127.5,) * 3, (128.0,) * 3, transpose_hw=True),
    "mtcnn_onet": Recipe("stretch", "rgb", 1.0, (127.5,) * 3, (128.0,) * 3, transpose_hw=True),
    "ppocrv6_det_tiny": Recipe("stretch", "bgr", 1 / 255, IMAGENET_MEAN, IMAGENET_STD),
    "yolov8n_320": Recipe("stretch", "rgb", 1 / 255, (0.0,) * 3, (1.0,) * 3),
    "ppocrv4_rec": Recipe("height_pad", "bgr", 1 / 255, (0.5,) * 3, (0.5,) * 3, pad_after_norm=True),
    "ddddocr_crnn": Recipe("stretch", "gray", 1 / 255, (0.5,), (0.5,)),
    "ppocrv6_rec_tiny": Recipe("height_pad", "bgr", 1 / 255, (0.5,) * 3, (0.5,) * 3, pad_after_norm=True),
    "picodet_layout": Recipe("stretch", "bgr", 1 / 255, IMAGENET_MEAN, IMAGENET_STD),
}


def preprocess(img: np.ndarray, name: str) -> np.ndarray:
    """One picture (HxW grey or HxWx3 RGB uint8) as the input tensor of real model ``name``."""
    model = get_model(name)
    recipe = RECIPES[name]
    h, w = model.input_shape[1:3] if model.layout == "nhwc" else model.input_shape[2:4]
    colored = convert_color(as_rgb(img), recipe.color)
    if recipe.transpose_hw:
        colored = colored.transpose(1, 0, 2)
    if recipe.pad_after_norm:
        # Normalise first so the padded columns hold 0, the value the reference pipeline pads with.
        fitted = FITS[recipe.fit](normalize(colored, recipe.scale, recipe.mean, recipe.std), h, w, recipe.short)
    else:
        fitted = normalize(FITS[recipe.fit](colored, h, w, recipe.short), recipe.scale, recipe.mean, recipe.std)
    return to_layout(fitted, model.layout)


# -- the pictures each model sees ----------------------------------------------------------------------

# Rows of text lines in skimage.data.page(); 96-pixel-wide pieces are 4:1 text-line crops.
_PAGE_LINES = ((12, 36), (48, 64), (64, 82), (82, 100), (100, 118), (118, 136))


def text_line_crops() -> list[tuple[int, np.ndarray]]:
    """Upright text-line crops of page() interleaved with the same crops turned 180 degrees."""
    page = load_image("page")
    crops = [page[a:b, x : x + 96] for a, b in _PAGE_LINES for x in range(0, 384, 96)]
    return [pair for c in crops for pair in ((0, c), (180, rotate(c, 180)))]


def face_crops() -> list[np.ndarray]:
    """scikit-image's LFW subset: 100 25x25 grey face crops followed by 100 non-face crops, as uint8."""
    import skimage.data

    return list((skimage.data.lfw_subset() * 255.0).round().astype(np.uint8))


def _orientation_pictures() -> list[np.ndarray]:
    return [img for _, img in page_rotations()] + [rotate(load_image("text"), d) for d in (0, 90, 180, 270)]


def _photos() -> list[np.ndarray]:
    return [load_image(n) for n in COLOR_IMAGES]


def _faces_then_photos() -> list[np.ndarray]:
    return face_crops()[:16] + _photos()


def _text_pictures() -> list[np.ndarray]:
    """The two scans with text (a printed page, a photographed sign), each turned four ways, then their central
    halves: ten real pictures a text or layout detector finds text in."""
    scans = [load_image(n) for n in ("page", "text")]
    turned = [rotate(img, degrees) for degrees in (0, 90, 180, 270) for img in scans]
    halves = [img[img.shape[0] // 4 : -img.shape[0] // 4, img.shape[1] // 4 : -img.shape[1] // 4] for img in scans]
    return turned + halves


def _documents() -> list[np.ndarray]:
    return _text_pictures() + _photos()


PICTURES: dict[str, Callable[[], list[np.ndarray]]] = {
    "pplcnet_orientation": _orientation_pictures,
    "mbv3_textline_cls": lambda: [img for _, img in text_line_crops()],
    "mtcnn_pnet": _photos,
    "mtcnn_rnet": _faces_then_photos,
    "mtcnn_onet": _faces_then_photos,
    "ppocrv6_det_tiny": _documents,
    "yolov8n_320": _photos,
    "ppocrv4_rec": lambda: [img for _, img in text_line_crops()],
    "ddddocr_crnn": lambda: [img for _, img in text_line_crops()],
    "ppocrv6_rec_tiny": lambda: [img for _, img in text_line_crops()],
    "picodet_layout": _documents,
}


def model_inputs(name: str, n: int) -> list[dict[str, np.ndarray]]:
    """``n`` feed dicts of real pictures for real model ``name``; past the list, pictures repeat mirrored. A
    sentence encoder gets real sentences (models/text.py) instead."""
    model = get_model(name)
    if n < 0:
        raise UserError(f"model_inputs: n={n} must be >= 0")
    if model.feed == "tokens":  # a sentence encoder: token ids and their attention mask
        from npuc.models.text import sentence_feeds

        (mask, _), = model.extra_inputs  # fmt: skip
        return sentence_feeds(model.input_name, mask, model.input_shape[1], n)
    pictures = PICTURES[name]()
    feeds = []
    for i in range(n):
        img = pictures[i % len(pictures)]
        if (i // len(pictures)) % 2:
            img = img[:, ::-1]
        feeds.append({model.input_name: preprocess(img, name)})
    return feeds
