"""cv18xx fused preprocessing (`--input-dtype uint8 --pixel-format F`): the option contract, the input tensor
record read back from the bytes, and npuc's simulator on the frame against the float-input build fed the
float-preprocessed frame (int8: equal bit for bit, the lookup tables being exact)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.frames import picture_frame
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.cli.app import main
from npuc.models.make_models import _single, make_model
from npuc.models.netbuilder import NetBuilder
from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate
from npuc.passes.calibration.calitable import write_table
from npuc.passes.calibration.preprocess import Preprocess

MEAN = (123.675, 116.28, 103.53)
SCALE = (0.0171, 0.0175, 0.0174)
FRAMES = {  # --pixel-format -> the frame of an HxWx3 RGB picture
    "rgb_planar": lambda rgb: rgb.transpose(2, 0, 1),
    "bgr_planar": lambda rgb: rgb[..., ::-1].transpose(2, 0, 1),
    "rgb_packed": lambda rgb: rgb,
    "bgr_packed": lambda rgb: rgb[..., ::-1],
}


def _pictures(n: int, h: int, w: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]


def _float_input(rgb: np.ndarray, pre: Preprocess) -> np.ndarray:
    """What calibrate makes of the picture (passes/calibration/preprocess.image_to_tensor's arithmetic), NCHW."""
    img = rgb.astype(np.float32) if pre.color == "rgb" else rgb[..., ::-1].astype(np.float32)
    out = (img - np.asarray(pre.mean, np.float32)) * np.asarray(pre.scale, np.float32)
    return np.ascontiguousarray(out.transpose(2, 0, 1)[None])


def _table(model: Path, folder: Path, pre: Preprocess, pictures: list[np.ndarray]) -> Path:
    samples = []
    for i, rgb in enumerate(pictures):
        samples.append(folder / f"s{i}.npz")
        np.savez(samples[-1], input=_float_input(rgb, pre))
    result = calibrate(model, samples, options=CalibrationOptions(method="max"))
    result.table.preprocess = pre.spec()
    table = folder / "table.txt"
    write_table(result.table, table)
    return table


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Preprocess]:
    folder = tmp_path_factory.mktemp("tiny")
    model = folder / "tinycnn.onnx"
    onnx.save(make_model("tinycnn"), model)
    pre = Preprocess(mean=MEAN, scale=SCALE, color="bgr")
    return model, _table(model, folder, pre, _pictures(6, 32, 32)), pre


def _cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    captured = capsys.readouterr()
    return exit_info.value.code or 0, captured.out + captured.err


def _build(capsys: pytest.CaptureFixture, model: Path, out: Path, *args: str) -> tuple[int, str]:
    return _cli(capsys, "build", str(model), "--target", "cv18xx", "-o", str(out), *args)


@pytest.mark.parametrize("quant", ["int8", "bf16"])
@pytest.mark.parametrize("fmt", list(FRAMES))
def test_frame_model_equals_float_model_on_the_preprocessed_frame(
    fmt: str, quant: str, tiny, tmp_path: Path, capsys
) -> None:
    model, table, pre = tiny
    code, out = _build(capsys, model, tmp_path / "frame.cvimodel", "--calib", str(table), "--quant", quant,
                       "--input-dtype", "uint8", "--pixel-format", fmt)  # fmt: skip
    assert code == 0, out
    code, out = _build(capsys, model, tmp_path / "float.cvimodel", "--calib", str(table), "--quant", quant)
    assert code == 0, out
    frame_model = read_cvimodel((tmp_path / "frame.cvimodel").read_bytes())
    float_model = read_cvimodel((tmp_path / "float.cvimodel").read_bytes())
    record = next(t for t in frame_model.body.programs[0].tensor_map if t.name == "input")
    assert record.dtype == 7 and record.pixel_format == fmt.upper() and not record.aligned
    assert list(record.shape.dim) == ([1, 32, 32, 3] if "packed" in fmt else [1, 3, 32, 32])
    assert list(record.scale) == [1.0] * 3 and list(record.mean) == [0.0] * 3  # tpu-mlir resets them once fused
    for rgb in _pictures(3, 32, 32, seed=7):
        ours = run_cvimodel(frame_model, {"input": np.ascontiguousarray(FRAMES[fmt](rgb))[None]})["output"]
        ref = run_cvimodel(float_model, {"input": _float_input(rgb, pre)})["output"]
        if quant == "int8":  # the tables hold exactly what the CPU quant routine makes of the float input
            assert np.array_equal(ours, ref)
        else:  # bf16: the TPU's x * scale + bias against the float input rounded to bf16
            assert np.abs(ours - ref).max() <= 0.05 * np.abs(ref).max()


