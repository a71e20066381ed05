"""Model-input preprocessing and calibration data loading, shared by `npuc calibrate` and `npuc build`.

Samples are files: `.npz` (one sample; keys are the model's input names), `.npy` (one sample of a
single-input model) or pictures (`.jpg`, `.jpeg`, `.png`, `.bmp`; decoded with Pillow when it is installed).
`--data` takes folders (their sample files, sorted by name, not recursive), sample files, or `.txt` lists
(one path per line, relative to the list's folder). Samples are loaded one at a time, so memory does not
grow with their number.

Pictures become tensors as tpu-mlir makes them (passes/calibration/pictures.py: OpenCV decoding and uint8 resizing,
stretched or letterboxed, centre crop, colour order, `(pixel - mean) * scale` on the 0..255 scale), then the
`layout` the model takes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx

from npuc.compiler import arrays
from npuc.compiler.errors import UserError
from npuc.passes.calibration.pictures import (
    COLOR_ORDERS,
    PAD_TYPES,
    center_crop,
    decode_picture,
    letterbox,
    normalize,
    resize_u8,
)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
ARRAY_SUFFIXES = (".npz", ".npy")
LIST_SUFFIX = ".txt"
TPU_MLIR_SEED = 1684  # tpu-mlir's DataSelector shuffles a --dataset folder's sorted files with this seed
MAX_SAMPLE_BYTES = arrays.MAX_ARRAY_BYTES  # one sample larger than this is a wrong file, not calibration data


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, pinned shape and numpy dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class Preprocess:
    """How a picture becomes an input tensor (tpu-mlir's model_transform options)."""

    mean: tuple[float, ...] = (0.0,)
    scale: tuple[float, ...] = (1.0,)
    color: str = "rgb"  # rgb | bgr | gray
    resize: tuple[int, int] | None = None  # H,W before the centre crop; None: the input's H,W
    layout: str = "nchw"  # nchw | nhwc
    keep_aspect_ratio: bool = False  # letterbox: scale to fit inside `resize`, pad the rest
    pad_value: int = 0
    pad_type: str = "center"  # center | normal (top left)

    def __post_init__(self) -> None:
        if self.color not in COLOR_ORDERS:
            raise UserError(f"--color {self.color!r} is not one of {', '.join(COLOR_ORDERS)}")
        if self.layout not in LAYOUT_AXES:
            raise UserError(f"--layout {self.layout!r} is not one of {', '.join(LAYOUT_AXES)}")
        if self.resize is not None and (len(self.resize) != 2 or min(self.resize) < 1):
            raise UserError(f"--resize {self.resize} must be two positive sizes H,W such as 256,256")
        if not all(np.isfinite(self.mean)) or not all(np.isfinite(self.scale)):
            raise UserError("--mean and --scale must be finite numbers")
        if not 0 <= self.pad_value <= 255:
            raise UserError(f"--pad-value {self.pad_value} is not a pixel value; give 0..255")
        if self.pad_type not in PAD_TYPES:
            raise UserError(f"--pad-type {self.pad_type!r} is not one of {', '.join(PAD_TYPES)}")

    def spec(self) -> str:
        """One line, written into the calibration table's header (`# preprocess: ...`) and read back by
        `from_spec`: the same numbers, so a later command prepares pictures exactly as calibrate did."""
        fields = {name: render(getattr(self, name)) for name, (render, _) in SPEC_FIELDS.items()}
        return " ".join(f"{name}={value}" for name, value in fields.items())

    @classmethod
    def from_spec(cls, text: str, where: str) -> Preprocess:
        values = {}
        for item in text.split():
            name, _, value = item.partition("=")
            if name not in SPEC_FIELDS or name in values:
                raise UserError(f"{where}: preprocess field {name!r} is unknown or repeated; expected "
                                f"{', '.join(SPEC_FIELDS)}; fix the header line or recalibrate")  # fmt: skip
            values[name] = SPEC_FIELDS[name][1](value, f"{where}: preprocess {name}")
        return cls(**values)

    def differences(self, other: Preprocess) -> list[tuple[str, str, str]]:
        """(field, this value, other value) for every field where the two prepare pictures differently."""
        found = []
        for name, (render, _) in SPEC_FIELDS.items():
            mine, theirs = getattr(self, name), getattr(other, name)
            if name in ("mean", "scale"):  # one number stands for every channel
                same = np.array_equal(*np.broadcast_arrays(np.asarray(mine), np.asarray(theirs)))
            else:
                same = mine == theirs
            if not same:
                found.append((name, render(mine), render(theirs)))
        return found


def parse_floats(text: str, option: str) -> tuple[float, ...]:
    """`1,2,3` or `1 2 3` → (1.0, 2.0, 3.0)."""
    try:
        values = tuple(float(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise UserError(f"{option} {text!r}: write comma-separated numbers such as 123.7,116.3,103.5") from None
    if not values:
        raise UserError(f"{option} is empty; write comma-separated numbers such as 123.7,116.3,103.5")
    return values


def parse_hw(text: str, option: str = "--resize") -> tuple[int, int]:
    """`--resize 256,256` → (256, 256)."""
    parts = text.replace("x", ",").split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise UserError(f"{option} {text!r}: write two positive sizes H,W such as 256,256")
    return int(parts[0]), int(parts[1])


def _render_floats(values: tuple[float, ...]) -> str:
    return ",".join(repr(float(v)) for v in values)


def _parse_resize(text: str, where: str) -> tuple[int, int] | None:
    return None if text == "none" else parse_hw(text, where)


def _parse_bool(text: str, where: str) -> bool:
    if text not in ("yes", "no"):
        raise UserError(f"{where}: {text!r} is not yes or no; fix the header line or recalibrate")
    return text == "yes"


def _parse_pad_value(text: str, where: str) -> int:
    if not text.isdigit():
        raise UserError(f"{where}: {text!r} is not a pixel value 0..255; fix the header line or recalibrate")
    return int(text)


# field -> (render, parse(text, where)): the `# preprocess:` header line, one table both ways
SPEC_FIELDS: Mapping[str, tuple[Callable[[object], str], Callable[[str, str], object]]] = MappingProxyType({
    "mean": (_render_floats, parse_floats),
    "scale": (_render_floats, parse_floats),
    "color": (str, lambda text, where: text),
    "resize": (lambda hw: "none" if hw is None else f"{hw[0]},{hw[1]}", _parse_resize),
    "layout": (str, lambda text, where: text),
    "keep_aspect_ratio": (lambda flag: "yes" if flag else "no", _parse_bool),
    "pad_value": (str, _parse_pad_value),
    "pad_type": (str, lambda text, where: text),
})  # fmt: skip


def model_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs of a shape-pinned model (initializers excluded)."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        shape = tuple(int(d.dim_value) for d in tt.shape.dim)
        specs.append(InputSpec(vi.name, shape, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))))
    return specs


# ---------------------------------------------------------------------------------------------------------
# Finding the sample files


def list_samples(data: Sequence[str | Path], limit: int | None = None, folder_order: str = "sorted") -> list[Path]:
    """The sample files named by `data` (folders, files, .txt lists), in order; at most `limit`. A folder's files
    come sorted, or with `folder_order="tpu-mlir"` in the order tpu-mlir's run_calibration reads a --dataset
    folder: sorted by path, then shuffled by Python's `random` seeded with 1684."""
    if not data:
        raise UserError("no calibration data; pass --data FOLDER (images, .npy or .npz files)")
    files: list[Path] = []
    for entry in data:
        found = _expand(Path(entry))
        if folder_order == "tpu-mlir" and Path(entry).is_dir():
            found = sorted(found, key=str)
            random.Random(TPU_MLIR_SEED).shuffle(found)
        files += found
    if limit is not None:
        if limit < 1:
            raise UserError(f"--samples {limit}: give a positive number of samples")
        files = files[:limit]
    return files


def _expand(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SAMPLE_SUFFIXES)
        if not found:
            raise UserError(
                f"sample folder {path} has no {'/'.join(SAMPLE_SUFFIXES)} files; "
                "put samples in it or point --data at the right folder"
            )
        return found
    if not path.is_file():
        raise UserError(f"calibration data {path} does not exist; check the --data path")
    if path.suffix.lower() == LIST_SUFFIX:
        return _read_list(path)
    if path.suffix.lower() not in SAMPLE_SUFFIXES:
        raise UserError(
            f"calibration sample {path}: unknown file type {path.suffix!r}; use {', '.join(SAMPLE_SUFFIXES)} "
            "or a .txt list"
        )
    return [path]


def _read_list(path: Path) -> list[Path]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read sample list {path}: {exc}; pass a UTF-8 text file of paths") from None
    files = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        item = (path.parent / line) if not Path(line).is_absolute() else Path(line)
        if not item.is_file() or item.suffix.lower() not in SAMPLE_SUFFIXES:
            raise UserError(
                f"{path}:{lineno}: {line!r} is not a sample file ({'/'.join(SAMPLE_SUFFIXES)}); fix the list"
            )
        files.append(item)
    if not files:
        raise UserError(f"sample list {path} names no files; add one path per line")
    return files


# ---------------------------------------------------------------------------------------------------------
# Loading one sample


def load_sample(path: Path, inputs: Sequence[InputSpec], pre: Preprocess) -> dict[str, np.ndarray]:
    """One sample as the model's feed dict, each array exactly its input's shape and dtype."""
    loader = LOADERS[path.suffix.lower()]
    raw = loader(path, inputs, pre)
    return {spec.name: _fit(raw[spec.name], spec, path) for spec in inputs}


BAD_SAMPLE_POLICIES = ("fail", "skip")


def screen_samples(
    files: Sequence[Path], inputs: Sequence[InputSpec], pre: Preprocess, policy: str = "fail"
) -> tuple[list[Path], list[str]]:
    """Load every sample once before a long pass: a damaged or mis-shaped one stops the run naming its path
    (`fail`), or is left out with a note (`skip`). Returns (usable files, notes)."""
    if policy not in BAD_SAMPLE_POLICIES:
        raise UserError(f"--on-bad-sample {policy}: choose {' or '.join(BAD_SAMPLE_POLICIES)}")
    good, notes = [], []
    for path in files:
        try:
            load_sample(path, inputs, pre)
        except UserError as exc:
            if policy == "fail":
                raise UserError(f"{path}: {exc} (or --on-bad-sample skip to leave it out)") from None
            notes.append(f"skipped {path}: {exc}")
        else:
            good.append(path)
    if files and not good:
        raise UserError(f"none of the {len(files)} samples can be used; the first: {notes[0]}")
    return good, notes


def iter_samples(files: Iterable[Path], inputs: Sequence[InputSpec], pre: Preprocess) -> Iterator[dict]:
    """Load samples lazily, one at a time."""
    for path in files:
        yield load_sample(path, inputs, pre)


def _fit(array: np.ndarray, spec: InputSpec, path: Path) -> np.ndarray:
    shape = tuple(array.shape)
    if shape != spec.shape and spec.shape[:1] == (1,) and shape == spec.shape[1:]:
        array = array[None]  # a sample saved without its batch axis
    if tuple(array.shape) != spec.shape:
        raise UserError(
            f"sample {path.name}: input '{spec.name}' has shape {_dims(shape)}, expected {_dims(spec.shape)}; "
            "regenerate the sample or pin the model's shape with --input-shape"
        )
    if array.dtype.kind not in "biuf":
        raise UserError(f"sample {path.name}: input '{spec.name}' has dtype {array.dtype}; save numbers")
    return np.ascontiguousarray(array, dtype=spec.dtype)


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def _load_npy(path: Path, inputs: Sequence[InputSpec], pre: Preprocess) -> dict[str, np.ndarray]:
    if len(inputs) != 1:
        names = ", ".join(s.name for s in inputs)
        raise UserError(
            f"sample {path.name}: a .npy file holds one array but the model has {len(inputs)} inputs "
            f"({names}); save each sample as .npz with those keys"
        )
    with _open(path) as f:
        return {inputs[0].name: _read_array(f, path, path.name)}


def _load_npz(path: Path, inputs: Sequence[InputSpec], pre: Preprocess) -> dict[str, np.ndarray]:
    with arrays.open_npz(path) as archive:
        members = {arrays.member_key(m): m for m in archive.infolist()}
        wanted = [s.name for s in inputs]
        if len(inputs) == 1 and wanted[0] not in members and len(members) == 1:
            members = {wanted[0]: next(iter(members.values()))}  # a single unnamed array feeds a single input
        missing = [n for n in wanted if n not in members]
        if missing:
            keys = sorted(members)
            shown = ", ".join(keys[:5]) + (f", ... ({len(keys)} in all)" if len(keys) > 5 else "") or "none"
            raise UserError(
                f"sample {path.name}: no array for input(s) {', '.join(missing)} (keys: {shown}); save the sample "
                "with the model's input names as keys"
            )
        return {name: arrays.read_member(archive, members[name], f"sample {path.name}[{name}]") for name in wanted}


def _open(path: Path):
    try:
        return path.open("rb")
    except OSError as exc:
        raise UserError(f"cannot read sample {path}: {exc.strerror}; check the file") from None


def _read_array(f, path: Path, where: str) -> np.ndarray:
    """Read one .npy file, checking its header (size, dtype, no pickles) before reading any data."""
    return arrays.read_npy_stream(f, f"sample {where}", MAX_SAMPLE_BYTES, size=path.stat().st_size)


def _load_image(path: Path, inputs: Sequence[InputSpec], pre: Preprocess) -> dict[str, np.ndarray]:
    if len(inputs) != 1:
        raise UserError(
            f"sample {path.name}: a picture feeds one input but the model has {len(inputs)}; use .npz samples"
        )
    spec = inputs[0]
    if len(spec.shape) != 4:
        raise UserError(
            f"sample {path.name}: input '{spec.name}' has shape {_dims(spec.shape)}, not a 4-D image "
            "batch; use .npy/.npz samples"
        )
    return {spec.name: image_to_tensor(decode_picture(path, gray=pre.color == "gray"), spec, pre, path)}


def image_to_tensor(picture: np.ndarray, spec: InputSpec, pre: Preprocess, path: Path) -> np.ndarray:
    """HxWx3 RGB (or HxWx1 grey) uint8 picture → [1,C,H,W] or [1,H,W,C] tensor of `spec` per `pre`."""
    c_axis, h_axis, w_axis = LAYOUT_AXES[pre.layout]
    channels, height, width = spec.shape[c_axis], spec.shape[h_axis], spec.shape[w_axis]
    rh, rw = pre.resize or (height, width)
    if rh < height or rw < width:
        raise UserError(f"--resize {rh},{rw} is smaller than the model's input {height}x{width}; resize larger")
    if picture.shape[2] == 1 and pre.color != "gray":
        picture = np.repeat(picture, 3, axis=2)
    if pre.keep_aspect_ratio:
        img = letterbox(picture, rh, rw, pre.pad_value, pre.pad_type)
    else:
        img = resize_u8(picture, rh, rw)
    img = COLOR_ORDERS[pre.color](center_crop(img, height, width))
    if img.shape[2] != channels:
        raise UserError(
            f"sample {path.name}: --color {pre.color} gives {img.shape[2]} channel(s) but input '{spec.name}' "
            f"({pre.layout}, {_dims(spec.shape)}) takes {channels}; fix --color or --layout"
        )
    for option, values in (("--mean", pre.mean), ("--scale", pre.scale)):
        if len(values) not in (1, channels):
            raise UserError(
                f"{option} has {len(values)} values but the input has {channels} channels; give 1 or {channels}"
            )
    img = normalize(img, pre.mean, pre.scale)
    hwc_to = (2, 0, 1) if pre.layout == "nchw" else (0, 1, 2)
    return np.ascontiguousarray(img.transpose(hwc_to)[None])


LAYOUT_AXES: Mapping[str, tuple[int, int, int]] = MappingProxyType({"nchw": (1, 2, 3), "nhwc": (3, 1, 2)})  # C,H,W
LOADERS: Mapping[str, Callable[[Path, Sequence[InputSpec], Preprocess], dict[str, np.ndarray]]] = MappingProxyType(
    {".npz": _load_npz, ".npy": _load_npy, **dict.fromkeys(IMAGE_SUFFIXES, _load_image)}
)
SAMPLE_SUFFIXES = tuple(LOADERS)
