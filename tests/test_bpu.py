"""bpu target: hbDNN SHIFT/SCALE formulas, tensor-property alignment, the contract files, and a PP-LCNet build
from an hb_mapper YAML with an NV12 input whose top-1 matches the RGB float model on real pictures."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from metrics import cosine

from npuc.backends.bpu import artifact as bpu_artifact
from npuc.backends.bpu.contract import (
    Contract,
    TensorProperties,
    align_bytes,
    contract_from_json,
    contract_to_json,
    make_properties,
)
from npuc.backends.bpu.qdq_runtime import qdq_session
from npuc.cli.app import main
from npuc.compiler.artifacts import ArtifactOptions, detect
from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.interp import run
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.numformats.horizon_int8 import (
    horizon_scale_dequantize,
    horizon_scale_quantize,
    horizon_shift_dequantize,
    horizon_shift_quantize,
)
from npuc.frontends.colorspace import nv12_to_yuv444, rgb_to_nv12, to_int8_128
from npuc.frontends.hbconfig import load_config
from npuc.frontends.onnx import import_onnx
from npuc.models import images as im
from npuc.passes.calibration.calitable import read_table
from npuc.passes.export.qdq import thresholds_for_model
from npuc.passes.quantization.quantize import quantize
from npuc.passes.rewrite.canonicalize import canonicalize

GOLDEN = GOLDEN_ROOT / "cv18xx"
HALF_STEPS = np.arange(-600, 601) / 2.0  # every integer and every tie from -300 to 300
BOUNDS = {"s8": (-128, 127), "u8": (0, 255)}


def cli(args: list[str]) -> None:
    """`npuc ARGS` in-process; success may end in SystemExit(0)."""
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code in (0, None), exc.code


def nearbyint_clip(values: np.ndarray, dtype: str) -> list[int]:
    """The documented reference, element by element: Python's round() is round-half-even like nearbyint."""
    lo, hi = BOUNDS[dtype]
    return [min(hi, max(lo, round(float(v)))) for v in values]


# ---- SHIFT and SCALE formulas ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["s8", "u8"])
@pytest.mark.parametrize("shift", [0, 3, 7])
def test_shift_quantize_is_nearbyint_of_x_times_2_pow_shift(dtype, shift):
    x = (HALF_STEPS / 2.0**shift).astype(np.float32)  # x·2^shift hits every tie exactly
    q = horizon_shift_quantize(x, np.array([shift]), dtype)
    assert q.tolist() == nearbyint_clip(HALF_STEPS, dtype)
    assert q.dtype == (np.int8 if dtype == "s8" else np.uint8)
    # ties go to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, -1.5 -> -2
    ties = horizon_shift_quantize(np.array([0.5, 1.5, 2.5, -0.5, -1.5]) / 2.0**shift, np.array([shift]), "s8")
    assert ties.tolist() == [0, 2, 2, 0, -2]


def test_shift_dequantize_is_q_over_2_pow_shift():
    q = np.arange(-128, 128, dtype=np.int8)
    for shift in (0, 5, 12):
        assert horizon_shift_dequantize(q, np.array([shift])).tolist() == [v / 2.0**shift for v in range(-128, 128)]


@pytest.mark.parametrize(("dtype", "zero_point"), [("s8", 0), ("s8", -3), ("u8", 0), ("u8", 5)])
def test_scale_quantize_is_clip_nearbyint_x_over_scale_plus_zp(dtype, zero_point):
    scale = 0.25  # x/scale exact in float32, so every tie is a tie
    x = (HALF_STEPS * scale).astype(np.float32)
    q = horizon_scale_quantize(x, np.array([scale]), np.array([zero_point]), dtype)
    assert q.tolist() == nearbyint_clip(HALF_STEPS + zero_point, dtype)
    back = horizon_scale_dequantize(q, np.array([scale]), np.array([zero_point]))
    assert back.tolist() == [(v - zero_point) * scale for v in q.tolist()]


