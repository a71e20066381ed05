"""Streaming, mergeable per-tensor calibration statistics and the threshold methods (`kl`, `max`, ...).

Two passes over the calibration samples, so that sharded runs merge exactly:
1. range pass: running min / max (float32), element and sample counts — merging is min/max/sum;
2. histogram pass: the |x| histogram with the range frozen from pass 1, so every shard bins with the same
   width and merging is integer addition. Binning follows tpu-mlir (quant.md §1.2): exact zeros are left
   out (counted separately), `width = absmax / (bins - 1)` and `index = floor(|x| / width + 0.5)`, in
   float32. tpu-mlir instead grows its histogram when a later sample exceeds the range, which makes its
   result depend on sample order; with the range frozen first ours equals tpu-mlir's whenever its first
   sample holds the absmax, and never depends on order or sharding.

Statistics save to a `.npz` written with fixed zip timestamps: the same statistics give the same bytes.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import numpy as np

from npuc.compiler.defaults import DEFAULT_BINS
from npuc.compiler.errors import UserError

MAX_BINS = 1 << 16
MIN_THRESHOLD = 1e-5  # tpu-mlir: smaller thresholds become 1e-5 ("layer is all zeros")
FORMAT_VERSION = 1
MAX_STATS_BYTES = 1 << 31
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass
class TensorStats:
    """Statistics of one tensor over the samples seen so far."""

    min: float = float("inf")
    max: float = float("-inf")
    numel: int = 0  # elements seen by the range pass
    samples: int = 0  # updates seen by the range pass
    hist_range: float = 0.0  # absmax the histogram bins were fixed from (0: no histogram yet)
    hist: np.ndarray | None = None  # int64 [bins], zeros excluded
    zeros: int = 0  # exact zeros seen by the histogram pass

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
        return float(np.float32(self.hist_range) / np.float32(len(self.hist) - 1))


@dataclass
class CalibrationStats:
    """Ordered per-tensor statistics; `observe_range` then `freeze` then `observe_histogram`."""

    tensors: dict[str, TensorStats] = field(default_factory=dict)
    bins: int = DEFAULT_BINS

    def __post_init__(self) -> None:
        if not 128 <= self.bins <= MAX_BINS:
            raise UserError(f"histogram bins {self.bins} out of range; use 128..{MAX_BINS} (tpu-mlir uses 2048)")

    def observe_range(self, name: str, x: np.ndarray) -> None:
        """Pass 1: fold one sample of tensor `name` into its min / max / counts."""
        a = np.asarray(x, dtype=np.float32).reshape(-1)
        st = self.tensors.setdefault(name, TensorStats())
        if st.hist is not None:
            raise UserError(f"tensor {name!r}: range pass after freeze(); run pass 1 on all samples first")
        if a.size:
            lo, hi = float(a.min()), float(a.max())  # NaN propagates into both, +-Inf shows in one
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise _not_finite(name)
            st.min = float(np.float32(min(st.min, lo)))
            st.max = float(np.float32(max(st.max, hi)))
        st.numel += int(a.size)
        st.samples += 1

    def freeze(self) -> CalibrationStats:
        """Fix each tensor's histogram range to its absmax; returns a new object ready for pass 2."""
        frozen = {
            name: replace(st, hist_range=st.absmax, hist=np.zeros(self.bins, dtype=np.int64), zeros=0)
            for name, st in self.tensors.items()
        }
        return CalibrationStats(frozen, self.bins)

    def observe_histogram(self, name: str, x: np.ndarray) -> None:
        """Pass 2: add |x| of one sample to the frozen histogram of `name`."""
        st = self.tensors.get(name)
        if st is None or st.hist is None:
            raise UserError(f"tensor {name!r} has no frozen range; run the range pass and freeze() first")
        counts, zeros = histogram_abs(x, st.hist_range, len(st.hist), name)
        st.hist += counts
        st.zeros += zeros

    def merge(self, other: CalibrationStats) -> CalibrationStats:
        """Combine two shards (same phase); the result is exactly what one run over both would give."""
        if other.bins != self.bins:
            raise UserError(f"cannot merge statistics with {self.bins} and {other.bins} bins; use the same bin count")
        merged = self.copy().tensors
        for name, st in other.tensors.items():
            merged[name] = _merge_tensor(name, merged[name], st) if name in merged else _copy_tensor(st)
        return CalibrationStats(merged, self.bins)

    def copy(self) -> CalibrationStats:
        """An independent copy (give each histogram-pass shard its own copy of the frozen statistics)."""
        return CalibrationStats({name: _copy_tensor(st) for name, st in self.tensors.items()}, self.bins)


def _copy_tensor(st: TensorStats) -> TensorStats:
    return replace(st, hist=None if st.hist is None else st.hist.copy())


def _not_finite(name: str) -> UserError:
    return UserError(f"tensor {name!r} has NaN or Inf values; check the model and the calibration samples")


