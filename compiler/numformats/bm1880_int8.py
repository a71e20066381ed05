"""BM1880 int8 with per-layer power-of-two shifts (bm1880.md §3.2): activations at 128/threshold, one right
shift per conv/FC layer, 8-bit requant multipliers for pool and eltwise, the rounding shift of a conv output."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.numformats.cv18xx_int8 import cv18xx_apply_multiplier_rshift
from npuc.compiler.numformats.rounding import round_half_up, saturate
from npuc.compiler.numformats.thresholds import as_f32, check_threshold

BM1880_TARGET = 64.0  # scaled |max| must reach [64, 128)


def bm1880_quantize_activation(x: np.ndarray, threshold: float) -> np.ndarray:
    """float -> int8: `sat8(floor(x·128/T + 0.5))`."""
    t = check_threshold(threshold, "bm1880 activation")
    return saturate(round_half_up(np.asarray(x, dtype=np.float64) * (128.0 / float(t))), np.int8)


def bm1880_dequantize_activation(q: np.ndarray, threshold: float) -> np.ndarray:
    """int8 -> float32: `q·T/128`."""
    return np.asarray(q, dtype=np.float32) * (check_threshold(threshold, "bm1880 activation") / as_f32(128.0))


def bm1880_scale_shift(value: np.ndarray, what: str = "bm1880 scale") -> tuple[np.ndarray, np.ndarray]:
    """Smallest r >= 0 with `|value|·2^r >= 64` and `m = round_half_up(value·2^r)`; value 0 -> (0, 0).

    Used for conv/FC weights (value = max|W|·Tx/Ty) and ReLU slopes (gt/le scale). |value| >= 128 at r = 0
    cannot be represented and is a UserError.
    """
    v = np.asarray(value, dtype=np.float64)
    if np.any(np.abs(v) >= 128.0):
        raise UserError(
            f"{what}: scaled value {np.abs(v).max():.6g} >= 128 cannot use a right shift; raise the output threshold"
        )
    r = np.arange(32, dtype=np.int64)
    ok = np.abs(v)[..., None] * np.ldexp(1.0, r.astype(np.int32)) >= BM1880_TARGET
    rshift = np.where(ok.any(axis=-1), ok.argmax(axis=-1), 0)
    m = round_half_up(v * np.ldexp(1.0, rshift.astype(np.int32))).astype(np.int64)
    return m, rshift


@dataclass(frozen=True)
class Bm1880LayerQuant:
    """BM1880 conv/FC: int8 weight, int16 bias, one right shift for the layer."""

    weight: np.ndarray  # int8
    bias: np.ndarray | None  # int16
    rshift: int


def bm1880_quantize_layer(
    weight: np.ndarray, bias: np.ndarray | None, threshold_x: float, threshold_y: float
) -> Bm1880LayerQuant:
    """One rshift `r` from `max|W|·Tx/Ty`; `Wq = sat8(floor(W·(Tx/Ty)·2^r + 0.5))`,
    `Bq = sat16(floor(B·(128/Ty)·2^r + 0.5))`.

    Arithmetic is float32 like the vendor calibration tool (its weights and thresholds are C floats).
    """
    w = np.asarray(weight, dtype=np.float32)
    tx = check_threshold(threshold_x, "bm1880 layer input")
    ty = check_threshold(threshold_y, "bm1880 layer output")
    ratio = tx / ty
    _, r = bm1880_scale_shift(np.abs(w).max() * ratio, "bm1880 conv/fc weight")
    pot = as_f32(np.ldexp(1.0, int(r)))
    w_q = saturate(round_half_up(w * ratio * pot), np.int8)
    b_q = None
    if bias is not None:
        b_q = saturate(round_half_up(np.asarray(bias, dtype=np.float32) * (as_f32(128.0) / ty) * pot), np.int16)
    return Bm1880LayerQuant(w_q, b_q, int(r))


def bm1880_requant_multiplier(threshold_x: float, threshold_y: float) -> tuple[int, int]:
    """Pool/requant Tx -> Ty: smallest r with `2^(r+1) >= 256·Ty/Tx`, `m = round(Tx/Ty·2^r)` in [128, 255]."""
    tx = float(check_threshold(threshold_x, "bm1880 requant input"))
    ty = float(check_threshold(threshold_y, "bm1880 requant output"))
    r = np.arange(32)
    ok = np.ldexp(1.0, (r + 1).astype(np.int32)) >= 256.0 * ty / tx
    if not ok.any():
        raise UserError(f"bm1880 requant {tx} -> {ty}: ratio too small for an 8-bit multiplier; check the thresholds")
    rshift = int(ok.argmax())
    m = int(min(round_half_up(tx / ty * np.ldexp(1.0, rshift)), 255))
    return m, rshift


def bm1880_eltwise_multipliers(thresholds_in: np.ndarray, threshold_out: float) -> tuple[np.ndarray, int]:
    """Eltwise: r = min over inputs of their requant shifts, `m_i = round(Tx_i/Ty·2^r)`."""
    th_in = np.atleast_1d(np.asarray(thresholds_in, dtype=np.float64))
    shifts = [bm1880_requant_multiplier(t, threshold_out)[1] for t in th_in]  # few inputs per op
    r = min(shifts)
    m = round_half_up(th_in / float(as_f32(threshold_out)) * np.ldexp(1.0, r)).astype(np.int64)
    return np.minimum(m, 255), r


def bm1880_shift_requantize(acc: np.ndarray, rshift: int, relu: bool = False) -> np.ndarray:
    """BM1880 conv output: `sat8(acc >> r)` with round-half-up shift (ReLU before the shift)."""
    a = np.asarray(acc, dtype=np.int64)
    if relu:
        a = np.maximum(a, 0)
    return saturate(cv18xx_apply_multiplier_rshift(a, 1, rshift), np.int8)
