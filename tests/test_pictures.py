"""Pictures become inputs as tpu-mlir's preprocessing makes them (OpenCV decoding with EXIF orientation, uint8
INTER_LINEAR resize, letterbox with pad value and placement, H//2 - h//2 centre crop, float32 (x - mean) *
scale), and the hb_mapper YAML path calibrates to the same table as the equivalent `npuc calibrate` flags."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from golden import GOLDEN_ROOT
from PIL import Image

from npuc.cli.app import main
from npuc.compiler.errors import UserError
from npuc.passes.calibration.pictures import decode_picture, letterbox
from npuc.passes.calibration.preprocess import InputSpec, Preprocess, load_sample

MODEL = GOLDEN_ROOT / "cv18xx" / "smallcnn.onnx"


def _photo(path: Path, h: int = 61, w: int = 87, seed: int = 0, **save) -> Path:
    """A smooth colour picture (JPEG-friendly, so decoders agree on more than noise)."""
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(seed)
    phase = rng.random(3) * 6
    rgb = np.stack([127 + 120 * np.sin(x / (7 + 3 * c) + y / (11 + c) + phase[c]) for c in range(3)], -1)
    Image.fromarray(rgb.astype(np.uint8)).save(path, **save)
    return path


def _tpu_mlir_input(path: Path, shape: tuple[int, int], resize: tuple[int, int] | None, mean: np.ndarray,
                    scale: np.ndarray, rgb: bool, keep: bool = False, pad_value: int = 0,
                    pad_type: str = "center") -> np.ndarray:  # fmt: skip
    """tpu-mlir's documented picture pipeline, written out with OpenCV: imread (BGR), resize or letterbox to the
    resize size, centre crop from H//2 - h//2, float32, BGR -> RGB if asked, (x - mean) * scale, NCHW."""
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    rh, rw = resize or shape
    if keep:
        ratio = min(rw / img.shape[1], rh / img.shape[0])
        sw, sh = int(img.shape[1] * ratio), int(img.shape[0] * ratio)
        out = np.full((rh, rw, 3), pad_value, np.uint8)
        top, left = ((rh - sh) // 2, (rw - sw) // 2) if pad_type == "center" else (0, 0)
        out[top : top + sh, left : left + sw] = cv2.resize(img, (sw, sh))
        img = out
    else:
        img = cv2.resize(img, (rw, rh))
    top, left = rh // 2 - shape[0] // 2, rw // 2 - shape[1] // 2
    x = img[top : top + shape[0], left : left + shape[1]].astype(np.float32)
    x = x[..., ::-1] if rgb else x
    return ((x - mean) * scale).transpose(2, 0, 1)[None]


@pytest.mark.parametrize(
    "resize, keep, pad_value, pad_type",
    [(None, False, 0, "center"), ((40, 57), False, 0, "center"), ((40, 57), True, 114, "center"),
     ((45, 45), True, 0, "normal"), ((33, 33), True, 7, "center")],
)  # fmt: skip
@pytest.mark.parametrize("color", ["rgb", "bgr"])
def test_pictures_equal_tpu_mlirs_pipeline_bit_for_bit(tmp_path: Path, resize, keep, pad_value, pad_type,
                                                       color) -> None:  # fmt: skip
    path = _photo(tmp_path / "p.jpg", quality=85)
    mean, scale = np.float32([123.675, 116.28, 103.53]), np.float32([0.0171, 0.0175, 0.0174])
    pre = Preprocess(mean=tuple(map(float, mean[::-1] if color == "bgr" else mean)), scale=tuple(map(
        float, scale[::-1] if color == "bgr" else scale)), color=color, resize=resize, keep_aspect_ratio=keep,
        pad_value=pad_value, pad_type=pad_type)  # fmt: skip
    got = load_sample(path, [InputSpec("x", (1, 3, 32, 32), np.dtype(np.float32))], pre)["x"]
    want = _tpu_mlir_input(path, (32, 32), resize, np.float32(pre.mean), np.float32(pre.scale), color == "rgb",
                           keep, pad_value, pad_type)  # fmt: skip
    assert got.dtype == np.float32 and np.array_equal(got, want)


def test_letterbox_keeps_the_aspect_ratio_and_pads() -> None:
    img = np.full((20, 40, 3), 200, np.uint8)
    centred = letterbox(img, 30, 30, pad_value=9)
    assert centred.shape == (30, 30, 3)
    # 40 wide -> 30: 15 rows of picture, 7 padded rows above (centre), 8 below
    assert (centred[:7] == 9).all() and (centred[7:22] == 200).all() and (centred[22:] == 9).all()
    top_left = letterbox(img, 30, 30, pad_value=9, pad_type="normal")
    assert (top_left[:15] == 200).all() and (top_left[15:] == 9).all()
    with pytest.raises(UserError, match="pad-type"):
        letterbox(img, 30, 30, pad_type="corner")


def test_exif_orientation_is_applied_as_opencv_reads_photos(tmp_path: Path) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = _photo(tmp_path / "phone.jpg", h=40, w=60, exif=exif, quality=90)
    assert decode_picture(path).shape == (60, 40, 3)  # Pillow alone would give 40x60
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert np.array_equal(decode_picture(path), bgr[..., ::-1])


def test_grey_models_decode_pictures_grey(tmp_path: Path) -> None:
    path = _photo(tmp_path / "g.jpg", quality=80)
    got = load_sample(path, [InputSpec("x", (1, 1, 61, 87), np.dtype(np.float32))], Preprocess(color="gray"))["x"]
    assert np.array_equal(got[0, 0], cv2.imread(str(path), cv2.IMREAD_GRAYSCALE).astype(np.float32))


def test_a_decompression_bomb_is_refused_from_its_header(tmp_path: Path) -> None:
    """A PNG whose header claims 100000 x 100000 pixels: refused before a pixel is decoded."""
    path = tmp_path / "bomb.png"
    Image.new("RGB", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr : ihdr + 8] = struct.pack(">II", 100000, 100000)
    data[ihdr + 13 : ihdr + 17] = struct.pack(">I", zlib.crc32(bytes(data[ihdr - 4 : ihdr + 13])))
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="bomb.png: .* pixels is more than"):
        decode_picture(path)
    data[ihdr : ihdr + 8] = struct.pack(">II", 12000, 12000)  # under Pillow's bound, over npuc's
    data[ihdr + 13 : ihdr + 17] = struct.pack(">I", zlib.crc32(bytes(data[ihdr - 4 : ihdr + 13])))
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="bomb.png: 12000x12000 pixels is more than"):
        decode_picture(path)
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    with pytest.raises(UserError, match="bad.jpg: cannot decode picture"):
        decode_picture(tmp_path / "bad.jpg")


