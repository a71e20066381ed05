"""Streaming, mergeable per-tensor calibration statistics and the threshold methods (`kl`, `max`, ...).

Two passes over the calibration samples, so that sharded runs merge exactly:
1. range pass: running min / max (float32), element and sample counts, and each sample's absmax keyed by
   its place in the sample order (and, when the caller names samples, by a key of the sample's content);
   merging is min/max/sum and a union of the per-sample records;
2. histogram pass: the |x| histogram over a geometry (range, bins) frozen from pass 1, one of two
   (`HISTOGRAMS`, the stats' `histogram`):
   - `global` (the default): one geometry for every sample, `bins` bins over the absmax of all samples; the
     table does not depend on the sample order.
   - `tpu-mlir`: tpu-mlir's geometry (quant.md §1.2), which it builds sample by sample: the first sample sets
     `bins` bins over its range, and a later sample with a larger running absmax appends bins at the old step,
     the old counts staying in the leading bins. Each sample is binned with the geometry in force after it,
     which depends only on the ordered per-sample absmax of pass 1: `freeze` computes that sequence, pass 2
     bins every sample at its own geometry into the final-length histogram. The geometry's arithmetic follows
     tpu-mlir's numpy (float32 ranges until the first extension, float64 after), so the table equals
     tpu-mlir's for the same samples in the same order.
   Either way shards add, whatever the sharding. Binning: exact zeros are left out (counted separately),
   `width = range / (bins - 1)`, `index = floor(|x| / width + 0.5)` in float32.

Statistics save to a `.npz` written with fixed zip timestamps: the same statistics give the same bytes.
"""

from __future__ import annotations

import io
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import numpy as np

from npuc.compiler.defaults import DEFAULT_BINS
from npuc.compiler.errors import UserError

MAX_BINS = 1 << 16
TINY_SAMPLE = 1e-8  # tpu-mlir: a sample whose |x| stays below this adds nothing to the histogram
RESET_BINS = 8_000_000  # tpu-mlir: a histogram longer than this restarts from the current sample
KL_MAX_BINS = 64 * 2048  # tpu-mlir: longer histograms are halved (adjacent bins summed) before KL
HISTOGRAMS = ("global", "tpu-mlir")  # the histogram geometries (module docstring)
MIN_THRESHOLD = 1e-5  # tpu-mlir: smaller thresholds become 1e-5 ("layer is all zeros")
FORMAT_VERSION = 2  # 2: per-sample absmax, histograms of any length
MAX_STATS_BYTES = 1 << 31
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass
class TensorStats:
    """Statistics of one tensor over the samples seen so far."""

    min: float = float("inf")
    max: float = float("-inf")
    numel: int = 0  # elements seen by the range pass
    samples: int = 0  # updates seen by the range pass
    hist_range: float = 0.0  # range of the final histogram geometry (0: no histogram yet)
    hist: np.ndarray | None = None  # int64 [final bins], zeros excluded
    zeros: int = 0  # exact zeros seen by the histogram pass
    peaks: dict[int, float] = field(default_factory=dict)  # range pass: sample index -> its absmax (float32)
    geometry: dict[int, tuple[float, int]] = field(default_factory=dict)  # frozen: sample index -> (range, bins)
    binned: int = 0  # samples seen by the histogram pass

    @property
    def absmax(self) -> float:
        """max(|min|, |max|) as float32, 0 before any data."""
        if self.numel == 0:
            return 0.0
        return float(np.float32(max(abs(self.min), abs(self.max))))

    @property
    def width(self) -> float:
        """Histogram bin width (float32 like tpu-mlir)."""
        if self.hist is None:
            return 0.0
        return float(bin_width(self.hist_range, len(self.hist)))


def bin_width(top: float, bins: int) -> np.float32:
    """`top / (bins - 1)` as tpu-mlir computes it: in float32 while the range is a float32 (a global range, or
    one not yet extended), in float64 and then rounded once extended."""
    t32 = np.float32(top)
    return t32 / np.float32(bins - 1) if float(t32) == top else np.float32(top / (bins - 1))