def test_scale_per_axis_uses_quantize_axis():
    x = np.array([1.0, -1.0, 3.0, 0.3], np.float32).reshape(1, 1, 1, 4) * np.ones((1, 3, 1, 1), np.float32)
    scale, zp = np.array([0.5, 0.25, 2.0], np.float32), np.array([0, 1, -1], np.int8)
    q = horizon_scale_quantize(x, scale, zp, "s8", axis=1)
    assert q[0, :, 0].tolist() == [[2, -2, 6, 1], [5, -3, 13, 2], [0, -2, 0, -1]]  # 3/2 - 1 = 0.5 -> 0
    assert horizon_scale_dequantize(q, scale, zp, axis=1)[0, 2, 0].tolist() == [2.0, -2.0, 2.0, 0.0]
    q_shift = horizon_shift_quantize(x, np.array([1, 2, 0]), "s8", axis=1)
    assert q_shift[0, :, 0].tolist() == [[2, -2, 6, 1], [4, -4, 12, 1], [1, -1, 3, 0]]


# ---- alignment and the contract record ------------------------------------------------------------------


def test_align_bytes_256k_plus_steps():
    cases = {0: 0, 1: 16, 16: 16, 17: 32, 33: 64, 65: 128, 129: 256, 200: 256, 256: 256, 257: 272, 300: 320, 448: 512}
    assert {n: align_bytes(n) for n in cases} == cases


def test_nv12_input_properties():
    p = make_properties("img", (1, 3, 224, 226), "NCHW", "IMG_NV12", False)
    assert p.aligned_shape == (1, 3, 224, 240)  # W to 16
    assert p.aligned_byte_size == 224 * 240 * 3 // 2
    assert p.stride == (0, 0, 0, 0)


def test_packed_rgb_input_aligns_h_to_2_and_w_to_32():
    p = make_properties("img", (1, 223, 225, 3), "NHWC", "IMG_RGB", False)
    assert p.aligned_shape == (1, 224, 256, 3)
    assert p.stride == (224 * 256 * 3, 256 * 3, 3, 1)
    assert p.aligned_byte_size == 224 * 256 * 3


def test_featuremap_and_output_rules():
    nchw = make_properties("f", (1, 3, 20, 20), "NCHW", "S8", False)
    assert nchw.aligned_shape == (1, 3, 20, 32) and nchw.stride == (1920, 640, 32, 1)
    nhwc = make_properties("f", (1, 5, 5, 40), "NHWC", "S8", False)
    assert nhwc.aligned_shape == (1, 5, 5, 64)
    out = make_properties("o", (1, 10, 7, 7), "NCHW", "S8", True)
    assert out.aligned_shape == (1, 16, 7, 7) and out.aligned_byte_size == 16 * 49
    f32 = make_properties("o", (1, 84, 84, 255), "NHWC", "F32", True)  # dequantized: not padded
    assert f32.aligned_shape == (1, 84, 84, 255) and f32.aligned_byte_size == 84 * 84 * 255 * 4


def _per_axis_contract() -> Contract:
    p = make_properties("f", (1, 3, 4, 4), "NCHW", "S8", False)
    p.quanti_type, p.scale_data, p.zero_point_data, p.quantize_axis = "SCALE", (0.5, 0.25, 2.0), (0, 0, 0), 1
    o = make_properties("o", (1, 2), "NONE", "S8", True, quanti_type="SHIFT", shift_data=(3,))
    return Contract("net", "bernoulli2", "net_quantized_model.onnx", [p], [o])


def test_contract_json_round_trip_with_per_axis_scale():
    c = _per_axis_contract()
    raw = contract_to_json(c)
    data = json.loads(raw)
    p = data["inputs"][0]
    assert (p["tensorTypeValue"], p["tensorLayoutValue"], p["quantiTypeValue"], p["quantizeAxis"]) == (8, 2, 2, 1)
    assert data["outputs"][0]["quantiTypeValue"] == 1 and data["outputs"][0]["tensorLayoutValue"] == 255
    back = contract_from_json(raw, "c.json")
    assert back.inputs[0] == c.inputs[0] and back.outputs[0] == c.outputs[0]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format="x"), "not an npuc hbDNN contract"),
        (lambda d: d.update(version=9), "contract version 9"),
        (lambda d: d["inputs"][0].pop("stride"), "field 'stride' is missing"),
        (lambda d: d["inputs"][0].update(validShape="abc"), "validShape"),
        (lambda d: d["inputs"][0].update(tensorType="IMG_RAW"), "tensorType 'IMG_RAW'"),
        (lambda d: d["inputs"][0].update(scaleData=[1.0, 2.0]), "SCALE data of length 2 \\(axis 1\\)"),
        (lambda d: d.update(quantized_model="../x.onnx"), "must be a file name in the same folder"),
        (lambda d: d.update(outputs=[]), "'outputs' must be a non-empty list"),
    ],
)
def test_corrupt_contracts_are_reported(edit, message):
    data = json.loads(contract_to_json(_per_axis_contract()))
    edit(data)
    with pytest.raises(CorruptFileError, match=message):
        contract_from_json(json.dumps(data).encode(), "c.json")
    with pytest.raises(CorruptFileError, match="not JSON"):
        contract_from_json(b"\xff{", "c.json")