def test_gray_frame(tmp_path: Path, capsys) -> None:
    b = NetBuilder("gray", np.random.default_rng(3))
    model = tmp_path / "gray.onnx"
    onnx.save(_single(b, b.op("Relu", b.conv("input", 1, 8)), (1, 1, 16, 16)), model)
    frame = ["--input-dtype", "uint8", "--pixel-format", "gray", "--color", "gray", "--mean", "128"]
    code, out = _build(capsys, model, tmp_path / "g.cvimodel", "--quant", "bf16", *frame, "--scale", "0.0078125")
    assert code == 0, out
    code, out = _build(capsys, model, tmp_path / "f.cvimodel", "--quant", "bf16")
    assert code == 0, out
    frame = np.random.default_rng(1).integers(0, 256, (1, 1, 16, 16), dtype=np.uint8)
    ours = run_cvimodel(read_cvimodel((tmp_path / "g.cvimodel").read_bytes()), {"input": frame})["output"]
    fed = (frame.astype(np.float32) - 128) * np.float32(0.0078125)  # exact in bf16
    ref = run_cvimodel(read_cvimodel((tmp_path / "f.cvimodel").read_bytes()), {"input": fed})["output"]
    assert np.array_equal(ours, ref)


BF16 = ["--target", "cv18xx", "--quant", "bf16"]
FRAME = [*BF16, "--input-dtype", "uint8", "--pixel-format"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "dmp", "--pixel-format", "rgb_packed"], "--pixel-format is not used by target 'dmp' (it is for"),
        (["--target", "dmp", "--aligned-input"], "--aligned-input is not used by target 'dmp' (it is for cv18xx)"),
        ([*BF16, "--pixel-format", "bgr_packed"], "add --input-dtype uint8"),
        ([*BF16, "--mean", "127"], "add --input-dtype uint8"),
        ([*BF16, "--input-dtype", "int8"], "--input-dtype int8 is not a cv18xx input"),
        ([*FRAME, "nv21", "--color", "gray"], "pick a matching format"),
        ([*FRAME, "gray"], "pick a matching format"),
        ([*FRAME, "rgba"], "is not one of"),
    ],
)  # fmt: skip
def test_frame_options_are_checked(args: list[str], message: str, tiny, tmp_path: Path, capsys) -> None:
    model = tiny[0]
    code, out = _cli(capsys, "build", str(model), "-o", str(tmp_path / "m"), *args)
    assert code == 2, out
    assert message in out and len(out.strip().splitlines()) == 1


def test_a_flag_contradicting_the_table_names_both_values(tiny, tmp_path: Path, capsys) -> None:
    model, table, _ = tiny
    code, out = _build(capsys, model, tmp_path / "m.cvimodel", "--calib", str(table), "--input-dtype", "uint8",
                       "--pixel-format", "rgb_packed", "--color", "rgb")  # fmt: skip
    assert code == 2
    assert "--color rgb contradicts" in out and "color=bgr" in out


def test_inspect_shows_the_frame_and_run_feeds_a_picture_as_the_frame(tiny, tmp_path: Path, capsys) -> None:
    from PIL import Image

    model, table, _ = tiny
    path = tmp_path / "m.cvimodel"
    code, out = _build(capsys, model, path, "--calib", str(table), "--input-dtype", "uint8", "--pixel-format",
                       "bgr_packed")  # fmt: skip
    assert code == 0, out
    code, out = _cli(capsys, "inspect", str(path))
    assert code == 0 and "input: pixel_format BGR_PACKED, aligned False, scale 1,1,1, mean 0,0,0" in out
    rgb = _pictures(1, 32, 32, seed=11)[0]
    Image.fromarray(rgb).save(tmp_path / "picture.png")
    code, out = _cli(capsys, "run", str(path), "--input", str(tmp_path / "picture.png"), "-o", str(tmp_path / "o.npz"))
    assert code == 0, out
    expected = run_cvimodel(read_cvimodel(path.read_bytes()), {"input": np.ascontiguousarray(rgb[..., ::-1])[None]})
    with np.load(tmp_path / "o.npz") as got:
        assert np.array_equal(got["output"], expected["output"])
    code, out = _cli(capsys, "run", str(path), "--input", str(tmp_path / "picture.png"), "--mean", "127")
    assert code == 2 and "--mean 127.0 is not used: input 'input' takes the BGR_PACKED camera frame" in out