@dataclass
class CalibrationStats:
    """Ordered per-tensor statistics; `observe_range` then `freeze` then `observe_histogram`.

    Samples are numbered from `first` in the order the range pass sees them (a shard starts at its first
    sample's place in the whole list). `begin_sample(key)` before a sample's tensors names it by a key of its
    content: the histogram pass then finds each sample's place by its key, so a histogram shard needs no
    offset; without keys the k-th histogram sample of a tensor is taken to be sample `first` + k.
    """

    tensors: dict[str, TensorStats] = field(default_factory=dict)
    bins: int = DEFAULT_BINS
    first: int = 0
    keys: dict[str, int] = field(default_factory=dict)  # sample content key -> its first sample index
    histogram: str = "global"  # the geometry, one of HISTOGRAMS
    _current: int | None = field(default=None, repr=False, compare=False)  # histogram pass: the sample's index
    _seen: int = field(default=0, repr=False, compare=False)  # range pass: samples begun
    _growing: dict[str, tuple[GrowingRange, np.ndarray]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 128 <= self.bins <= MAX_BINS:
            raise UserError(f"histogram bins {self.bins} out of range; use 128..{MAX_BINS} (tpu-mlir uses 2048)")
        if self.histogram not in HISTOGRAMS:
            raise UserError(f"--histogram {self.histogram!r} is not one of {', '.join(HISTOGRAMS)}")

    def begin_sample(self, key: str) -> None:
        """The tensors observed next belong to the sample with content key `key`."""
        frozen = any(st.hist is not None for st in self.tensors.values())
        if frozen:
            self._current = self.keys.get(key, -1)  # -1: a sample the range pass did not see
        else:
            self.keys.setdefault(key, self.first + self._seen)
            self._current = self.first + self._seen
            self._seen += 1

    def observe_range(self, name: str, x: np.ndarray) -> None:
        """Pass 1: fold one sample of tensor `name` into its min / max / counts and record its absmax."""
        a = np.asarray(x, dtype=np.float32).reshape(-1)
        st = self.tensors.setdefault(name, TensorStats())
        if st.hist is not None:
            raise UserError(f"tensor {name!r}: range pass after freeze(); run pass 1 on all samples first")
        peak = np.float32(0.0)
        if a.size:
            lo, hi = float(a.min()), float(a.max())  # NaN propagates into both, +-Inf shows in one
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise _not_finite(name)
            st.min = float(np.float32(min(st.min, lo)))
            st.max = float(np.float32(max(st.max, hi)))
            peak = max(abs(np.float32(lo)), abs(np.float32(hi)))
        index = self._current if self._current is not None else self.first + st.samples
        st.peaks[index] = float(peak)
        st.numel += int(a.size)
        st.samples += 1

    def freeze(self) -> CalibrationStats:
        """Each tensor's histogram geometry: one over the absmax (global) or sample by sample (tpu-mlir); a new
        object ready for pass 2."""
        frozen = {}
        for name, st in self.tensors.items():
            if self.histogram == "global":
                geometry, (top, bins) = {}, (st.absmax, self.bins)
            else:
                geometry, (top, bins) = histogram_geometry(st.peaks, self.bins)
            frozen[name] = replace(
                st, hist_range=top, hist=np.zeros(bins, dtype=np.int64), zeros=0, geometry=geometry, binned=0
            )
        return self._like(frozen)

    def _like(self, tensors: dict[str, TensorStats]) -> CalibrationStats:
        return CalibrationStats(tensors, self.bins, self.first, dict(self.keys), self.histogram)

    def observe_growing(self, name: str, x: np.ndarray) -> None:
        """Both passes at once for tpu-mlir's histogram, as tpu-mlir itself works: the range pass's records, then
        |x| binned at the geometry this sample leaves into a histogram that grows with it. `finish_growing`
        after the last sample gives what `observe_range`, `freeze` and `observe_histogram` give."""
        if self.histogram != "tpu-mlir":
            raise UserError("one-pass statistics need tpu-mlir's histogram; the global one needs the ranges first")
        self.observe_range(name, x)
        st = self.tensors[name]
        peak = st.peaks[self._current if self._current is not None else self.first + st.samples - 1]
        grow, hist = self._growing.get(name) or (GrowingRange(self.bins), np.zeros(0, np.int64))
        if grow.add(peak):
            hist = np.zeros(0, np.int64)
        a = np.asarray(x, dtype=np.float32).reshape(-1)
        st.zeros += int(a.size - np.count_nonzero(a))
        st.binned += 1
        if peak >= TINY_SAMPLE:  # (an all-zero sample's peak is 0)
            counts, _ = histogram_abs(a, grow.top, grow.n, name)
            if len(hist) < grow.n:  # the range grew: bins appended, the old counts stay in the leading ones
                hist = np.concatenate([hist, np.zeros(grow.n - len(hist), np.int64)])
            hist += counts
        self._growing[name] = (grow, hist)

    def finish_growing(self) -> CalibrationStats:
        """The statistics `observe_growing` gathered, as a finished histogram pass."""
        tensors = {}
        for name, st in self.tensors.items():
            grow, hist = self._growing[name]
            top, bins = grow.final
            full = np.zeros(bins, np.int64)
            full[: len(hist)] = hist
            tensors[name] = replace(st, hist_range=top, hist=full)
        return self._like(tensors)

    def observe_histogram(self, name: str, x: np.ndarray) -> None:
        """Pass 2: add |x| of one sample, binned at that sample's geometry, to the histogram of `name`."""
        st = self.tensors.get(name)
        if st is None or st.hist is None:
            raise UserError(f"tensor {name!r} has no frozen range; run the range pass and freeze() first")
        index = self._current if self._current is not None else self.first + st.binned
        st.binned += 1
        if self.histogram == "global":  # one geometry for every sample
            counts, zeros = histogram_abs(x, st.hist_range, len(st.hist), name)
            st.hist += counts
            st.zeros += zeros
            return
        a = np.asarray(x, dtype=np.float32).reshape(-1)
        zeros = int(a.size - np.count_nonzero(a))
        st.zeros += zeros
        if zeros == a.size:
            return
        top = float(np.abs(a).max())
        if not np.isfinite(top):
            raise _not_finite(name)
        if top < TINY_SAMPLE:  # tpu-mlir leaves such a sample out of the histogram
            return
        geo = st.geometry.get(index)
        if geo is None or top > geo[0]:  # a sample the range pass did not see: the final geometry
            geo = (st.hist_range, len(st.hist))
        th, bins = geo
        if bins == 0:  # binned before tpu-mlir's reset (too many bins): the reset discarded it
            return
        counts, _ = histogram_abs(a, th, bins, name)
        st.hist[:bins] += counts

    def merge(self, other: CalibrationStats) -> CalibrationStats:
        """Combine two shards (same phase); the result is exactly what one run over both would give.

        Range shards with distinct sample places merge in any order; shards that both number their samples
        from 0 (run apart, e.g. `calibrate merge` of --range-only files) take `other`'s after this one's."""
        if other.bins != self.bins:
            raise UserError(f"cannot merge statistics with {self.bins} and {other.bins} bins; use the same bin count")
        if other.histogram != self.histogram:
            raise UserError(f"cannot merge statistics of the {self.histogram} and the {other.histogram} histogram; "
                            "use the same --histogram")  # fmt: skip
        shift = _shift(self, other)
        merged = self.copy().tensors
        for name, st in other.tensors.items():
            st = _shifted(st, shift)
            merged[name] = _merge_tensor(name, merged[name], st) if name in merged else _copy_tensor(st)
        keys = {k: i + shift for k, i in other.keys.items()}
        for k, i in self.keys.items():
            keys[k] = min(i, keys.get(k, i))
        first = min(self.first, other.first + shift)
        return CalibrationStats(merged, self.bins, first, dict(sorted(keys.items())), self.histogram)

    def copy(self) -> CalibrationStats:
        """An independent copy (give each histogram-pass shard its own copy of the frozen statistics)."""
        return self._like({name: _copy_tensor(st) for name, st in self.tensors.items()})


def _indices(stats: CalibrationStats) -> set[int]:
    return {i for st in stats.tensors.values() for i in st.peaks}


def _shift(a: CalibrationStats, b: CalibrationStats) -> int:
    """0 when the range shards' sample places are disjoint (or histogram shards), else what puts b after a."""
    if any(st.hist is not None for st in b.tensors.values()):
        return 0
    ia, ib = _indices(a), _indices(b)
    if not ia or not ib or ia.isdisjoint(ib):
        return 0
    return max(ia) + 1 - min(ib)


def _shifted(st: TensorStats, shift: int) -> TensorStats:
    return st if not shift else replace(st, peaks={i + shift: p for i, p in st.peaks.items()})


@dataclass
class GrowingRange:
    """tpu-mlir's histogram geometry as the samples arrive (quant.md §1.2, `combine_histogram`). The arithmetic
    is tpu-mlir's under numpy 1.x: the range is a float32 until the first extension (the extension's
    `new - old` then in float32), float64 after; the step is `range / bins`, the new bin count
    `bins + int((new - old) // step + 1)`, the new range `added * step + old`. A sample with absmax below 1e-8
    only moves the running absmax; more than 8,000,000 bins restart the histogram from the current sample."""

    bins: int
    running: np.float32 = np.float32(0.0)
    top: float | None = None  # the histogram's range; None until a sample is binned
    n: int = 0  # its bins
    is_f32: bool = True

    def add(self, peak: float) -> bool:
        """Take the next sample's absmax; True when the histogram restarts (the earlier counts are dropped)."""
        peak = np.float32(peak)
        self.running = max(self.running, peak)
        if peak < TINY_SAMPLE:
            return False
        if self.top is None:
            self.top, self.n, self.is_f32 = float(self.running), self.bins, True
            return False
        if float(self.running) <= self.top:
            return False
        step = self.top / self.n
        diff = float(self.running - np.float32(self.top)) if self.is_f32 else float(self.running) - self.top
        added = int(np.float64(diff) // np.float64(step) + 1)
        if self.n + added > RESET_BINS:
            message = "calibration samples differ too much in range; the histogram restarts (as tpu-mlir's does)"
            warnings.warn(f"{message}: reorder or replace the samples", UserWarning, stacklevel=3)
            self.top, self.n, self.is_f32 = float(self.running), self.bins, True
            return True
        self.top, self.n, self.is_f32 = added * step + self.top, self.n + added, False
        return False

    @property
    def final(self) -> tuple[float, int]:
        """(range, bins) after the last sample; with no sample binned, `bins` over the running absmax."""
        return (float(self.running), self.bins) if self.top is None else (self.top, self.n)


def histogram_geometry(peaks: Mapping[int, float], bins: int) -> tuple[dict[int, tuple[float, int]], tuple[float, int]]:
    """tpu-mlir's histogram geometry after each sample (GrowingRange), from the samples' absmax in sample order:
    (sample index -> (range, bins), the final (range, bins)). Bins 0: the sample adds nothing (its |x| is
    below 1e-8, or a restart discarded it)."""
    geometry: dict[int, tuple[float, int]] = {}
    grow = GrowingRange(bins)
    for index in sorted(peaks):
        if grow.add(peaks[index]):
            geometry = {i: (g[0], 0) for i, g in geometry.items()}
        tiny = np.float32(peaks[index]) < TINY_SAMPLE
        geometry[index] = (grow.top or 0.0, 0) if tiny else (grow.top, grow.n)
    return geometry, grow.final


def _copy_tensor(st: TensorStats) -> TensorStats:
    return replace(st, hist=None if st.hist is None else st.hist.copy(), peaks=dict(st.peaks))


def _not_finite(name: str) -> UserError:
    return UserError(f"tensor {name!r} has NaN or Inf values; check the model and the calibration samples")


def _merge_tensor(name: str, a: TensorStats, b: TensorStats) -> TensorStats:
    if (a.hist is None) != (b.hist is None):
        raise UserError(f"tensor {name!r}: cannot merge a range-pass shard with a histogram-pass shard")
    out = TensorStats(
        min=min(a.min, b.min),
        max=max(a.max, b.max),
        numel=a.numel + b.numel,
        samples=a.samples + b.samples,
        peaks=dict(sorted({**a.peaks, **b.peaks}.items())),
    )
    if a.hist is not None:
        base = lambda st: (st.min, st.max, st.numel, st.samples, st.hist_range, len(st.hist))  # noqa: E731
        if base(a) != base(b):
            raise UserError(
                f"tensor {name!r}: histogram shards were binned with different ranges "
                f"({a.hist_range} vs {b.hist_range}); freeze the merged range-pass statistics before pass 2"
            )
        # the histogram pass repeats the samples: counts add, range fields describe pass 1 (keep one copy)
        out = replace(a, hist=a.hist + b.hist, zeros=a.zeros + b.zeros, binned=a.binned + b.binned)
    return out


def histogram_abs(x: np.ndarray, absmax: float, bins: int, name: str = "tensor") -> tuple[np.ndarray, int]:
    """tpu-mlir's |x| histogram over `bins` bins of width `bin_width(absmax, bins)`: (counts int64
    [bins], number of exact zeros). A value rounding one bin past the end is dropped, as tpu-mlir's
    `np.histogram(range=(0, bins - 1))` drops it.

    Bit-identical to binning the non-zero |x| as `floor(|x| / width + 0.5)` in float32, with fewer passes:
    every element is binned in place (a zero lands in bin 0 and is taken out again by count), and the
    truncating integer cast is the floor because the values are non-negative.
    """
    a = np.asarray(x, dtype=np.float32).reshape(-1)
    zeros = int(a.size - np.count_nonzero(a))
    if zeros == a.size:
        return np.zeros(bins, dtype=np.int64), zeros
    w = bin_width(absmax, bins)
    if not w > 0:
        raise UserError(f"tensor {name!r}: non-zero values but a zero frozen range; rerun the range pass")
    t = np.abs(a)
    np.divide(t, w, out=t)
    t += np.float32(0.5)
    top = float(t.max())
    if not np.isfinite(top):
        raise _not_finite(name)
    if top >= bins + 1:
        raise UserError(
            f"tensor {name!r}: value {float(np.abs(a).max())} exceeds the range pass absmax {absmax}; "
            "run both passes on the same samples"
        )
    counts = np.bincount(t.astype(np.intp), minlength=bins + 1)[:bins]
    counts[0] -= zeros
    return counts, zeros


# ---------------------------------------------------------------------------------------------------------
# Threshold methods


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


# ---------------------------------------------------------------------------------------------------------
# Save / load (.npz with fixed timestamps)


def save_stats(stats: CalibrationStats, path: str | Path) -> None:
    """Write statistics to a deterministic .npz (same statistics -> same bytes)."""
    names = list(stats.tensors)
    sts = [stats.tensors[n] for n in names]
    has_hist = [st.hist is not None for st in sts]
    hists = [st.hist for st in sts if st.hist is not None]
    peaks = [sorted(st.peaks.items()) for st in sts]
    arrays = {
        "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
        "bins": np.array(stats.bins, dtype=np.int64),
        "first": np.array(stats.first, dtype=np.int64),
        "histogram": np.array(stats.histogram, dtype=np.str_),
        "names": np.array(names, dtype=np.str_) if names else np.zeros(0, dtype="<U1"),
        "min": np.array([st.min for st in sts], dtype=np.float64),
        "max": np.array([st.max for st in sts], dtype=np.float64),
        "numel": np.array([st.numel for st in sts], dtype=np.int64),
        "samples": np.array([st.samples for st in sts], dtype=np.int64),
        "has_hist": np.array(has_hist, dtype=np.bool_),
        "hist_range": np.array([st.hist_range for st in sts], dtype=np.float64),
        "zeros": np.array([st.zeros for st in sts], dtype=np.int64),
        "binned": np.array([st.binned for st in sts], dtype=np.int64),
        "hist_len": np.array([0 if st.hist is None else len(st.hist) for st in sts], dtype=np.int64),
        "hist": np.concatenate(hists).astype(np.int64) if hists else np.zeros(0, dtype=np.int64),
        "peak_count": np.array([len(p) for p in peaks], dtype=np.int64),
        "peak_index": np.array([i for p in peaks for i, _ in p], dtype=np.int64),
        "peak": np.array([v for p in peaks for _, v in p], dtype=np.float32),
        "key_names": np.array(list(stats.keys), dtype=np.str_) if stats.keys else np.zeros(0, dtype="<U1"),
        "key_index": np.array(list(stats.keys.values()), dtype=np.int64),
    }
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for key, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arr, order="C"), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())
    tmp.replace(path)


