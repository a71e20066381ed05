"""Tests for compiler/numformats/: rounding, CV18xx QDM, bf16/fp16 bits, asymmetric, BM1880, Horizon."""

from __future__ import annotations

import numpy as np
import pytest

from npuc.compiler.errors import UserError
from npuc.compiler.numformats.affine import AffineParams, asymmetric_params, dequantize_affine, quantize_affine
from npuc.compiler.numformats.bf16_fp16 import (
    bf16_bits_to_float32,
    float32_to_bf16_bits,
    float32_to_fp16_bits,
    fp16_bits_to_float32,
    round_to_bf16,
    round_to_fp16,
)
from npuc.compiler.numformats.bm1880_int8 import (
    bm1880_dequantize_activation,
    bm1880_eltwise_multipliers,
    bm1880_quantize_activation,
    bm1880_quantize_layer,
    bm1880_requant_multiplier,
    bm1880_scale_shift,
    bm1880_shift_requantize,
)
from npuc.compiler.numformats.cv18xx_int8 import (
    cv18xx_apply_multiplier_rshift,
    cv18xx_dequantize_activation,
    cv18xx_eltwise_multipliers,
    cv18xx_per_tensor_multiplier,
    cv18xx_qdm_multiplier,
    cv18xx_qdm_requantize,
    cv18xx_quantize_activation,
    cv18xx_quantize_bias_int32,
    cv18xx_quantize_conv,
)
from npuc.compiler.numformats.gemmlowp import (
    quantize_multiplier,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
)
from npuc.compiler.numformats.horizon_int8 import (
    horizon_scale_dequantize,
    horizon_scale_quantize,
    horizon_shift_dequantize,
    horizon_shift_quantize,
)
from npuc.compiler.numformats.rounding import INT32_MAX, INT32_MIN, round_half_away, round_half_even, round_half_up

RNG = np.random.default_rng(1234)


# ---------------------------------------------------------------------------------------------------------
# rounding


def test_rounding_ties():
    x = np.arange(-5, 5) + 0.5  # -4.5 ... 4.5
    assert round_half_away(x).tolist() == [-5, -4, -3, -2, -1, 1, 2, 3, 4, 5]
    assert round_half_up(x).tolist() == [-4, -3, -2, -1, 0, 1, 2, 3, 4, 5]
    assert round_half_even(x).tolist() == [-4, -4, -2, -2, -0.0, 0, 2, 2, 4, 4]


def test_rounding_no_double_rounding_trap():
    # floor(x + 0.5) rounds 0.49999999999999994 up to 1; the exact helpers must not
    x = np.array([0.49999999999999994, -0.49999999999999994, 0.5000000000000001])
    assert round_half_away(x).tolist() == [0, 0, 1]
    assert round_half_up(x).tolist() == [0, 0, 1]
    x32 = np.array([0.49999997, 2.4999998, -2.4999998], dtype=np.float32)
    assert round_half_away(x32).tolist() == [0, 2, -2]
    assert round_half_up(x32).tolist() == [0, 2, -2]


def test_rounding_matches_python_on_sweep():
    x = np.round(RNG.uniform(-1000, 1000, 20000), 1)  # many exact .5 ties among values on a 0.1 grid
    away = [float(np.sign(v) * np.floor(abs(v) + 0.5)) for v in x]  # safe here: |frac| is 0.1-grid
    assert round_half_away(x).tolist() == away
    assert round_half_even(x).tolist() == [float(round(v)) for v in x]


# ---------------------------------------------------------------------------------------------------------
# CV18xx int8


def test_cv18xx_activation_ties_and_clip():
    x = np.array([2.5, -2.5, 0.5, -0.5, 126.5, 127.4, -128.4, -128.6, 200.0, -300.0, 0.0], dtype=np.float32)
    q = cv18xx_quantize_activation(x, 127.0)  # scale exactly 1
    assert q.dtype == np.int8
    assert q.tolist() == [3, -3, 1, -1, 127, 127, -128, -128, 127, -128, 0]
    deq = cv18xx_dequantize_activation(np.array([127, -128], np.int8), 4.0)
    assert deq.dtype == np.float32 and deq.tolist() == [4.0, float(np.float32(-128) * np.float32(4 / 127))]
    with pytest.raises(UserError, match="threshold"):
        cv18xx_quantize_activation(x, 0.0)