# ---- featuremap build (smallcnn) ----------------------------------------------------------------------------


def test_featuremap_build_with_shift_boundaries(tmp_path, capsys):
    out = tmp_path / "small"
    table = GOLDEN / "smallcnn_cali_table.txt"
    cli(["build", str(GOLDEN / "smallcnn.onnx"), "-t", "bpu", "--calib", str(table), "-o", str(out),
         "--option", "quanti_type=shift", "--quant-output"])  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == [
        "hbdnn_contract.json", "smallcnn_hbdnn_contract.h", "smallcnn_quantized_model.onnx"
    ]  # fmt: skip
    c = bpu_artifact.read_contract(out)
    (inp,), (outp,) = c.inputs, c.outputs
    assert (inp.tensor_type, inp.quanti_type, inp.tensor_layout) == ("S8", "SHIFT", "NCHW")
    assert (outp.tensor_type, outp.quanti_type) == ("S8", "SHIFT")
    # the input threshold 4.72 becomes 127·2^-4 = 7.94 (largest power-of-two scale covering it)
    assert inp.shift_data == (4,) and inp.valid_shape == (1, 3, 64, 64) and inp.aligned_shape == (1, 3, 64, 64)
    feed = np.load(GOLDEN / "smallcnn_in.npz")["input"]
    kind = detect(out)
    assert kind.name == "bpu"
    from_float = kind.run(out, {"input": feed}, ArtifactOptions())["output"]
    codes = horizon_shift_quantize(feed, np.array(inp.shift_data), "s8")
    from_codes = kind.run(out, {"input": codes}, ArtifactOptions())["output"]
    assert from_float.dtype == np.int8 and np.array_equal(from_float, from_codes)
    session = qdq_session(str(out / c.model_file))
    dequantized = session.run(None, {"input": feed})[0]
    assert np.array_equal(horizon_shift_dequantize(from_float, np.array(outp.shift_data)), dequantized)
    cli(["inspect", str(out)])
    text = capsys.readouterr().out
    assert "input                S8         NCHW  valid 1x3x64x64" in text and "SHIFT [4]" in text


def test_build_needs_thresholds(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["build", str(GOLDEN / "smallcnn.onnx"), "-t", "bpu", "-o", str(tmp_path / "o")])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["build", str(GOLDEN / "smallcnn.onnx"), "-t", "bpu", "-o", str(tmp_path / "o"), "--calib",
              str(GOLDEN / "smallcnn_cali_table.txt"), "--option", "quanti_type=pow2"])  # fmt: skip
    assert info.value.code == 2


# ---- PP-LCNet from an hb_mapper YAML with an NV12 input ---------------------------------------------------


def _fitted(picture: np.ndarray) -> np.ndarray:
    """A picture as the camera would deliver it at the model's size: 224x224 RGB uint8 (short side 256, crop)."""
    rgb = im.as_rgb(picture)
    return np.clip(np.rint(im.FITS["short_crop"](rgb, 224, 224, 256)), 0, 255).astype(np.uint8)


def _pictures() -> list[np.ndarray]:
    """32 real pictures of the classifier's domain: scikit-image's page and text turned 0/90/180/270 degrees,
    their mirror images, and square pieces of the page and the text turned the same ways."""
    pictures = im.PICTURES["pplcnet_orientation"]()
    pieces = [im.load_image("page")[:, :191], im.load_image("page")[:, 193:], im.load_image("text")[:, :172],
              im.load_image("text")[:, 276:]]  # fmt: skip
    turned = [im.rotate(piece, degrees) for piece in pieces for degrees in (0, 90, 180, 270)]
    return [_fitted(p) for p in pictures + [p[:, ::-1] for p in pictures] + turned]