YUV = {"nv21": "YUV_NV21", "nv12": "YUV_NV12", "yuv420_planar": "YUV420_PLANAR"}


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bf16 (nearest even), as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _tpu_rgb(frame: np.ndarray, fmt: str, h: int, w: int) -> np.ndarray:
    """HxWx3 uint8 RGB of a YUV frame as tpu-mlir's formulas give it in bf16, one rounding per TIU step:
    y = (Y - 16) * 1.164, u = U - 128, v = V - 128, R = y + 1.596 v, G = y - 0.391 u - 0.813 v, B = y + 2.018 u,
    each 2x2 block sharing its chroma, stored rounded to nearest even and saturated."""
    flat = frame.reshape(-1).astype(np.float32)
    y = _bf16((flat[: h * w].reshape(h, w) - 16) * _bf16(1.164))
    chroma = flat[h * w : h * w * 3 // 2]
    if fmt == "yuv420_planar":
        u, v = chroma[: h * w // 4], chroma[h * w // 4 :]
    else:
        first, second = chroma[0::2], chroma[1::2]
        u, v = (second, first) if fmt == "nv21" else (first, second)
    u, v = ((c.reshape(h // 2, w // 2) - 128).repeat(2, 0).repeat(2, 1) for c in (u, v))
    planes = []
    for gains in ((0.0, 1.596), (-0.391, -0.813), (2.018, 0.0)):
        out = y
        for c, gain in zip((u, v), gains):
            if gain:
                out = _bf16(out + _bf16(c * _bf16(gain)))
        planes.append(np.clip(np.rint(out), 0, 255).astype(np.uint8))
    return np.stack(planes, axis=-1)


@pytest.mark.parametrize("fmt", list(YUV))
def test_yuv_frame_converts_as_tpu_mlir_formulas(fmt: str, tiny, tmp_path: Path, capsys) -> None:
    """The int8 model fed a YUV frame equals the float-input build fed the RGB picture tpu-mlir's formulas make
    of that frame, bit for bit; the frame npuc run makes of a picture gives back that picture within 3 levels."""
    model, table, pre = tiny
    code, out = _build(capsys, model, tmp_path / "yuv.cvimodel", "--calib", str(table), "--input-dtype", "uint8",
                       "--pixel-format", fmt)  # fmt: skip
    assert code == 0, out
    code, out = _build(capsys, model, tmp_path / "float.cvimodel", "--calib", str(table))
    assert code == 0, out
    yuv_model = read_cvimodel((tmp_path / "yuv.cvimodel").read_bytes())
    float_model = read_cvimodel((tmp_path / "float.cvimodel").read_bytes())
    record = next(t for t in yuv_model.body.programs[0].tensor_map if t.name == "input")
    assert record.pixel_format == YUV[fmt] and list(record.shape.dim) == [1, 3, 32, 32]  # tpu-mlir's NCHW shape
    for rgb in _pictures(3, 32, 32, seed=5):
        frame = picture_frame(rgb, YUV[fmt], (1, 3, 32, 32))
        converted = _tpu_rgb(frame, fmt, 32, 32)
        ours = run_cvimodel(yuv_model, {"input": frame})["output"]
        ref = run_cvimodel(float_model, {"input": _float_input(converted, pre)})["output"]
        assert np.array_equal(ours, ref)
        smooth = rgb[::2, ::2].repeat(2, 0).repeat(2, 1)  # nothing lost to chroma subsampling
        back = _tpu_rgb(picture_frame(smooth, YUV[fmt], (1, 3, 32, 32)), fmt, 32, 32)
        assert np.abs(back.astype(int) - smooth).max() <= 3


# tpu-mlir's aligned_image_size of a 1x3x32x32 input: (chip, pixel_format) -> bytes
ALIGNED_SIZES = {
    ("cv181x", "bgr_packed"): 32 * 128,  # rows of 96 bytes padded to 128
    ("cv181x", "rgb_planar"): 3 * 32 * 64,  # rows of 32 padded to 64, planes to 64
    ("cv181x", "nv21"): 64 * 32 + 64 * 16,  # Y rows and chroma rows padded to 64
    ("cv183x", "rgb_planar"): 3 * 4096,  # rows padded to 32, planes to 4 KiB
    ("cv183x", "yuv420_planar"): 3 * 4096,  # Y rows to 64, U and V rows to 32, each plane to 4 KiB
}


@pytest.mark.parametrize(("chip", "fmt"), list(ALIGNED_SIZES))
def test_aligned_frame_runs_as_the_unaligned_one(chip: str, fmt: str, tiny, tmp_path: Path, capsys) -> None:
    model, table, _ = tiny
    frame_args = ["--calib", str(table), "--chip", chip, "--input-dtype", "uint8", "--pixel-format", fmt]
    code, out = _build(capsys, model, tmp_path / "a.cvimodel", *frame_args, "--aligned-input")
    assert code == 0, out
    code, out = _build(capsys, model, tmp_path / "u.cvimodel", *frame_args)
    assert code == 0, out
    aligned, unaligned = (read_cvimodel((tmp_path / f"{k}.cvimodel").read_bytes()) for k in "au")
    record = next(t for t in aligned.body.programs[0].tensor_map if t.name == "input")
    assert record.aligned and record.size == ALIGNED_SIZES[chip, fmt]
    vendor_name = record.pixel_format
    for rgb in _pictures(2, 32, 32, seed=9):
        shape = tuple(record.shape.dim)
        padded = picture_frame(rgb, vendor_name, shape, aligned=True, chip=chip)
        assert padded.size == record.size
        ours = run_cvimodel(aligned, {"input": padded})["output"]
        ref = run_cvimodel(unaligned, {"input": picture_frame(rgb, vendor_name, shape)})["output"]
        assert np.array_equal(ours, ref)