def test_quantize_multiplier_known_values():
    real = np.array([0.5, 0.25, 1.0, 0.75, 0.0, 2.0**-40, 1 - 2.0**-40, 3.0 * 2**35])
    m, s = quantize_multiplier(real)
    assert m.tolist() == [1 << 30, 1 << 30, 1 << 30, 3 << 29, 0, 0, 1 << 30, INT32_MAX]
    assert s.tolist() == [0, -1, 1, 0, 0, 0, 1, 30]


def test_quantize_multiplier_accuracy_sweep():
    real = np.exp(RNG.uniform(np.log(1e-6), np.log(0.999), 5000))
    m, s = quantize_multiplier(real)
    assert ((m >= 1 << 30) & (m < 1 << 31)).all()
    back = m * np.ldexp(1.0, (s - 31).astype(np.int32))
    assert np.all(np.abs(back - real) <= real * 2.0**-30)


def test_cv18xx_qdm_multiplier_clamps_at_one():
    m, r = cv18xx_qdm_multiplier(np.array([1.0, 5.0, 0.5, 0.001]))
    assert m[:2].tolist() == [round(0.999999 * 2**31)] * 2 and r[:2].tolist() == [0, 0]
    assert (m[2], r[2]) == (1 << 30, 0)  # 0.5 = 2^30 · 2^-31
    assert r[3] == 9 and m[3] == round(0.001 * 2**9 * 2**31)


def _srdhm_ref(a: int, b: int) -> int:
    if a == b == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    v = ab + nudge
    q = abs(v) // (1 << 31)
    return q if v >= 0 else -q


def _rdbpot_ref(x: int, e: int) -> int:
    mask = (1 << e) - 1
    return (x >> e) + ((x & mask) > ((mask >> 1) + (x < 0)))


def test_srdhm_and_rdbpot_against_reference():
    ints = np.concatenate(
        [
            RNG.integers(INT32_MIN, INT32_MAX, 3000, endpoint=True),
            [INT32_MIN, INT32_MAX, 0, 1, -1],
        ]
    )
    a, b = ints, np.roll(ints, 7)
    got = saturating_rounding_doubling_high_mul(a, b)
    assert got.tolist() == [_srdhm_ref(int(x), int(y)) for x, y in zip(a, b, strict=True)]
    assert saturating_rounding_doubling_high_mul(INT32_MIN, INT32_MIN) == INT32_MAX
    e = RNG.integers(0, 32, ints.size)
    assert rounding_divide_by_pot(ints, e).tolist() == [
        _rdbpot_ref(int(x), int(k)) for x, k in zip(ints, e, strict=True)
    ]
    # ties away from zero
    assert rounding_divide_by_pot(np.array([5, -5, 4, -3, 3, 7]), 1).tolist() == [3, -3, 2, -2, 2, 4]
    with pytest.raises(UserError):
        rounding_divide_by_pot(1, 32)


def test_cv18xx_qdm_requantize_pipeline():
    m, r = cv18xx_qdm_multiplier(0.05)
    y = cv18xx_qdm_requantize(np.array([1000, -1000, 10, -10, 5000, -5000, 30, -30]), m, r)
    assert y.dtype == np.int8
    assert y.tolist() == [50, -50, 1, -1, 127, -128, 2, -2]  # 0.5 -> 1 and 1.5 -> 2 round away from zero
    assert cv18xx_qdm_requantize(np.array([-1000, 1000]), m, r, relu=True).tolist() == [0, 50]


