"""CV18xx simulator: tpu-mlir's int8 cvimodels run from their bytes reproduce the vendor simulator bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from golden import GOLDEN_ROOT

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import load_program, run_cvimodel, tensor_view
from npuc.backends.cv18xx.sim_cpu import cpu_quant
from npuc.backends.cv18xx.sim_tiu import (
    bf16_to_f32,
    f32_to_bf16,
    qdm,
    round_shift,
    saturating_rounding_doubling_high_mul,
)

GOLDEN = GOLDEN_ROOT / "cv18xx"
INT8_STEMS = ["smallcnn_cv183x_int8", "smallcnn_cv182x_int8", "smallcnn_cv181x_int8", "smallcnn_cv180x_int8"]


@pytest.fixture(scope="module")
def vendor_outputs() -> dict[str, np.ndarray]:
    with np.load(GOLDEN / "smallcnn_vendor_sim_outputs.npz") as d:
        return {k: d[k] for k in d.files}


@pytest.fixture(scope="module")
def model_input() -> np.ndarray:
    with np.load(GOLDEN / "smallcnn_in.npz") as d:
        return d["input"]


@pytest.mark.parametrize("stem", INT8_STEMS)
def test_int8_golden_matches_vendor_simulator_bit_exactly(
    stem: str, vendor_outputs: dict[str, np.ndarray], model_input: np.ndarray
) -> None:
    out = run_cvimodel(read_cvimodel(GOLDEN / f"{stem}.cvimodel"), {"input": model_input})
    assert list(out) == ["output_Gemm_f32"]
    got, want = out["output_Gemm_f32"], vendor_outputs[stem]
    assert got.shape == (1, 10, 1, 1) and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # the int8 logits times the bf16 output scale 3/256
    assert (want.ravel() * 256 / 3).round().astype(int).tolist() == [
        78,
        -29,
        -12,
        14,
        46,
        -48,
        59,
        69,
        -122,
        39,
    ]


def test_cpu_quant_rounds_half_away_from_zero() -> None:
    x = np.array([0.5, -0.5, 1.5, -1.5, 2.49, 200.0, -200.0, 0.0], np.float32)
    (got,) = cpu_quant({"from": "FP32", "to": "INT8", "scale": 1.0}, [x], [(np.dtype(np.int8), x.shape)])
    assert got.tolist() == [1, -1, 2, -2, 2, 127, -128, 0]


def test_fixed_point_helpers() -> None:
    acc = np.array([1000, -1000, 12345, -(1 << 31), 7], np.int64)
    # (2 * acc * m + nudge) >> 32 with m = 2^30 is acc / 2 rounded half away from zero
    assert saturating_rounding_doubling_high_mul(acc, 1 << 30).tolist() == [500, -500, 6173, -(1 << 30), 4]
    assert saturating_rounding_doubling_high_mul(np.array([-(1 << 31)]), -(1 << 31)).tolist() == [(1 << 31) - 1]
    assert qdm(np.array([100, -100, 101, -101]), 1 << 30, 2).tolist() == [13, -13, 13, -13]
    assert round_shift(np.array([5, -5, 6, -6, 7]), 1).tolist() == [3, -2, 3, -3, 4]


def test_bf16_rounding() -> None:
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.nan, 3.4e38, -3.4e38], np.float32)
    assert f32_to_bf16(values).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7FC0, 0x7F7F, 0x7F7F]


@pytest.mark.parametrize("stem", ["smallcnn_cv183x_bf16", "smallcnn_cv181x_bf16"])
def test_bf16_models_reproduce_vendor_outputs(stem: str, model_input: np.ndarray) -> None:
    """bf16 files (their FC weights are VLC-compressed) give the vendor simulator's output exactly, and the
    global average pool on the way tracks the float model."""
    import onnx
    import onnxruntime as ort

    onnx_model = onnx.load(GOLDEN / "smallcnn.onnx")
    onnx_model.graph.output.append(onnx.helper.make_tensor_value_info("gap_39", onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    gap_ref = session.run(["gap_39"], {"input": model_input})[0].ravel()

    model = read_cvimodel(GOLDEN / f"{stem}.cvimodel")
    machine = load_program(model, {"input": model_input})
    machine.run_cmdbuf(model.sections["subfunc_0"], stem)
    gap_t = next(t for t in model.body.programs[0].tensor_map if t.name == "gap_39_GlobalAveragePool")
    gap = bf16_to_f32(tensor_view(machine.gmem, gap_t)).ravel()
    assert np.abs(gap - gap_ref).max() < 0.02 * np.abs(gap_ref).max()
    assert np.corrcoef(gap, gap_ref)[0, 1] > 0.999

    (value,) = run_cvimodel(model, {"input": model_input}).values()
    value = bf16_to_f32(value) if value.dtype == np.uint16 else value.astype(np.float32)
    vendor = np.load(GOLDEN / "smallcnn_vendor_sim_outputs.npz")[stem]
    np.testing.assert_array_equal(value.reshape(-1), vendor.reshape(-1))


def test_exponent_index_move_maps_powers_of_two_and_refuses_the_unknown() -> None:
    """`mv_lut_idx`: 1.0 -> 63, 2^k -> 63 + k, the sign in bit 7 (tpu-mlir's reciprocal tables); zero has no
    known index and is an error, not a guess."""
    from npuc.backends.cv18xx.sim import _exponent_index
    from npuc.backends.cv18xx.sim_tiu import f32_to_bf16
    from npuc.compiler.errors import UnsupportedError

    bits = f32_to_bf16(np.array([1.0, 1.5, 4.0, 0.25, -1.0, 2.0**62, 2.0**-63], np.float32))
    assert _exponent_index(bits).tolist() == [63, 63, 65, 61, 128 + 63, 125, 0]
    with pytest.raises(UnsupportedError, match="lookup-index move of 0"):
        _exponent_index(f32_to_bf16(np.array([0.0], np.float32)))