def test_letterbox_settings_round_trip_through_the_table_header() -> None:
    pre = Preprocess(mean=(1.0, 2.0, 3.0), resize=(40, 50), keep_aspect_ratio=True, pad_value=114, pad_type="normal")
    assert Preprocess.from_spec(pre.spec(), "t") == pre
    old = "mean=0.0 scale=1.0 color=rgb resize=none layout=nchw"  # a table written before the letterbox fields
    assert Preprocess.from_spec(old, "t") == Preprocess()
    with pytest.raises(UserError, match="pad-value 300"):
        Preprocess(pad_value=300)


def test_yaml_config_and_calibrate_flags_give_the_same_table(tmp_path: Path) -> None:
    """The same pictures, colour order, mean and scale through an hb_mapper YAML (rt = train = bgr) and through
    `npuc calibrate --color bgr --mean --scale`: the same tensor rows, byte for byte."""
    from npuc.api.hbcalib import calibrate_config
    from npuc.frontends.hbconfig import load_config
    from npuc.passes.calibration.calitable import format_table, read_table

    pictures = tmp_path / "cal"
    pictures.mkdir()
    for i in range(4):
        _photo(pictures / f"{i}.jpg", h=50 + 7 * i, w=90 - 5 * i, seed=i, quality=90)
    mean, scale = "103.94 116.78 123.68", "0.017 0.0175 0.0174"
    config = {
        "model_parameters": {"onnx_model": str(MODEL), "march": "bernoulli2", "output_model_file_prefix": "net"},
        "input_parameters": {"input_type_train": "bgr", "input_layout_train": "NCHW", "input_type_rt": "bgr",
                             "norm_type": "data_mean_and_scale", "mean_value": mean, "scale_value": scale},
        "calibration_parameters": {"cal_data_dir": str(pictures), "calibration_type": "kl"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    import onnx

    shape = tuple(d.dim_value for d in onnx.load(MODEL).graph.input[0].type.tensor_type.shape.dim)
    name = onnx.load(MODEL).graph.input[0].name
    hb = load_config(tmp_path / "c.yaml").bind({name: shape})
    from_yaml = calibrate_config(hb, MODEL)
    table = tmp_path / "t.txt"
    flags = ["--color", "bgr", "--mean", mean.replace(" ", ","), "--scale", scale.replace(" ", ",")]
    with pytest.raises(SystemExit) as done:
        main(["calibrate", str(MODEL), "--data", str(pictures), "--method", "kl", "-o", str(table), *flags])
    assert done.value.code in (0, None)

    def rows(text: str) -> list[str]:
        return [line for line in text.splitlines() if line and not line.startswith("#")]

    assert rows(format_table(from_yaml)) == rows(format_table(read_table(table)))
    assert len(rows(table.read_text())) > 3