@pytest.fixture(scope="module")
def pplcnet_build(real_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("pplcnet_yaml")
    (root / "cal").mkdir()
    for i, picture in enumerate(_pictures()[:8]):  # hb_mapper calibration data: train-type pictures, NCHW
        np.save(root / "cal" / f"{i}.npy", picture.transpose(2, 0, 1)[None])
    mean = " ".join(f"{255 * m:g}" for m in im.IMAGENET_MEAN)
    scale = " ".join(f"{1 / (255 * s):.9g}" for s in im.IMAGENET_STD)
    config = root / "pplcnet.yaml"
    config.write_text(
        f"""model_parameters:
  onnx_model: {real_model("pplcnet_orientation")}
  march: bernoulli2
  output_model_file_prefix: pplcnet
  working_dir: model_output
  layer_out_dump: False
input_parameters:
  input_name: x
  input_type_train: rgb
  input_layout_train: NCHW
  input_type_rt: nv12
  input_shape: 1x3x224x224
  norm_type: data_mean_and_scale
  mean_value: {mean}
  scale_value: {scale}
calibration_parameters:
  cal_data_dir: ./cal
  calibration_type: default
compiler_parameters:
  compile_mode: latency
  optimize_level: O3
"""
    )
    cli(["build", "--config", str(config), "--target", "bpu"])  # every test of the folder sees a finished build
    return root, config


def test_yaml_config_builds_for_bpu(pplcnet_build, capsys):
    root, config = pplcnet_build
    cli(["build", "--config", str(config), "--target", "bpu"])
    out = root / "model_output" / "pplcnet_bpu"
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed
    assert "note: pplcnet.yaml: compiler_parameters.optimize_level: npuc writes no .bin" in printed
    assert (root / "model_output" / "pplcnet_cali_table.txt").is_file()
    data = json.loads((out / "hbdnn_contract.json").read_text())
    (inp,), (outp,) = data["inputs"], data["outputs"]
    assert (inp["tensorType"], inp["tensorTypeValue"], inp["tensorLayoutValue"]) == ("IMG_NV12", 1, 2)
    assert inp["validShape"] == inp["alignedShape"] == [1, 3, 224, 224]
    assert (inp["alignedByteSize"], inp["stride"], inp["quantiType"]) == (75264, [0, 0, 0, 0], "NONE")
    assert (outp["tensorType"], outp["tensorTypeValue"], outp["validShape"]) == ("F32", 13, [1, 4])
    model = qdq_session(str(out / "pplcnet_quantized_model.onnx"))
    (model_input,) = model.get_inputs()
    assert (model_input.type, model_input.shape) == ("tensor(int8)", [1, 224, 224, 3])
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    cli(["build", "--config", str(config)])  # same inputs, same bytes (bpu is the config's default target)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first


def test_config_build_reuses_its_table_until_an_input_changes(pplcnet_build, tmp_path, capsys):
    """The table in working_dir records what made it: a build with the same model, samples, preprocessing and
    method reuses it; --recalibrate or a changed sample calibrates again; --recalibrate needs --config."""
    import shutil

    root, _ = pplcnet_build
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("pplcnet_bpu"))
    config, table = copy / "pplcnet.yaml", copy / "model_output" / "pplcnet_cali_table.txt"
    made = table.read_bytes()
    assert read_table(table).inputs.startswith("sha256:")

    def build(*extra: str) -> str:
        capsys.readouterr()
        cli(["build", "--config", str(config), "--target", "bpu", *extra])
        return capsys.readouterr().out

    assert f"note: reused {table}" in build() and table.read_bytes() == made
    assert "note: calibrated on" in build("--recalibrate") and table.read_bytes() == made  # the same bytes again
    sample = copy / "cal" / "0.npy"
    np.save(sample, np.load(sample)[..., ::-1].copy())  # a changed sample
    assert "note: calibrated on" in build()
    assert read_table(table).inputs != read_table(root / "model_output" / table.name).inputs
    assert f"note: reused {table}" in build()
    with pytest.raises(SystemExit) as info:
        main(["build", str(config), "--target", "bpu", "--recalibrate"])
    assert info.value.code == 2 and "--recalibrate applies to --config builds" in capsys.readouterr().err