def test_cv18xx_conv_quant_matches_float_conv():
    oc, ic = 8, 27
    w = RNG.normal(0, 0.2, (oc, ic)).astype(np.float32)
    b = RNG.normal(0, 0.5, oc).astype(np.float32)
    x = RNG.normal(0, 1, (200, ic)).astype(np.float32)
    th_x = float(np.abs(x).max())
    y = x @ w.T + b
    th_y = float(np.abs(y).max())
    p = cv18xx_quantize_conv(w, b, th_x, th_y)
    assert p.weight.dtype == np.int8 and p.bias.dtype == np.int32
    assert np.abs(p.weight.astype(np.int32)).max(axis=1).tolist() == [127] * oc  # ≈ round(127·W/max|W_c|)
    assert ((p.multiplier >= 1 << 30) & (p.multiplier < 1 << 31)).all() and (p.rshift > 0).all()
    acc = cv18xx_quantize_activation(x, th_x).astype(np.int64) @ p.weight.astype(np.int64).T + p.bias
    y_q = cv18xx_qdm_requantize(acc, p.multiplier, p.rshift)
    y_ref = cv18xx_quantize_activation(y, th_y).astype(np.int32)
    assert np.abs(y_q.astype(np.int32) - y_ref).max() <= 2
    assert np.mean(y_q == y_ref) > 0.6


def test_cv18xx_conv_bias_qscale_override_and_clamp():
    w = np.full((2, 4), 0.01, dtype=np.float32)
    b = np.array([1e7, 0.0], dtype=np.float32)  # bias too big for int32 at the filter qscale
    p = cv18xx_quantize_conv(w, b, 1.0, 1.0)
    expected = float(np.float32(1e7) * np.float32(127.0) / (np.float32(INT32_MAX) * np.float32(1.0)))
    assert p.qscale[0] == pytest.approx(expected, rel=1e-7)
    assert abs(int(p.bias[0]) - INT32_MAX) < 1000  # the bias fills int32 (saturating at most)
    assert p.weight[0].tolist() == [0, 0, 0, 0] and p.weight[1].tolist() == [127] * 4
    big = cv18xx_quantize_conv(np.full((1, 4), 10.0, np.float32), None, 10.0, 0.1)
    assert big.qscale.tolist() == [0.999999] and big.rshift.tolist() == [0]
    assert big.weight.tolist() == [[127, 127, 127, 127]]  # clamped qscale saturates the weights


def test_cv18xx_per_tensor_multiplier():
    m, r = cv18xx_per_tensor_multiplier(np.array([0.3, 200.0, 0.0, 1.0, 0.5]))
    assert m.tolist() == [76, 127, 0, 64, 64]
    assert r.tolist() == [8, 0, 0, 6, 7]
    m255, r255 = cv18xx_per_tensor_multiplier(0.3, 255)
    assert (int(m255), int(r255)) == (153, 9)


def test_cv18xx_eltwise_and_apply():
    m, r = cv18xx_eltwise_multipliers(np.array([2.0, 4.0]), 4.0)
    assert (m.tolist(), r) == ([32, 64], 6)
    m, r = cv18xx_eltwise_multipliers(np.array([2.0, 4.0]), 4.0, coeffs=np.array([1.0, -1.0]))
    assert (m.tolist(), r) == ([32, -64], 6)
    v = np.array([3, -3, 5, -5, 100])
    assert cv18xx_apply_multiplier_rshift(v, 1, 1).tolist() == [2, -1, 3, -2, 50]  # half up
    assert cv18xx_apply_multiplier_rshift(v, 3, 0).tolist() == [9, -9, 15, -15, 300]
    assert cv18xx_quantize_bias_int32(np.array([1.5, 2.5, -1e12]), 1.0).tolist() == [2, 2, INT32_MIN]


# ---------------------------------------------------------------------------------------------------------
# bf16 / fp16


def _bits(u32: list[int]) -> np.ndarray:
    return np.array(u32, dtype=np.uint32).view(np.float32)