def _merge_tensor(name: str, a: TensorStats, b: TensorStats) -> TensorStats:
    if (a.hist is None) != (b.hist is None):
        raise UserError(f"tensor {name!r}: cannot merge a range-pass shard with a histogram-pass shard")
    out = TensorStats(
        min=min(a.min, b.min), max=max(a.max, b.max), numel=a.numel + b.numel, samples=a.samples + b.samples
    )
    if a.hist is not None:
        base = lambda st: (st.min, st.max, st.numel, st.samples, st.hist_range, len(st.hist))  # noqa: E731
        if base(a) != base(b):
            raise UserError(
                f"tensor {name!r}: histogram shards were binned with different ranges "
                f"({a.hist_range} vs {b.hist_range}); freeze the merged range-pass statistics before pass 2"
            )
        # the histogram pass repeats the samples: counts add, range fields describe pass 1 (keep one copy)
        out = replace(a, hist=a.hist + b.hist, zeros=a.zeros + b.zeros)
    return out


def histogram_abs(x: np.ndarray, absmax: float, bins: int, name: str = "tensor") -> tuple[np.ndarray, int]:
    """tpu-mlir's |x| histogram with a fixed range: (counts int64 [bins], number of exact zeros).

    Bit-identical to binning the non-zero |x| as `floor(|x| / width + 0.5)` in float32, with fewer passes:
    every element is binned in place (a zero lands in bin 0 and is taken out again by count), and the
    truncating integer cast is the floor because the values are non-negative.
    """
    a = np.asarray(x, dtype=np.float32).reshape(-1)
    zeros = int(a.size - np.count_nonzero(a))
    if zeros == a.size:
        return np.zeros(bins, dtype=np.int64), zeros
    width = np.float32(absmax) / np.float32(bins - 1)
    if not width > 0:
        raise UserError(f"tensor {name!r}: non-zero values but a zero frozen range; rerun the range pass")
    t = np.abs(a)
    np.divide(t, width, out=t)
    t += np.float32(0.5)
    top = float(t.max())
    if not np.isfinite(top):
        raise _not_finite(name)
    if top >= bins:
        raise UserError(
            f"tensor {name!r}: value {float(np.abs(a).max())} exceeds the range pass absmax {absmax}; "
            "run both passes on the same samples"
        )
    counts = np.bincount(t.astype(np.intp), minlength=bins)
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
    _require_hist(st, "kl")
    return kl_threshold(st.hist, st.width, dst_bins)


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
    arrays = {
        "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
        "bins": np.array(stats.bins, dtype=np.int64),
        "names": np.array(names, dtype=np.str_) if names else np.zeros(0, dtype="<U1"),
        "min": np.array([st.min for st in sts], dtype=np.float64),
        "max": np.array([st.max for st in sts], dtype=np.float64),
        "numel": np.array([st.numel for st in sts], dtype=np.int64),
        "samples": np.array([st.samples for st in sts], dtype=np.int64),
        "has_hist": np.array(has_hist, dtype=np.bool_),
        "hist_range": np.array([st.hist_range for st in sts], dtype=np.float64),
        "zeros": np.array([st.zeros for st in sts], dtype=np.int64),
        "hist": np.stack([st.hist if st.hist is not None else np.zeros(stats.bins, np.int64) for st in sts])
        if sts
        else np.zeros((0, stats.bins), dtype=np.int64),
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
    for key in ("format_version", "bins", "names", "hist", *_EXPECTED):
        if key not in data:
            raise bad(f"missing array {key!r}")
    if data["format_version"].shape != () or int(data["format_version"]) != FORMAT_VERSION:
        raise bad(f"format version {data['format_version']!r}, expected {FORMAT_VERSION}")
    bins = int(data["bins"]) if data["bins"].shape == () else -1
    names = data["names"]
    t = len(names)
    if names.ndim != 1 or names.dtype.kind != "U" or len(set(names.tolist())) != t:
        raise bad("'names' must be a 1-D array of distinct strings")
    for key, kind in _EXPECTED.items():
        arr = data[key]
        if arr.shape != (t,) or arr.dtype.kind != kind:
            raise bad(f"array {key!r} has shape {arr.shape} dtype {arr.dtype}, expected ({t},) kind {kind!r}")
    hist = data["hist"]
    if hist.shape != (t, bins) or hist.dtype != np.int64 or (hist < 0).any():
        raise bad(f"'hist' has shape {hist.shape} dtype {hist.dtype}, expected ({t}, {bins}) int64 >= 0")
    counts = np.concatenate([data["numel"], data["samples"], data["zeros"]])
    if (counts < 0).any() or not np.all(np.isfinite(data["hist_range"])) or (data["hist_range"] < 0).any():
        raise bad("negative counts or a bad histogram range")
    tensors = {}
    for i, name in enumerate(names.tolist()):
        has = bool(data["has_hist"][i])
        tensors[name] = TensorStats(
            min=float(data["min"][i]),
            max=float(data["max"][i]),
            numel=int(data["numel"][i]),
            samples=int(data["samples"][i]),
            hist_range=float(data["hist_range"][i]),
            hist=hist[i].copy() if has else None,
            zeros=int(data["zeros"][i]),
        )
    return CalibrationStats(tensors, bins)  # __post_init__ validates bins
