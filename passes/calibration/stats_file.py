"""Calibration statistics (histogram.py) as a deterministic `.npz` written with fixed zip timestamps (the same
statistics give the same bytes), and its validating reader: sizes and types are checked before anything is
allocated."""

from __future__ import annotations

import io
import tokenize
import zipfile
import zlib
from pathlib import Path
from types import MappingProxyType

import numpy as np

from npuc.compiler.errors import UserError
from npuc.passes.calibration.histogram import HISTOGRAMS, CalibrationStats, TensorStats

FORMAT_VERSION = 2  # 2: per-sample absmax, histograms of any length
MAX_STATS_BYTES = 1 << 31
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
# what a damaged archive raises: zip structure, compression (method, data), .npy header syntax, encryption
_DAMAGE = (zipfile.BadZipFile, ValueError, EOFError, TypeError, NotImplementedError, RuntimeError, zlib.error,
           SyntaxError, tokenize.TokenError)  # fmt: skip


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
    except _DAMAGE as exc:
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
