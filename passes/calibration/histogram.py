"""Streaming, mergeable per-tensor calibration statistics: ranges and |x| histograms.

The histogram has one of two geometries (`HISTOGRAMS`, the stats' `histogram`):
- `global` (the default): one geometry for every sample, over the absmax of all samples, so the table does not
  depend on the sample order: bins of a power-of-two width, the largest not above `absmax / (bins - 1)`
  (`global_geometry`: `bins` to `2 bins - 1` bins up to the absmax; never coarser than `bins` bins over it).
  It needs one pass over the samples: the range pass also counts |x| in a grid of `GRID_PER_BIN * bins` bins
  over [0, 2^e), 2^e the first power of two above the absmax seen so far; when a larger absmax raises e,
  neighbouring grid bins add up pairwise. Every edge involved is a power-of-two multiple, so all of it is
  exact: the grid after any samples, in any order or sharding, is the grid binned at the final e directly,
  and each final bin is a whole number of grid bins (`histograms()`). A second pass over frozen ranges
  (`freeze`, `observe_histogram`: shards whose ranges come from elsewhere) gives the same counts directly.
- `tpu-mlir`: tpu-mlir's geometry (quant.md §1.2), which it builds sample by sample: the first sample sets
  `bins` bins over its range, and a later sample with a larger running absmax appends bins at the old step,
  the old counts staying in the leading bins. Each sample is binned with the geometry in force after it,
  which depends only on the ordered per-sample absmax of the range pass (each sample's absmax keyed by its
  place in the sample order, and, when the caller names samples, by a key of its content): `freeze`
  computes that sequence, the histogram pass bins every sample at its own geometry into the final-length
  histogram. The geometry's arithmetic follows tpu-mlir's numpy (float32 ranges until the first extension,
  float64 after), so the table equals tpu-mlir's for the same samples in the same order. In one process,
  `observe_growing` does both passes at once, as tpu-mlir does.
Either way shards merge exactly (min/max, integer counts), whatever the sharding. Binning: exact zeros are
left out (counted separately); the final geometry's `width = range / (bins - 1)`, `index = floor(|x| / width +
0.5)` in float32 (tpu-mlir's rule).

The threshold methods that read these statistics are in threshold_methods.py, their `.npz` files in
stats_file.py.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from npuc.compiler.defaults import DEFAULT_BINS
from npuc.compiler.errors import UserError

MAX_BINS = 1 << 16
TINY_SAMPLE = 1e-8  # tpu-mlir: a sample whose |x| stays below this adds nothing to the histogram
RESET_BINS = 8_000_000  # tpu-mlir: a histogram longer than this restarts from the current sample
HISTOGRAMS = ("global", "tpu-mlir")  # the histogram geometries (module docstring)
GRID_PER_BIN = 8  # the global histogram's grid: this many bins per `bins` (a final bin is >= 2 grid bins)


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
    peaks: dict[int, float] = field(default_factory=dict)  # tpu-mlir histogram: sample index -> absmax (float32)
    geometry: dict[int, tuple[float, int]] = field(default_factory=dict)  # frozen: sample index -> (range, bins)
    binned: int = 0  # samples seen by the histogram pass
    grid: np.ndarray | None = None  # global histogram, one pass: int64 counts over [0, 2^grid_exp), zeros excluded
    grid_exp: int = 0
    grid_zeros: int = 0  # exact zeros the grid left out

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
    """Ordered per-tensor statistics; `observe_range` then `freeze` then `observe_histogram`, or, for the global
    histogram `with_grid`, `observe_range` then `histograms`.

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
    with_grid: bool = False  # the range pass also bins the global histogram's grid (no second pass)
    _current: int | None = field(default=None, repr=False, compare=False)  # histogram pass: the sample's index
    _seen: int = field(default=0, repr=False, compare=False)  # range pass: samples begun
    _growing: dict[str, tuple[GrowingRange, np.ndarray]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 128 <= self.bins <= MAX_BINS:
            raise UserError(f"histogram bins {self.bins} out of range; use 128..{MAX_BINS} (tpu-mlir uses 2048)")
        if self.histogram not in HISTOGRAMS:
            raise UserError(f"--histogram {self.histogram!r} is not one of {', '.join(HISTOGRAMS)}")
        if self.with_grid and self.histogram != "global":
            raise UserError("the one-pass grid makes the global histogram; tpu-mlir's follows the sample order")

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
        """Pass 1: fold one sample of tensor `name` into its min / max / counts (and, for tpu-mlir's geometry,
        record its absmax; `with_grid`, bin it into the global histogram's grid)."""
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
            if self.with_grid:
                _grid_add(st, a, float(peak), self.bins)
        if self.histogram == "tpu-mlir":  # its geometry needs every sample's absmax; the global one does not
            st.peaks[self._current if self._current is not None else self.first + st.samples] = float(peak)
        st.numel += int(a.size)
        st.samples += 1

    def freeze(self) -> CalibrationStats:
        """Each tensor's histogram geometry: one over the absmax (global) or sample by sample (tpu-mlir); a new
        object ready for pass 2."""
        frozen = {}
        for name, st in self.tensors.items():
            if self.histogram == "global":
                geometry, (top, bins) = {}, global_geometry(st.absmax, self.bins)
            else:
                geometry, (top, bins) = histogram_geometry(st.peaks, self.bins)
            frozen[name] = replace(
                st, hist_range=top, hist=np.zeros(bins, dtype=np.int64), zeros=0, geometry=geometry, binned=0,
                grid=None, grid_exp=0, grid_zeros=0,
            )  # fmt: skip
        return self._like(frozen)

    def histograms(self, whole: CalibrationStats | None = None) -> CalibrationStats:
        """The histogram pass the grids already made (`with_grid`): what `whole.freeze()` and `observe_histogram`
        over this run's samples give. `whole`: the merged range statistics of every shard, whose geometry the
        histograms take (default: these)."""
        whole = self if whole is None else whole
        if not self.with_grid:
            raise UserError("these statistics have no grid: run the histogram pass over frozen ranges")
        out = {}
        for name, st in self.tensors.items():
            ref = whole.tensors.get(name)
            if ref is None or st.absmax > ref.absmax:
                raise UserError(f"tensor {name!r}: the whole run's range statistics do not cover this shard's")
            top, bins = global_geometry(ref.absmax, self.bins)
            exponent = grid_exponent(ref.absmax)
            grid = _regrid(st.grid, st.grid_exp, exponent) if st.grid is not None else None
            out[name] = replace(
                ref, hist_range=top, hist=grid_histogram(grid, exponent, top, bins),
                zeros=st.grid_zeros, binned=st.samples, peaks={}, geometry={}, grid=None, grid_exp=0, grid_zeros=0,
            )  # fmt: skip
        return self._like(out)

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
        grids = self.with_grid and other.with_grid
        return CalibrationStats(merged, self.bins, first, dict(sorted(keys.items())), self.histogram, grids)

    def copy(self) -> CalibrationStats:
        """An independent copy (give each histogram-pass shard its own copy of the frozen statistics)."""
        copied = self._like({name: _copy_tensor(st) for name, st in self.tensors.items()})
        copied.with_grid = self.with_grid
        return copied


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
    copy = lambda a: None if a is None else a.copy()  # noqa: E731
    return replace(st, hist=copy(st.hist), peaks=dict(st.peaks), grid=copy(st.grid))


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
    if a.grid is not None or b.grid is not None:  # range shards of a one-pass global histogram
        out.grid_exp = max(st.grid_exp for st in (a, b) if st.grid is not None)
        out.grid = sum(_regrid(st.grid, st.grid_exp, out.grid_exp) for st in (a, b) if st.grid is not None)
    out.grid_zeros = a.grid_zeros + b.grid_zeros
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
# The global histogram's power-of-two grid (module docstring)


def grid_size(bins: int) -> int:
    """Grid bins for a `bins`-bin histogram: a power of two of at least GRID_PER_BIN per final bin."""
    return 1 << (bins * GRID_PER_BIN - 1).bit_length()


def grid_exponent(top: float) -> int:
    """e of the grid over [0, 2^e) for values up to `top` > 0: the first power of two above it."""
    return math.frexp(top)[1]


def _grid_counts(a: np.ndarray, exponent: int, size: int) -> tuple[np.ndarray, int]:
    """|a| counted in the grid's bins `floor(|x| * size / 2^e)` (zeros left out), and the number of zeros. The
    scaling is by a power of two, so exact: the same value lands in bin i at e and in bin i // 2^d at e + d.

    Three passes over the data: |a|; its zeros counted on the bit patterns (after abs, +0.0 is the only zero
    pattern, and integer counting is 5x faster than float); the scaled |a| truncated straight into int32 bin
    indices (a float32 product cast in the same ufunc call), then bincount."""
    scaled = np.abs(a)
    zeros = int(a.size - np.count_nonzero(scaled.view(np.uint32)))
    shift = size.bit_length() - 1 - exponent
    if shift > 127:  # beyond one float32 power of two (np.ldexp is 20x slower than a multiply)
        np.multiply(scaled, np.float32(2.0**127), out=scaled)
        shift -= 127
    index = np.empty(a.size, np.int32)
    np.multiply(scaled, np.float32(2.0**shift), out=index, casting="unsafe")  # bins < size: truncation is floor
    counts = np.bincount(index, minlength=size)
    counts[0] -= zeros
    return counts, zeros


def _grid_add(st: TensorStats, a: np.ndarray, peak: float, bins: int) -> None:
    """One sample into the tensor's grid; a larger absmax first coarsens the grid to its exponent."""
    if peak == 0.0:  # all zeros: no exponent yet
        st.grid_zeros += int(a.size)
        return
    size = grid_size(bins)
    exponent = grid_exponent(peak)
    if st.grid is None:
        st.grid, st.grid_exp = np.zeros(size, np.int64), exponent
    elif exponent > st.grid_exp:
        st.grid, st.grid_exp = _regrid(st.grid, st.grid_exp, exponent), exponent
    counts, zeros = _grid_counts(a, st.grid_exp, size)
    st.grid += counts
    st.grid_zeros += zeros


def _regrid(grid: np.ndarray, exponent: int, to: int) -> np.ndarray:
    """The grid at a larger exponent: each 2^(to - exponent) neighbouring bins add up into one."""
    if to == exponent:
        return grid
    size, group = len(grid), 1 << min(to - exponent, int(np.log2(len(grid))))
    out = np.zeros(size, np.int64)
    out[: size // group] = grid.reshape(-1, group).sum(axis=1)
    return out


def global_geometry(absmax: float, bins: int) -> tuple[float, int]:
    """The global histogram over `absmax`: (range, bin count); its width `range / (count - 1)` is the largest power
    of two not above `absmax / (bins - 1)`, its count the bins up to the one `absmax` falls in."""
    if not absmax > 0:
        return 0.0, bins
    width = float(np.ldexp(1.0, int(np.frexp(absmax / (bins - 1))[1]) - 1))
    count = int(np.floor(absmax / width + 0.5)) + 1
    return width * (count - 1), count


def grid_histogram(grid: np.ndarray | None, exponent: int, top: float, bins: int) -> np.ndarray:
    """The global histogram (`global_geometry`'s `top` and `bins`) of a grid at `exponent`: final bin j, |x| in
    [(j - 1/2) w, (j + 1/2) w), is exactly grid bins [(2j - 1) r, (2j + 1) r), r = w / 2 / (grid bin width)."""
    hist = np.zeros(bins, np.int64)
    if grid is None or not grid.any():
        return hist
    size = len(grid)
    half = int(np.ldexp(top / (bins - 1) / 2, int(np.log2(size)) - exponent))  # r: a power of two >= 1
    index = (np.arange(size) + half) // (2 * half)
    used = index < bins  # grid bins past the last final bin are empty
    starts = np.flatnonzero(np.diff(index[used], prepend=-1))
    hist[index[used][starts]] = np.add.reduceat(grid[used], starts)
    return hist
