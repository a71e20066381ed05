"""Per-channel power-of-two weight gains for BM1880 conv/FC/depthwise (build option weight_scale=channel).

BMNet gives a layer one right shift r, so a channel whose weights are 2^k times smaller than the layer's
largest keeps k fewer bits; in BN-folded depthwise convs (PP-LCNet) that costs most of the accuracy. With
gains, channel c's weights and bias are scaled by 2^k_c more (k_c <= 7, and lower where its 16-bit bias would
saturate); the conv BD writes `acc >> r` as 16 bits, then a multiply by the unsigned byte 2^(7-k_c), shifted
right 7 (round half up), gives the int8 output. Both are BDs the target already runs.

BMNet's rule takes the layer's right shift from its weights alone, so a large bias (a detector's class-score
conv: B = -10 where Ty = 14.6) saturates its 16 bits and shifts every output (YOLOv8n's class logits by +6).
Here the shift is lowered until every bias fits, and the gains give the channels back the doublings the lower
shift took where their bias leaves room.

A layer whose weights exceed int8 even unshifted (max|W|·Tx/Ty >= 128, where BMNet's rule has no shift to
give: PicoDet's stem convs) is quantized at 2^-s of its scale and the gain step shifts right by 7 - s, not 7.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.numformats.bm1880_int8 import bm1880_quantize_layer
from npuc.compiler.numformats.rounding import round_half_up, saturate

MAX_GAIN_SHIFT = 7  # the u8 multiplier 2^(7-k) stays in 1..128


class GainQuant(NamedTuple):
    """A conv/FC/depthwise layer's integers: y = ((acc + bias) >> rshift) * gains[c] >> gain_shift."""

    weight: np.ndarray  # int8
    bias: np.ndarray | None  # int16
    rshift: int
    gains: np.ndarray | None  # u8 2^(7-k) per output channel; None: no gain step (y = sat8(... >> rshift))
    gain_shift: int = MAX_GAIN_SHIFT


def bias_room(bias: np.ndarray | None, ty: float, rshift: int | np.ndarray) -> np.ndarray | None:
    """Per output channel, how many doublings its 16-bit bias B·(128/Ty)·2^rshift takes before it saturates
    (negative: it saturates already); None without a bias."""
    if bias is None:
        return None
    b = np.abs(np.asarray(bias, np.float64)) * (128.0 / ty) * np.ldexp(1.0, np.asarray(rshift, np.int32))
    with np.errstate(divide="ignore"):
        return np.floor(np.log2(32767.0 / np.maximum(b, 1e-30))).astype(np.int64)


def gain_shifts(
    weight: np.ndarray, bias: np.ndarray | None, tx: float, ty: float, rshift: int, lowered: int = 0
) -> np.ndarray:
    """k_c per output channel: as many doublings as bring its largest weight toward the layer's largest (plus
    the `lowered` ones the bias took off the layer's shift), no more than the 16-bit bias allows."""
    w = np.abs(np.asarray(weight, np.float64)).reshape(weight.shape[0], -1).max(axis=1)
    top = w.max()
    with np.errstate(divide="ignore"):
        k = np.floor(np.log2(top / np.maximum(w, top * 2.0**-MAX_GAIN_SHIFT))) + lowered
    room = bias_room(bias, ty, rshift)
    if room is not None:
        k = np.minimum(k, room)
    return np.clip(k, 0, MAX_GAIN_SHIFT).astype(np.int64)


def apply_gains(weight: np.ndarray, bias: np.ndarray | None, tx: float, ty: float) -> GainQuant:
    """The integers of a conv/FC/depthwise layer with per-channel gains (none where every k is 0)."""
    peak = float(np.abs(np.asarray(weight, np.float64)).max()) * tx / ty
    down = max(0, int(np.ceil(np.log2(peak / 127.0)))) if peak > 0 else 0  # s: doublings above int8 at shift 0
    if down > MAX_GAIN_SHIFT:
        raise UserError(f"bm1880 conv/fc weight: scaled value {peak:.6g} is beyond what a gain can restore "
                        "(2^7); raise the output threshold")  # fmt: skip
    if down:
        weight = np.asarray(weight, np.float32) * np.float32(2.0**-down)
        bias = None if bias is None else np.asarray(bias, np.float32) * np.float32(2.0**-down)
    q = bm1880_quantize_layer(weight, bias, tx, ty)
    room = bias_room(bias, ty, q.rshift)
    r = q.rshift + min(0, int(room.min())) if room is not None else q.rshift
    if r < 0:
        raise UserError(f"bm1880 conv/fc bias reaches {np.abs(bias).max():.4g}: at output threshold {ty:.4g} it "
                        "does not fit 16 bits at any shift; raise the output threshold")  # fmt: skip
    k = gain_shifts(weight, bias, tx, ty, r, lowered=q.rshift - r)
    if not k.any() and r == q.rshift and not down:
        return GainQuant(q.weight, q.bias, q.rshift, None)
    shape = (-1,) + (1,) * (np.ndim(weight) - 1)
    scale = np.float32(tx / ty) * np.ldexp(np.float32(1.0), r + k).astype(np.float32)
    w = saturate(round_half_up(np.asarray(weight, np.float32) * scale.reshape(shape)), np.int8)
    b = None
    if bias is not None:
        pot = np.ldexp(np.float32(1.0), r + k).astype(np.float32)
        b = saturate(round_half_up(np.asarray(bias, np.float32) * (np.float32(128.0) / np.float32(ty)) * pot),
                     np.int16)  # fmt: skip
    return GainQuant(w, b, r, (1 << (MAX_GAIN_SHIFT - k)).astype(np.uint8), MAX_GAIN_SHIFT - down)
