"""Rounding-aware placement of refitted weights on the cv18xx int8 grid (GPTQ / OBQ style).

A layer's fit is the quadratic `q(θ) = ‖Aθ − y‖² + λ‖θ − prior‖²` over θ = [weights; bias]
(passes/calibration/refine.py), so with H = AᵀA + λI and θ* its minimiser, the cost of any θ is q(θ*) + (θ − θ*)ᵀH(θ −
θ*). The weights go on their grid one input row at a time; each row's rounding error is pushed onto the rows not yet
placed through the upper Cholesky factor U of H⁻¹ (H⁻¹ = UᵀU), which is the exact least-squares compensation,
and the bias row (last, never rounded: it is int32) absorbs what is left. Rows are placed in order of
decreasing H diagonal (the inputs with most energy first, GPTQ's "act order").

The grid must be the one `passes.quantization.quantize` derives again from the float weights: scale = max|w| / 127 per
output channel (conv) or per tensor (FC). So the element that sets the scale is placed at exactly ±127
(its "anchor"), and every other code is clipped to [−127, 127]; the saved float weights then re-quantize to
the same codes. The scale itself is a clip ratio r of the refitted weights' max |w|, chosen per scale group
from `CLIP_RATIOS` by the final cost (θ − θ*)ᵀH(θ − θ*), all candidates run as one batch.

Arrays are batched over independent systems S (depthwise: one per channel; dense: one shared system):
H (S, n, n), θ* (S, n, O) with the bias in row n − 1.
"""

from __future__ import annotations

import numpy as np

CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.7)
QMAX = 127.0


def _upper_inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """U (S, n, n) upper triangular with H⁻¹ = UᵀU."""
    n = h.shape[-1]
    # H is symmetric positive definite (ridge > 0); a relative jitter keeps the factorisation stable
    jitter = 1e-10 * np.trace(h, axis1=-2, axis2=-1)[:, None, None] / n * np.eye(n)
    inv = np.linalg.inv(h + jitter)
    inv = 0.5 * (inv + np.swapaxes(inv, -1, -2))
    return np.swapaxes(np.linalg.cholesky(inv), -1, -2)


def _anchors(theta: np.ndarray, per_tensor: bool) -> np.ndarray:
    """Boolean (S, n−1, O): the weight that sets each scale group's max |w|."""
    mag = np.abs(theta[:, :-1, :])
    if per_tensor:  # one group per system: its largest element
        flat = mag.reshape(mag.shape[0], -1)
        mask = np.zeros_like(flat, dtype=bool)
        mask[np.arange(len(flat)), flat.argmax(axis=1)] = True
        return mask.reshape(mag.shape)
    top = mag.argmax(axis=1)  # (S, O)
    return np.arange(mag.shape[1])[None, :, None] == top[:, None, :]


def place_on_grid(h: np.ndarray, theta: np.ndarray, scale: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """θ (S, n, O) with rows 0..n−2 on the grid `scale` (S, O) — each anchor at ±127·scale — and the rounding
    error compensated through H (S, n, n); row n−1 (bias) stays float."""
    s, n, _ = theta.shape
    order = np.argsort(-np.diagonal(h, axis1=1, axis2=2)[:, :-1], axis=1, kind="stable")
    order = np.concatenate([order, np.full((s, 1), n - 1)], axis=1)  # the bias row last
    hp = np.take_along_axis(np.take_along_axis(h, order[:, :, None], axis=1), order[:, None, :], axis=2)
    w = np.take_along_axis(theta, order[:, :, None], axis=1).copy()
    forced = np.take_along_axis(anchor, order[:, :-1, None], axis=1)
    sign = np.where(np.take_along_axis(theta, order[:, :, None], axis=1)[:, :-1] < 0, -1.0, 1.0)
    u = _upper_inverse_cholesky(hp)
    for i in range(n - 1):  # sequential by nature: each row sees the compensation of the earlier ones
        codes = np.clip(np.rint(w[:, i] / scale), -QMAX, QMAX)
        codes = np.where(forced[:, i], sign[:, i] * QMAX, codes)
        q = codes * scale
        err = (w[:, i] - q) / u[:, i, i][:, None]
        w[:, i + 1 :] -= u[:, i, i + 1 :, None] * err[:, None, :]
        w[:, i] = q
    out = np.empty_like(w)
    np.put_along_axis(out, order[:, :, None], w, axis=1)
    return out


def quadratic_cost(h: np.ndarray, theta: np.ndarray, target: np.ndarray) -> np.ndarray:
    """(θ − θ*)ᵀH(θ − θ*) per (system, output): (S, O)."""
    e = theta - target
    return np.einsum("sio,sij,sjo->so", e, h, e)


def round_refit(h: np.ndarray, theta: np.ndarray, per_tensor: bool) -> np.ndarray:
    """The refitted θ* (S, n, O) placed on the int8 grid with error compensation, at the best clip ratio of each
    scale group (per output channel, or per system when `per_tensor`)."""
    s, n, o = theta.shape
    peak = np.abs(theta[:, :-1, :]).max(axis=(1, 2) if per_tensor else 1, keepdims=True)[:, 0]  # (S, O) or (S, 1)
    peak = np.broadcast_to(np.maximum(peak, 1e-30), (s, o))
    r = len(CLIP_RATIOS)
    ratios = np.repeat(np.asarray(CLIP_RATIOS), o)  # candidates side by side along the output axis
    tiled = np.tile(theta, (1, 1, r))
    anchor = np.tile(_anchors(theta, per_tensor), (1, 1, r))  # each candidate block keeps its own anchors
    placed = place_on_grid(h, tiled, np.tile(peak, (1, r)) * ratios / QMAX, anchor)
    cost = quadratic_cost(h, placed, tiled).reshape(s, r, o)
    if per_tensor:
        cost = np.broadcast_to(cost.sum(axis=2, keepdims=True), cost.shape)
    best = cost.argmin(axis=1)  # (S, O)
    return np.take_along_axis(placed.reshape(s, n, r, o), best[:, None, None, :], axis=2)[:, :, 0, :]