def test_contract_header_compiles(pplcnet_build, tmp_path):
    root, _ = pplcnet_build
    header = root / "model_output" / "pplcnet_bpu" / "pplcnet_hbdnn_contract.h"
    main_c = tmp_path / "main.c"
    main_c.write_text(
        f'#include <stdio.h>\n#include "{header}"\n'
        'int main(void) { printf("%d %d %d %d %d\\n", pplcnet_input0_x.tensorType, pplcnet_input0_x.tensorLayout,'
        " pplcnet_input0_x.alignedByteSize, pplcnet_output0_fetch_name_0.tensorType,"
        " pplcnet_input0_x.alignedShape.dimensionSize[3]); return 0; }\n"
    )
    exe = tmp_path / "a.out"
    subprocess.run(
        ["gcc", "-std=c99", "-Wall", "-Werror", "-DNPUC_HBDNN_STANDALONE", str(main_c), "-o", str(exe)], check=True
    )
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout == "1 2 75264 13 224\n"


def test_nv12_path_top1_matches_rgb_path(pplcnet_build, real_model, tmp_path):
    """32 real pictures: the NV12 camera frame (chroma subsampled) through the bpu int8 model gives the same
    top-1 as the RGB picture through the same int8 model built for input_type_rt rgb (same table); and through
    the float model, HzPreprocess of the NV12 frame gives the top-1 of the usual RGB preprocessing."""
    root, config = pplcnet_build
    out = root / "model_output" / "pplcnet_bpu"
    if not out.exists():
        cli(["build", "--config", str(config)])
    rgb_config = tmp_path / "rgb.yaml"
    rgb_config.write_text(config.read_text().replace("input_type_rt: nv12", "input_type_rt: rgb"))
    rgb_out = tmp_path / "rgb_bpu"
    table = root / "model_output" / "pplcnet_cali_table.txt"
    cli(["build", "--config", str(rgb_config), "--calib", str(table), "-o", str(rgb_out)])
    float_model = ort.InferenceSession(str(real_model("pplcnet_orientation")), providers=["CPUExecutionProvider"])
    affine = load_config(config).inputs[0].affine()
    kind = detect(out)
    pictures = _pictures()
    int8_agree = float_agree = 0
    for picture in pictures:
        nv12 = rgb_to_nv12(picture)  # what the camera hands the BPU
        nv12_top1 = kind.run(out, {"x": nv12}, ArtifactOptions())["fetch_name_0"].argmax()
        rgb_top1 = kind.run(rgb_out, {"x": picture[None]}, ArtifactOptions())["fetch_name_0"].argmax()
        int8_agree += int(nv12_top1 == rgb_top1)
        rgb_input = im.to_layout(im.normalize(picture, 1 / 255, im.IMAGENET_MEAN, im.IMAGENET_STD), "nchw")
        hz_input = affine.apply(nv12_to_yuv444_int8(nv12), channel_axis=-1).transpose(0, 3, 1, 2)
        float_agree += int(
            float_model.run(None, {"x": rgb_input})[0].argmax() == float_model.run(None, {"x": hz_input})[0].argmax()
        )
    assert len(pictures) == 32
    assert int8_agree / 32 >= 0.95 and float_agree / 32 >= 0.95


def nv12_to_yuv444_int8(nv12: np.ndarray) -> np.ndarray:
    return to_int8_128(nv12_to_yuv444(nv12, 224, 224))[None]