_EXPECTED = MappingProxyType(
    {
        "min": "f",
        "max": "f",
        "numel": "i",
        "samples": "i",
        "has_hist": "b",
        "hist_range": "f",
        "zeros": "i",
        "binned": "i",
        "hist_len": "i",
        "peak_count": "i",
    }
)


_NPY_HEADER_READERS = MappingProxyType(
    {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Read a .npz of plain arrays, checking each header against its member size before allocating."""
    arrays = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy") or info.file_size > MAX_STATS_BYTES:
                    raise ValueError(f"unexpected member {info.filename!r} ({info.file_size} bytes)")
                with zf.open(info) as f:
                    reader = _NPY_HEADER_READERS.get(np.lib.format.read_magic(f))
                    if reader is None:
                        raise ValueError(f"member {info.filename!r} has an unsupported .npy version")
                    shape, fortran, dtype = reader(f)
                    if dtype.hasobject:
                        raise ValueError(f"member {info.filename!r} holds Python objects")
                    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                    data = f.read(nbytes + 1)
                if len(data) != nbytes:
                    raise ValueError(f"member {info.filename!r} size does not match its header")
                arr = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
                arrays[info.filename[:-4]] = arr.copy()
    except (zipfile.BadZipFile, ValueError, EOFError, TypeError) as exc:
        raise UserError(f"{path}: not a npuc statistics .npz ({exc}); pass a file written by npuc calibrate") from None
    except OSError as exc:
        raise UserError(f"cannot read statistics {path}: {exc}; check the path") from None
    return arrays


def load_stats(path: str | Path) -> CalibrationStats:
    """Read a statistics .npz written by save_stats, validating every array."""
    path = Path(path)
    data = _read_npz(path)
    bad = lambda why: UserError(f"{path}: corrupt statistics file: {why}; recreate it with npuc calibrate")  # noqa: E731
    for key in ("format_version", "bins", "first", "histogram", "names", "hist", "peak_index", "peak", "key_names",
                "key_index", *_EXPECTED):  # fmt: skip
        if key not in data:
            raise bad(f"missing array {key!r}")
    if data["format_version"].shape != () or int(data["format_version"]) != FORMAT_VERSION:
        raise bad(f"format version {data['format_version']!r}, expected {FORMAT_VERSION}")
    bins = int(data["bins"]) if data["bins"].shape == () else -1
    first = int(data["first"]) if data["first"].shape == () else -1
    geometry = str(data["histogram"]) if data["histogram"].shape == () and data["histogram"].dtype.kind == "U" else ""
    if geometry not in HISTOGRAMS:
        raise bad(f"histogram geometry {data['histogram']!r} is not one of {', '.join(HISTOGRAMS)}")
    names = data["names"]
    t = len(names)
    if names.ndim != 1 or names.dtype.kind != "U" or len(set(names.tolist())) != t:
        raise bad("'names' must be a 1-D array of distinct strings")
    for key, kind in _EXPECTED.items():
        arr = data[key]
        if arr.shape != (t,) or arr.dtype.kind != kind:
            raise bad(f"array {key!r} has shape {arr.shape} dtype {arr.dtype}, expected ({t},) kind {kind!r}")
    hist, lens = data["hist"], data["hist_len"]
    has = data["has_hist"]
    if (
        hist.ndim != 1 or hist.dtype != np.int64 or (hist < 0).any() or (lens < 0).any()
        or int(lens.sum()) != len(hist) or (lens[has] < 2).any() or (lens[~has] != 0).any()
    ):  # fmt: skip
        raise bad(f"'hist' has shape {hist.shape} dtype {hist.dtype}, not the int64 >= 0 counts 'hist_len' gives")
    pidx, peak, pcount = data["peak_index"], data["peak"], data["peak_count"]
    if (
        pidx.shape != peak.shape or pidx.ndim != 1 or pidx.dtype != np.int64 or peak.dtype != np.float32
        or (pcount < 0).any() or int(pcount.sum()) != len(peak) or not np.all(np.isfinite(peak)) or (peak < 0).any()
    ):  # fmt: skip
        raise bad("per-sample absmax arrays 'peak_index' / 'peak' do not match 'peak_count'")
    knames, kidx = data["key_names"], data["key_index"]
    if knames.ndim != 1 or knames.shape != kidx.shape or (len(knames) and knames.dtype.kind != "U"):
        raise bad("sample keys 'key_names' / 'key_index' do not match")
    counts = np.concatenate([data["numel"], data["samples"], data["zeros"], data["binned"]])
    if (counts < 0).any() or not np.all(np.isfinite(data["hist_range"])) or (data["hist_range"] < 0).any():
        raise bad("negative counts or a bad histogram range")
    hist_at = np.concatenate([[0], np.cumsum(lens)])
    peak_at = np.concatenate([[0], np.cumsum(pcount)])
    tensors = {}
    for i, name in enumerate(names.tolist()):
        st = TensorStats(
            min=float(data["min"][i]),
            max=float(data["max"][i]),
            numel=int(data["numel"][i]),
            samples=int(data["samples"][i]),
            hist_range=float(data["hist_range"][i]),
            hist=hist[hist_at[i] : hist_at[i + 1]].copy() if has[i] else None,
            zeros=int(data["zeros"][i]),
            peaks=dict(zip(pidx[peak_at[i] : peak_at[i + 1]].tolist(), peak[peak_at[i] : peak_at[i + 1]].tolist())),
            binned=int(data["binned"][i]),
        )
        tensors[name] = st
    keys = {str(k): int(v) for k, v in zip(knames.tolist(), kidx.tolist())}
    return CalibrationStats(tensors, bins, first, keys, geometry)  # __post_init__ validates bins
