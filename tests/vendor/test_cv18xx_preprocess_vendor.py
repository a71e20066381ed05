"""Fused preprocessing on the vendor simulator: a real classifier (PP-LCNet orientation) built to take the raw
uint8 frame runs bit for bit as npuc's simulator runs it, and its top-1 is the float model's (onnxruntime on
the float-preprocessed picture) on real photos of pages and text that calibration never saw.

The table is `npuc calibrate`'s default on the pictures' mirror images. Measured on all 20 pictures: bgr_packed
and nv21 each agree with float on 19 of 20, their flip a text picture where the float model hesitates (top-1
ahead by 0.08); with 2048 histogram bins over the absmax (before the power-of-two bins) 20 and 17 of 20, nv21's
flips text pictures ahead by 0.08-0.15. The colour conversion itself does not move them: the RGB picture the TPU
makes of the frame (tpu-mlir's bf16 formulas) is within one level of the original, and the float model fed it
agrees with the float model on all 20; the int8 network does, on those, from one level of difference.

`test_frame_builds_classify_unseen_photos_as_float` is the same build as a user makes it, calibrated with
`npuc calibrate`'s defaults on 8 photos at 4 rotations (mirrored), judged on 4 other photos at 4 rotations each,
every one a picture whose orientation the float model reads right: bgr_packed and nv21 agree with float on
16 of 16 (on 4 calibration photos instead of 8: 15 of 16, rocket at 270 degrees, float ahead by 0.20)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

import npuc
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.frames import picture_frame
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.models.images import FITS, RECIPES, load_image, rotate
from npuc.passes.calibration.preprocess import Preprocess
from tests.vendor.cv18xx_build_util import build, real_model_shapes
from tests.vendor.cv18xx_sim import run_vendor

NAME = "pplcnet_orientation"
SIZE = 224
# the model's own preprocessing in 0..255 pixel units: (p - 255 * mean) / (255 * std)
PRE = Preprocess(
    mean=tuple(255 * m for m in (0.485, 0.456, 0.406)),
    scale=tuple(1 / (255 * s) for s in (0.229, 0.224, 0.225)),
    color="rgb",
)
CLEAR_MARGIN = 0.2  # the float model's top-1 probability ahead of its runner-up by this much
ROTATIONS = (0, 90, 180, 270)  # clockwise; class k of the model is ROTATIONS[k]
# photos whose orientation the float model reads right at every rotation, and photos for the table (none of them)
LABELLED_PHOTOS = ("page", "astronaut", "camera", "rocket")
CALIBRATION_PHOTOS = ("coffee", "chelsea", "immunohistochemistry", "hubble_deep_field", "colorwheel", "retina",
                      "coins", "text")  # fmt: skip


def _fitted(img: np.ndarray) -> np.ndarray:
    """A grey or RGB picture fitted to 224x224 as the model's recipe does, rounded to the uint8 a camera gives."""
    recipe = RECIPES[NAME]
    rgb = img if img.ndim == 3 else np.repeat(img[..., None], 3, 2)
    return np.clip(np.rint(FITS[recipe.fit](rgb, SIZE, SIZE, recipe.short)), 0, 255).astype(np.uint8)