def test_run_command_on_nv12_bytes(pplcnet_build, tmp_path, capsys):
    root, _ = pplcnet_build
    out = root / "model_output" / "pplcnet_bpu"
    if not out.exists():
        cli(["build", "--config", str(root / "pplcnet.yaml")])
    np.savez(tmp_path / "x.npz", x=rgb_to_nv12(_pictures()[0]))
    cli(["run", str(out), "--input", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")])
    with np.load(tmp_path / "y.npz") as y:
        assert y["fetch_name_0"].shape == (1, 4) and abs(float(y["fetch_name_0"].sum()) - 1.0) < 0.05
    with pytest.raises(UserError, match="NV12 buffer has 100 bytes, a 224x224 picture needs 75264"):
        detect(out).run(out, {"x": np.zeros(100, np.uint8)}, ArtifactOptions())


def test_inspect_prints_the_contract(pplcnet_build, capsys):
    root, _ = pplcnet_build
    out = root / "model_output" / "pplcnet_bpu"
    if not out.exists():
        cli(["build", "--config", str(root / "pplcnet.yaml")])
    capsys.readouterr()
    cli(["inspect", str(out)])
    text = capsys.readouterr().out
    assert "hbDNN contract  pplcnet  march bernoulli2  quantized model pplcnet_quantized_model.onnx" in text
    assert "x                    IMG_NV12   NCHW  valid 1x3x224x224" in text and "75264 bytes" in text
    assert "nv12 -> rgb (regular), data_mean_and_scale" in text
    assert "fetch_name_0         F32        NONE  valid 1x4" in text


def test_properties_dataclass_is_the_json_record():
    p = TensorProperties("t", (1, 2), (1, 2), "NONE", "F32", aligned_byte_size=8, stride=(8, 4))
    assert contract_from_json(contract_to_json(Contract("n", "bernoulli2", "m.onnx", [p], [p])), "x").inputs == [p]


def test_yaml_config_builds_for_cv18xx(pplcnet_build, capsys):
    """The same hb_mapper config drives a cv18xx build: calibrated from cal_data_dir, int8, runs from bytes."""
    from npuc.backends.cv18xx.container import read_cvimodel
    from npuc.backends.cv18xx.sim import run_cvimodel

    root, config = pplcnet_build
    cli(["build", "--config", str(config), "--target", "cv18xx", "--chip", "cv181x"])
    printed = capsys.readouterr().out
    (path,) = [line.split()[1] for line in printed.splitlines() if line.startswith("wrote ")]
    model = read_cvimodel(path)
    assert model.chip == "cv181x" and model.body.programs[0].routines[0].cpu_routine.function_section == "quant"
    picture = _pictures()[0].transpose(2, 0, 1)[None]
    feed = ((picture - np.reshape(im.IMAGENET_MEAN, (1, 3, 1, 1)) * 255) /
            (np.reshape(im.IMAGENET_STD, (1, 3, 1, 1)) * 255)).astype(np.float32)  # fmt: skip
    (probs,) = run_cvimodel(model, {"x": feed}).values()
    assert probs.shape[:2] == (1, 4) and np.isclose(probs.sum(), 1.0, atol=1e-5)


# ---- the quantized model agrees with npuc's int8 reference ------------------------------------------------


def _reference(model_path, table_path, shapes=None):
    graph = import_onnx(model_path, shapes)
    canonicalize(graph)
    return quantize(graph, thresholds_for_model(graph, read_table(table_path), model_path), "cv18xx_int8")


def test_featuremap_model_is_npuc_int8_bit_for_bit(tmp_path, capsys):
    """Exact form (default): the int8 codes of the output are npuc's, dequantized as q·scale with the
    contract's SCALE. The plain form (qdq_form=plain) agrees to cosine 0.9999."""
    table = GOLDEN / "smallcnn_cali_table.txt"
    qgraph = _reference(GOLDEN / "smallcnn.onnx", table)
    (final,) = [op for op in qgraph.ops if op.outputs == ["output"]]
    feeds = [np.load(GOLDEN / "smallcnn_in.npz")["input"]]
    feeds += [np.load(p)["input"].astype(np.float32) for p in sorted((GOLDEN / "smallcnn_cali_samples").glob("*"))[:5]]
    outputs = {}
    for form in ("exact", "plain"):
        out = tmp_path / form
        cli(["build", str(GOLDEN / "smallcnn.onnx"), "-t", "bpu", "--calib", str(table), "-o", str(out),
             "--option", f"qdq_form={form}"])  # fmt: skip
        c = bpu_artifact.read_contract(out)
        session = qdq_session(str(out / c.model_file))
        outputs[form] = [session.run(None, {"input": x})[0] for x in feeds]
    scale = np.float32(c.outputs[0].scale_data[0]) if c.outputs[0].scale_data else None
    for x, exact, plain in zip(feeds, outputs["exact"], outputs["plain"]):
        ref = run(qgraph, {"input": x}, kernels=QUANT_KERNELS, keep_all=True)
        codes = ref[final.inputs[0]]
        step = np.float32(np.ravel(qgraph.tensors[final.inputs[0]].quant.scale)[0])
        np.testing.assert_array_equal(exact, codes.astype(np.float32) * step)
        assert scale is None or scale == step
        assert cosine(plain, ref["output"]) >= 0.9999 and cosine(exact, ref["output"]) >= 0.99999
    with pytest.raises(SystemExit) as info:
        main(["build", str(GOLDEN / "smallcnn.onnx"), "-t", "bpu", "--calib", str(table), "-o", str(tmp_path / "x"),
              "--option", "qdq_form=fast"])  # fmt: skip
    assert info.value.code == 2 and "--option qdq_form=fast: use one of exact, plain" in capsys.readouterr().err


def test_nv12_model_is_npuc_int8_bit_for_bit(pplcnet_build, real_model):
    """The PP-LCNet nv12 folder's model on 8 camera frames (int8 NHWC, u8 - 128) gives exactly the output of
    npuc's int8 reference fed HzPreprocess of the same pixels (PreprocessAffine.apply)."""
    root, config = pplcnet_build
    out = root / "model_output" / "pplcnet_bpu"
    if not out.exists():
        cli(["build", "--config", str(config)])
    path = real_model("pplcnet_orientation")
    qgraph = _reference(path, root / "model_output" / "pplcnet_cali_table.txt", {"x": (1, 3, 224, 224)})
    affine = load_config(config).inputs[0].affine()
    session = qdq_session(str(out / "pplcnet_quantized_model.onnx"))
    for picture in _pictures()[8:16]:
        pixels = nv12_to_yuv444_int8(rgb_to_nv12(picture))
        ref = run(qgraph, {"x": affine.apply(pixels, channel_axis=-1).transpose(0, 3, 1, 2)}, kernels=QUANT_KERNELS)
        np.testing.assert_array_equal(session.run(None, {"x": pixels})[0], ref["fetch_name_0"])


def test_token_id_inputs_stay_integers(tmp_path):
    """A text encoder's token ids are int64 on the way in (the contract says S64, the quantized model takes
    int64, `npuc run` feeds them as given) and an output passing them through stays integer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    table = numpy_helper.from_array(rng.normal(size=(50, 16)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.normal(size=(16, 4)).astype(np.float32), "weight")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["embedded"]),
        helper.make_node("MatMul", ["embedded", "weight"], ["features"]),
        helper.make_node("Identity", ["ids"], ["ids_out"]),
    ]
    graph = helper.make_graph(
        nodes, "tokens", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 8, 4]),
         helper.make_tensor_value_info("ids_out", TensorProto.INT64, [1, 8])],
        initializer=[table, weight],
    )  # fmt: skip
    model = tmp_path / "tokens.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    data = tmp_path / "data"
    data.mkdir()
    feeds = [{"ids": rng.integers(0, 50, (1, 8), dtype=np.int64)} for _ in range(5)]
    for i, feed in enumerate(feeds[:4]):
        np.savez(data / f"{i}.npz", **feed)
    cli(["calibrate", str(model), "--data", str(data), "--method", "kl", "-o", str(tmp_path / "t.txt")])
    out = tmp_path / "bpu"
    cli(["build", str(model), "-t", "bpu", "--calib", str(tmp_path / "t.txt"), "-o", str(out)])
    c = bpu_artifact.read_contract(out)
    assert [(p.name, p.tensor_type) for p in c.inputs] == [("ids", "S64")]
    assert dict((p.name, p.tensor_type) for p in c.outputs)["ids_out"] == "S64"
    got = detect(out).run(out, feeds[4], ArtifactOptions())
    want = dict(zip(["features", "ids_out"], ort.InferenceSession(str(model)).run(None, feeds[4]), strict=True))
    assert got["ids_out"].dtype == np.int64 and np.array_equal(got["ids_out"], want["ids_out"])
    assert cosine(got["features"], want["features"]) > 0.99
