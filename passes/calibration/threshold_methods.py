"""The threshold methods (`kl`, `max`, `percentile`, `mse`) over the statistics of histogram.py, and the table
rows they give; tpu-mlir's definitions (quant.md §1.2)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np

from npuc.compiler.errors import UserError
from npuc.passes.calibration.histogram import CalibrationStats, TensorStats

KL_MAX_BINS = 64 * 2048  # tpu-mlir: longer histograms are halved (adjacent bins summed) before KL
MIN_THRESHOLD = 1e-5  # tpu-mlir: smaller thresholds become 1e-5 ("layer is all zeros")


def kl_threshold(hist: np.ndarray, width: float, dst_bins: int = 128) -> float:
    """tpu-mlir's KL threshold: `width·(argmin+1)·dst_bins` (float32) over `kl_divergences`, first minimum."""
    if not np.asarray(hist).sum():
        return 0.0
    best = int(np.argmin(kl_divergences(hist, dst_bins)))
    with np.errstate(over="ignore"):  # a range near float32's largest (an attention mask's -FLT_MAX fill)
        value = np.float32(width) * np.float32((best + 1) * dst_bins)
    return float(value) if np.isfinite(value) else float(np.finfo(np.float32).max)


def kl_divergences(hist: np.ndarray, dst_bins: int = 128) -> np.ndarray:
    """tpu-mlir's KL cost (quant.md §1.2) for each candidate i = dst_bins, 2·dst_bins, ... N (padded).

    P: the first i bins with the tail folded into bin i-1, over the total count. Q: the first i bins merged
    into `dst_bins` groups, each group's mass spread evenly over its non-empty bins, over the mass of the
    first i bins. Cost: sum P·(log10(P+1e-30) - log10(Q+1e-30)). Computed in float64 with prefix sums
    instead of the reference's per-bin loops (which accumulate in float32).
    """
    h = np.asarray(hist, dtype=np.int64)
    if len(h) % dst_bins:
        h = np.concatenate([h, np.zeros(dst_bins - len(h) % dst_bins, dtype=np.int64)])
    n = len(h)
    total = float(h.sum())
    if total == 0:
        raise UserError("KL threshold of an empty histogram; the tensor had no non-zero values")
    hf = h.astype(np.float64)
    p = hf / total
    cs_h = np.concatenate([[0.0], np.cumsum(hf)])
    cs_nz = np.concatenate([[0], np.cumsum(h > 0)])
    plogp = np.where(p > 0, p * np.log10(np.where(p > 0, p, 1.0) + 1e-30), 0.0)
    cs_plogp = np.concatenate([[0.0], np.cumsum(plogp)])

    cand = np.arange(dst_bins, n + 1, dst_bins)  # i
    expand = cand // dst_bins
    edges = expand[:, None] * np.arange(dst_bins + 1)[None, :]  # group boundaries [m, dst_bins+1]
    mass = cs_h[edges[:, 1:]] - cs_h[edges[:, :-1]]
    nonzero = (cs_nz[edges[:, 1:]] - cs_nz[edges[:, :-1]]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 only in groups whose P mass is 0 (masked)
        q_base = mass / np.maximum(nonzero, 1.0) / cs_h[cand][:, None]
    log_q = np.log10(q_base + 1e-30)

    last = cand - 1
    # bins j < i-1 with h_j > 0: P_j = h_j / total, Q_j = q_base of its group
    p_mass = mass / total
    p_mass[:, -1] -= hf[last] / total  # the last bin is handled separately (it holds the folded tail)
    body = cs_plogp[last] - np.sum(np.where(p_mass > 0, p_mass * log_q, 0.0), axis=1)
    p_last = (total - cs_h[last]) / total
    q_last = np.where(h[last] > 0, q_base[:, -1], 0.0)
    tail = np.where(p_last > 0, p_last * (np.log10(p_last + 1e-30) - np.log10(q_last + 1e-30)), 0.0)
    return body + tail


def _kl(st: TensorStats, dst_bins: int = 128) -> float:
    """tpu-mlir's find_threshold: pad to a multiple of `dst_bins`; while longer than KL_MAX_BINS, sum adjacent
    bins, pad again and double the width; then the KL search."""
    _require_hist(st, "kl")
    hist, width = _pad(st.hist, dst_bins), float(st.width)
    while len(hist) > KL_MAX_BINS:
        hist, width = _pad(hist[::2] + hist[1::2], dst_bins), width * 2.0
    return kl_threshold(hist, width, dst_bins)


def _pad(hist: np.ndarray, dst_bins: int) -> np.ndarray:
    short = -len(hist) % dst_bins
    return np.concatenate([hist, np.zeros(short, dtype=hist.dtype)]) if short else hist


def _max(st: TensorStats) -> float:
    return st.absmax


def _percentile(st: TensorStats, percentile: float = 99.99) -> float:
    """|x| percentile (zeros included) from the histogram, linear inside the bin that crosses it."""
    _require_hist(st, "percentile")
    if not 0 < percentile <= 100:
        raise UserError(f"percentile {percentile} out of range; use a value in (0, 100], e.g. 99.99")
    total = st.zeros + int(st.hist.sum())
    if total == 0:
        return 0.0
    target = percentile / 100.0 * total
    cum = st.zeros + np.cumsum(st.hist)
    k = int(min(np.searchsorted(cum, target, side="left"), len(st.hist) - 1))
    before = cum[k] - st.hist[k]
    frac = 0.0 if st.hist[k] == 0 else (target - before) / st.hist[k]
    w = st.width
    lower = max(k - 0.5, 0.0) * w  # bin k holds |x| in [(k-0.5)w, (k+0.5)w)
    upper = (k + 0.5) * w
    return float(min(lower + frac * (upper - lower), st.absmax))


def _mse(st: TensorStats, bits: int = 8) -> float:
    """Threshold minimising the expected squared error of symmetric quantization, over bin-centre candidates.

    Values inside the threshold cost the uniform rounding noise step²/12 (step = T/(2^(bits-1)-1)),
    values beyond it cost the clipping error (|x|-T)², taking each bin's values at its centre.
    """
    _require_hist(st, "mse")
    h = st.hist.astype(np.float64)
    if h.sum() == 0:
        return 0.0
    centres = np.arange(len(h)) * st.width
    cand = centres[1:]
    n_in = np.cumsum(h)[1:]  # non-zero values inside the threshold centres[k] (zeros are exact)
    tail = lambda a: np.concatenate([np.cumsum(a[::-1])[::-1][2:], [0.0]])  # noqa: E731 - sums over j > k
    s0, s1, s2 = tail(h), tail(h * centres), tail(h * centres**2)
    step = cand / float(2 ** (bits - 1) - 1)
    err = n_in * step**2 / 12.0 + (s2 - 2 * cand * s1 + cand**2 * s0)
    return float(min(cand[int(np.argmin(err))], st.absmax))


def _require_hist(st: TensorStats, method: str) -> None:
    if st.hist is None:
        raise UserError(f"method {method!r} needs the histogram pass; run freeze() and observe_histogram()")


THRESHOLD_METHODS: Mapping[str, Callable[..., float]] = MappingProxyType(
    {"kl": _kl, "max": _max, "percentile": _percentile, "mse": _mse}
)


def compute_threshold(st: TensorStats, method: str = "kl", **params: float) -> float:
    """Threshold of one tensor by a registered method, clamped to [1e-5, absmax] as tpu-mlir does."""
    fn = THRESHOLD_METHODS.get(method)
    if fn is None:
        raise UserError(f"unknown calibration method {method!r}; use one of {', '.join(THRESHOLD_METHODS)}")
    try:
        th = fn(st, **params)
    except TypeError:
        raise UserError(f"method {method!r} does not take parameters {sorted(params)}") from None
    th = min(th, st.absmax) if st.absmax > 0 else th
    return max(th, MIN_THRESHOLD)


def table_rows(stats: CalibrationStats, method: str = "kl", **params: float) -> dict[str, tuple[float, float, float]]:
    """name -> (threshold, min, max) for a cali_table; all-zero tensors get tpu-mlir's ±1e-5 range."""
    rows = {}
    for name, st in stats.tensors.items():
        lo, hi = st.min, st.max
        if st.absmax <= MIN_THRESHOLD:
            lo, hi = (-MIN_THRESHOLD if lo < 0 else 0.0), MIN_THRESHOLD
        rows[name] = (compute_threshold(st, method, **params), lo, hi)
    return rows