def test_bf16_bit_patterns():
    x = _bits([0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x7FC00001, 0x7F800000, 0xFF800000,
               0x7F7FFFFF, 0xFF7FFFFF, 0x80000000, 0x00008000, 0x00018000, 0xC0490FDB])  # fmt: skip
    expected = [
        0x3F80,
        0x3F80,
        0x3F82,
        0x3F81,
        0x7FC0,
        0x7F7F,
        0x7F7F,
        0x7F7F,
        0x7F7F,
        0x8000,
        0x0000,
        0x0002,
        0xC049,
    ]
    assert float32_to_bf16_bits(x).tolist() == expected
    ieee = float32_to_bf16_bits(x, cv18xx_overflow=False).tolist()
    assert ieee[5:9] == [0x7F80, 0xFF80, 0x7F80, 0xFF80]
    assert bf16_bits_to_float32(np.array([0x3F80, 0xC049], np.uint16)).view(np.uint32).tolist() == [
        0x3F800000,
        0xC0490000,
    ]


def test_bf16_exhaustive_roundtrip_and_random_reference():
    all_bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    back = float32_to_bf16_bits(bf16_bits_to_float32(all_bits))
    special = (all_bits & 0x7F80) == 0x7F80  # inf / nan patterns
    assert (back[~special] == all_bits[~special]).all()
    nan = special & ((all_bits & 0x7F) != 0)
    assert set(back[nan].tolist()) == {0x7FC0} and set(back[special & ~nan].tolist()) == {0x7F7F}
    u = RNG.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32)
    ref = []
    for v in u.tolist():
        if (v & 0x7F800000) == 0x7F800000 and v & 0x7FFFFF:
            ref.append(0x7FC0)
            continue
        hi, lo = v >> 16, v & 0xFFFF
        hi += lo > 0x8000 or (lo == 0x8000 and hi & 1)
        ref.append(0x7F7F if (hi & 0x7F80) == 0x7F80 else hi & 0xFFFF)
    assert float32_to_bf16_bits(u.view(np.float32)).tolist() == ref


def test_fp16_helpers():
    x = np.array([1.0, 65504.0, 65520.0, 1 / 3, -2.0, 2.0**-24, 2.0**-26], dtype=np.float32)
    assert float32_to_fp16_bits(x).tolist() == [0x3C00, 0x7BFF, 0x7C00, 0x3555, 0xC000, 0x0001, 0x0000]
    finite = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = finite[(finite & 0x7C00) != 0x7C00]
    assert (float32_to_fp16_bits(fp16_bits_to_float32(finite)) == finite).all()
    assert round_to_fp16(np.float32(1 + 2**-11)).item() == 1.0  # tie to even
    assert round_to_bf16(np.float32(1 + 2**-8)).item() == 1.0


# ---------------------------------------------------------------------------------------------------------
# asymmetric


def test_asymmetric_uint8_and_int8():
    p = asymmetric_params(-1.0, 3.0, "uint8")
    assert (p.zero_point, p.qmin, p.qmax) == (64, 0, 255) and p.scale == np.float32(4 / 255)
    q = quantize_affine(np.array([-1.0, 3.0, 0.0, 10.0, -5.0], np.float32), p)
    assert q.dtype == np.uint8 and q.tolist() == [0, 255, 64, 255, 0]
    assert dequantize_affine(np.array([64], np.uint8), p).tolist() == [0.0]
    s = asymmetric_params(0.5, 2.0, "int8")  # range widened to include 0
    assert s.zero_point == -128 and s.scale == np.float32(2.0 / 255)
    half = AffineParams(1.0, 0, -128, 127)
    assert quantize_affine(np.array([0.5, 1.5, 2.5, -0.5]), half).tolist() == [0, 2, 2, 0]  # ties to even
    assert asymmetric_params(0.0, 0.0, "uint8").scale == 1.0
    with pytest.raises(UserError):
        asymmetric_params(0, 1, "int4")


# ---------------------------------------------------------------------------------------------------------
# BM1880


def test_bm1880_activation_rounding():
    x = np.array([2.5, -2.5, 1.5, -1.5, 127.4, 127.5, -128.5, -129.0], dtype=np.float32)
    q = bm1880_quantize_activation(x, 128.0)  # x·128/T == x
    assert q.tolist() == [3, -2, 2, -1, 127, 127, -128, -128]  # floor(v + 0.5)
    assert bm1880_dequantize_activation(np.array([64], np.int8), 2.0).tolist() == [1.0]