def _pictures() -> list[np.ndarray]:
    """20 real pictures at the 4 rotations the model tells apart (page, text, the page's halves, half the text)."""
    page, text = load_image("page"), load_image("text")
    crops = (page, text, page[:, :192], page[:, 192:], text[:, : text.shape[1] // 2])
    return [_fitted(rotate(img, degrees)) for img in crops for degrees in ROTATIONS]


def _float_input(rgb: np.ndarray) -> np.ndarray:
    x = (rgb.astype(np.float32) - np.asarray(PRE.mean, np.float32)) * np.asarray(PRE.scale, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


@pytest.fixture(scope="module")
def setup(real_model, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[np.ndarray]]:
    """(model, table calibrated with npuc.calibrate's defaults on the first 8 pictures' mirror images (PNG), every
    picture)."""
    folder = tmp_path_factory.mktemp("fused")
    model = real_model(NAME)
    pictures = _pictures()
    pngs = []
    for i, rgb in enumerate(pictures[:8]):
        pngs.append(folder / f"mirror{i}.png")
        Image.fromarray(np.ascontiguousarray(rgb[:, ::-1])).save(pngs[-1])
    table = folder / "table.txt"
    npuc.calibrate(model, pngs, table, preprocess=PRE, input_shapes=real_model_shapes(NAME))
    return model, table, pictures


@pytest.mark.parametrize(
    ("quant", "fmt", "aligned", "count"),
    [
        ("int8", "bgr_packed", False, 20),
        ("int8", "rgb_planar", False, 3),
        ("bf16", "bgr_planar", False, 3),
        ("int8", "nv21", False, 20),
        ("bf16", "nv12", False, 1),
        ("int8", "bgr_packed", True, 2),
        ("int8", "nv21", True, 2),
    ],
)
def test_frame_model_is_bit_exact_and_classifies_as_the_float_model(
    quant: str, fmt: str, aligned: bool, count: int, setup, tmp_path: Path
) -> None:
    model, table, pictures = setup
    # mean/scale/colour come from the table's `# preprocess:` line
    path = build(model, table, "cv181x", quant, tmp_path / f"{fmt}.cvimodel", real_model_shapes(NAME),
                 input_dtype="uint8", pixel_format=fmt, aligned_input=aligned)  # fmt: skip
    cvimodel = read_cvimodel(path.read_bytes())
    record = next(t for t in cvimodel.body.programs[0].tensor_map if t.name == "x")
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    float_build = build(model, table, "cv181x", quant, tmp_path / "float.cvimodel", real_model_shapes(NAME))
    float_cvimodel = read_cvimodel(float_build.read_bytes())
    agree, clear = [], []
    for rgb in pictures[:count]:
        # the frame as `npuc run` makes it of a picture
        frame = {"x": picture_frame(rgb, record.pixel_format, tuple(record.shape.dim), aligned, "cv181x")}
        ours = run_cvimodel(cvimodel, frame)
        vendor = run_vendor(path, frame)
        for out, value in ours.items():
            assert np.array_equal(value, vendor[out].reshape(value.shape)), out
        # the fused step adds no error (a YUV frame's colour conversion does): the float-input build on the
        # float-preprocessed picture, exactly
        if quant == "int8" and "YUV" not in record.pixel_format:
            fed = run_cvimodel(float_cvimodel, {"x": _float_input(rgb)})
            assert all(np.array_equal(ours[k], fed[k]) for k in ours)
        reference = session.run(None, {"x": _float_input(rgb)})[0].ravel()
        agree.append(np.argmax(next(iter(ours.values()))) == np.argmax(reference))
        second, top = np.sort(reference)[-2:]
        clear.append(top - second >= CLEAR_MARGIN)
    # int8 may move a picture where the float model hesitates (4:2:0 chroma has moved 3 of 20), never a clear one
    flips = 1 if "YUV" not in record.pixel_format else 3
    assert sum(agree) >= count - flips and all(a for a, c in zip(agree, clear) if c), (agree, clear)


@pytest.mark.parametrize(("chip", "quant"), [("cv183x", "int8"), ("cv180x", "int8"), ("cv182x", "bf16")])
def test_gray_frame_on_other_chips(chip: str, quant: str, tmp_path: Path) -> None:
    """A one-channel model fed a grey frame: the lookup on cv183x's TIU layout, and on cv180x a model with no
    CPU routine at all (the frame needs no CPU quant), equal on both simulators."""
    import onnx

    from npuc.models.make_models import _single
    from npuc.models.netbuilder import NetBuilder
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate
    from npuc.passes.calibration.calitable import write_table

    b = NetBuilder("grey", np.random.default_rng(4))
    model = tmp_path / "grey.onnx"
    onnx.save(_single(b, b.op("Relu", b.conv(b.op("Relu", b.conv("input", 1, 8)), 8, 8)), (1, 1, 40, 36)), model)
    pre = Preprocess(mean=(127.5,), scale=(1 / 127.5,), color="gray")
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (1, 1, 40, 36), dtype=np.uint8) for _ in range(4)]
    samples = []
    for i, frame in enumerate(frames):
        samples.append(tmp_path / f"s{i}.npz")
        np.savez(samples[-1], input=(frame.astype(np.float32) - 127.5) * np.float32(1 / 127.5))
    result = calibrate(model, samples, options=CalibrationOptions(method="max"))
    result.table.preprocess = pre.spec()
    write_table(result.table, tmp_path / "table.txt")
    path = build(model, tmp_path / "table.txt", chip, quant, tmp_path / "grey.cvimodel", input_dtype="uint8",
                 pixel_format="gray")  # fmt: skip
    cvimodel = read_cvimodel(path.read_bytes())
    routines = cvimodel.body.programs[0].routines
    assert all(r.cpu_routine is None for r in routines)  # the frame enters the TPU directly
    for frame in frames[:2]:
        ours = run_cvimodel(cvimodel, {"input": frame})
        vendor = run_vendor(path, {"input": frame})
        for out, value in ours.items():
            assert np.array_equal(value, vendor[out].reshape(value.shape)), out


@pytest.fixture(scope="module")
def photo_table(real_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`npuc calibrate`'s defaults on CALIBRATION_PHOTOS at every rotation, mirrored, as PNG files."""
    folder = tmp_path_factory.mktemp("photos")
    pngs = []
    for name in CALIBRATION_PHOTOS:
        for degrees in ROTATIONS:
            pngs.append(folder / f"{name}_{degrees}.png")
            Image.fromarray(np.ascontiguousarray(_fitted(rotate(load_image(name), degrees))[:, ::-1])).save(pngs[-1])
    table = folder / "table.txt"
    npuc.calibrate(real_model(NAME), pngs, table, preprocess=PRE, input_shapes=real_model_shapes(NAME))
    return table


@pytest.mark.parametrize("fmt", ["bgr_packed", "nv21"])
def test_frame_builds_classify_unseen_photos_as_float(fmt: str, real_model, photo_table: Path, tmp_path: Path) -> None:
    """The user's build (`npuc build --quant int8 --calib T --input-dtype uint8 --pixel-format F`, with the
    table's qtable and side file) of the default table, fed the raw frame of 16 pictures calibration never saw:
    the vendor simulator's bits, and the float model's top-1 on every one."""
    model = real_model(NAME)
    path = tmp_path / f"{fmt}.cvimodel"
    npuc.build(model, "cv18xx", path, chip="cv181x", quant="int8", calib=photo_table,
               input_shapes=real_model_shapes(NAME), options={"input_dtype": "uint8", "pixel_format": fmt})  # fmt: skip
    cvimodel = read_cvimodel(path.read_bytes())
    record = next(t for t in cvimodel.body.programs[0].tensor_map if t.name == "x")
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    decisions = []
    for name in LABELLED_PHOTOS:
        for label, degrees in enumerate(ROTATIONS):
            rgb = _fitted(rotate(load_image(name), degrees))
            frame = {"x": picture_frame(rgb, record.pixel_format, tuple(record.shape.dim), False, "cv181x")}
            ours = run_cvimodel(cvimodel, frame)
            vendor = run_vendor(path, frame)
            for out, value in ours.items():
                assert np.array_equal(value, vendor[out].reshape(value.shape)), (name, degrees, out)
            reference = session.run(None, {"x": _float_input(rgb)})[0].ravel()
            assert np.argmax(reference) == label, (name, degrees)  # the photo set: float reads each one right
            decisions.append((name, degrees, int(np.argmax(next(iter(ours.values())))), label))
    assert all(got == label for *_, got, label in decisions), decisions