def test_bm1880_scale_shift_rule():
    m, r = bm1880_scale_shift(np.array([1.0, 0.1, 64.0, 100.0, 63.9, 0.0, 0.5]))
    assert r.tolist() == [6, 10, 0, 0, 1, 0, 7]
    assert m.tolist() == [64, 102, 64, 100, 128, 0, 64]
    with pytest.raises(UserError, match="128"):
        bm1880_scale_shift(128.0)


def test_bm1880_layer_and_requant():
    w = np.array([[0.5, -0.25], [0.125, 0.0]], dtype=np.float32)
    q = bm1880_quantize_layer(w, np.array([0.01, -0.02], np.float32), 1.0, 1.0)
    assert q.rshift == 7  # 0.5·2^7 = 64
    assert q.weight.tolist() == [[64, -32], [16, 0]]
    assert q.bias.tolist() == [round(0.01 * 128 * 128), round(-0.02 * 128 * 128)]
    assert bm1880_requant_multiplier(1.0, 1.0) == (128, 7)
    assert bm1880_requant_multiplier(2.0, 1.0) == (128, 6)
    m, r = bm1880_eltwise_multipliers(np.array([1.0, 2.0]), 2.0)
    assert (m.tolist(), r) == ([64, 128], 7)  # r = min of the per-input shifts 8 and 7
    assert bm1880_shift_requantize(np.array([383, -383, 40000, -1]), 1).tolist() == [127, -128, 127, 0]


# ---------------------------------------------------------------------------------------------------------
# Horizon


def test_horizon_shift():
    x = np.array([0.25, 0.75, -0.25, -0.75, 100.0, -100.0], dtype=np.float32)
    assert horizon_shift_quantize(x, 1).tolist() == [0, 2, 0, -2, 127, -128]  # nearbyint ties to even
    assert horizon_shift_quantize(x, 1, "u8").tolist() == [0, 2, 0, 0, 200, 0]
    assert horizon_shift_dequantize(np.array([3, -3], np.int8), 2).tolist() == [0.75, -0.75]
    per_axis = horizon_shift_quantize(np.ones((2, 3), np.float32), np.array([0, 1, 2]), axis=1)
    assert per_axis.tolist() == [[1, 2, 4], [1, 2, 4]]


def test_horizon_scale():
    x = np.array([0.5, 1.5, 2.5, -0.5, 1000.0], dtype=np.float32)
    assert horizon_scale_quantize(x, 1.0).tolist() == [0, 2, 2, 0, 127]
    assert horizon_scale_quantize(x, 0.5, 10, "u8").tolist() == [11, 13, 15, 9, 255]
    assert horizon_scale_dequantize(np.array([11, 13], np.uint8), 0.5, 10).tolist() == [0.5, 1.5]
    per_axis = horizon_scale_quantize(np.ones((3, 2), np.float32), np.array([0.5, 0.25, 1.0]), axis=0)
    assert per_axis.tolist() == [[2, 2], [4, 4], [1, 1]]
    with pytest.raises(UserError):
        horizon_scale_quantize(x, 1.0, dtype="s16")


def test_wrap_int32_is_a_32_bit_accumulator() -> None:
    from npuc.compiler.numformats.rounding import INT32_MAX, INT32_MIN, wrap_int32

    x = np.array([0, 5, -5, INT32_MAX, INT32_MIN, INT32_MAX + 1, INT32_MAX + 64516, INT32_MIN - 1, 3 << 33], np.int64)
    want = np.array([0, 5, -5, INT32_MAX, INT32_MIN, INT32_MIN, INT32_MIN + 64515, INT32_MAX, 0], np.int64)
    np.testing.assert_array_equal(wrap_int32(x), want)
    np.testing.assert_array_equal(wrap_int32(x), x.astype(np.int32).astype(np.int64))  # two's complement
