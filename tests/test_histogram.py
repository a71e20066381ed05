"""Tests for passes/calibration/histogram.py: one- and two-pass statistics, exact shard merging, threshold methods,
.npz files."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from golden import GOLDEN_ROOT

from npuc.compiler.errors import UserError
from npuc.passes.calibration import calitable as ct
from npuc.passes.calibration import histogram as hg
from npuc.passes.calibration import stats_file as sf
from npuc.passes.calibration import threshold_methods as tm

GOLDEN = GOLDEN_ROOT
RNG = np.random.default_rng(7)


def _samples(n: int = 12) -> list[dict[str, np.ndarray]]:
    out = []
    for i in range(n):
        x = RNG.normal(0, 1 + 0.3 * i, (2, 8, 16)).astype(np.float32)
        out.append({"conv": x, "relu": np.maximum(x, 0), "lap": RNG.laplace(0, 1, 500).astype(np.float32)})
    return out


def _run(samples, base: hg.CalibrationStats | None = None, phase: str = "both") -> hg.CalibrationStats:
    stats = hg.CalibrationStats() if base is None else base
    if phase in ("range", "both"):
        for s in samples:
            for name, x in s.items():
                stats.observe_range(name, x)
        if phase == "range":
            return stats
        stats = stats.freeze()
    for s in samples:
        for name, x in s.items():
            stats.observe_histogram(name, x)
    return stats


def test_merged_shards_equal_single_run_byte_for_byte(tmp_path):
    samples = _samples()
    single = _run(samples)
    a, b = samples[:5], samples[5:]
    frozen = _run(a, phase="range").merge(_run(b, phase="range")).freeze()
    shard_a = _run(a, frozen.copy(), phase="hist")
    later = frozen.copy()
    later.first = len(a)  # without sample keys, a histogram shard is told where its samples start
    shard_b = _run(b, later, phase="hist")
    merged = shard_a.merge(shard_b)
    assert frozen.tensors["conv"].hist.sum() == 0  # shards never wrote into the shared frozen copy
    sf.save_stats(single, tmp_path / "single.npz")
    sf.save_stats(merged, tmp_path / "merged.npz")
    # merge the saved shard files too, as a sharded CLI run would
    sf.save_stats(shard_a, tmp_path / "a.npz")
    sf.save_stats(shard_b, tmp_path / "b.npz")
    from_files = sf.load_stats(tmp_path / "a.npz").merge(sf.load_stats(tmp_path / "b.npz"))
    sf.save_stats(from_files, tmp_path / "files.npz")
    ref = (tmp_path / "single.npz").read_bytes()
    assert (tmp_path / "merged.npz").read_bytes() == ref
    assert (tmp_path / "files.npz").read_bytes() == ref
    for method in tm.THRESHOLD_METHODS:
        assert tm.table_rows(merged, method) == tm.table_rows(single, method)
    st = single.tensors["conv"]
    assert st.numel == 12 * 256 and st.samples == 12 and int(st.hist.sum()) + st.zeros == 12 * 256


@pytest.mark.parametrize("histogram", hg.HISTOGRAMS)
def test_shard_order_never_matters_sample_order_only_for_tpu_mlir(histogram: str):
    # sample i has sigma 1 + 0.3 i; ordered by absmax, so that the range keeps growing whatever the draw
    samples = sorted(_samples(), key=lambda s: float(np.abs(s["conv"]).max()))
    fresh = lambda **kw: hg.CalibrationStats(histogram=histogram, **kw)  # noqa: E731
    late = fresh(first=6)  # a shard that knows its place merges in any order
    ranges = _run(samples[6:], late, phase="range").merge(_run(samples[:6], fresh(), phase="range"))
    assert sorted(ranges.tensors["conv"].peaks) == (list(range(12)) if histogram == "tpu-mlir" else [])
    single = _run(samples, fresh())
    assert tm.table_rows(_run(samples, ranges.freeze(), phase="hist"), "kl") == tm.table_rows(single, "kl")
    widening = single.tensors["conv"]
    reverse = _run(samples[::-1], fresh()).tensors["conv"]
    assert widening.absmax == reverse.absmax and widening.hist.sum() == reverse.hist.sum()
    if histogram == "global":  # one range for all samples: the order changes nothing
        assert np.array_equal(widening.hist, reverse.hist)
        assert (widening.hist_range, len(widening.hist)) == hg.global_geometry(widening.absmax, 2048)
    else:  # tpu-mlir's histogram grows with the running absmax: its geometry follows the sample order
        assert len(widening.hist) > len(reverse.hist) == 2048


def _grid_run(samples) -> hg.CalibrationStats:
    stats = hg.CalibrationStats(with_grid=True)
    for s in samples:
        for name, x in s.items():
            stats.observe_range(name, x)
    return stats


def test_global_histogram_in_one_pass_equals_two_passes_in_any_order_and_sharding(tmp_path):
    """The range pass's grid gives the two-pass global histogram exactly: in one run, in shards merged in either
    order (their grids at different exponents), and per shard at the whole run's geometry (the method choice's
    folds), zeros, an all-zero sample and a tiny one included."""
    samples = _samples()
    samples.insert(2, {k: np.zeros_like(v) for k, v in samples[0].items()})
    samples.insert(4, {k: v * np.float32(1e-30) for k, v in samples[1].items()})
    two = _run(samples)
    one = _grid_run(samples).histograms()
    a, b = _grid_run(samples[:5]), _grid_run(samples[5:])
    assert a.tensors["conv"].grid_exp < b.tensors["conv"].grid_exp  # the later samples are wider
    for merged in (a.merge(b), b.merge(a)):
        got = merged.histograms()
        for name, st in two.tensors.items():
            assert np.array_equal(got.tensors[name].hist, st.hist), name
            assert got.tensors[name].zeros == st.zeros and got.tensors[name].hist_range == st.hist_range
    sf.save_stats(two, tmp_path / "two.npz")
    sf.save_stats(one, tmp_path / "one.npz")
    assert (tmp_path / "one.npz").read_bytes() == (tmp_path / "two.npz").read_bytes()
    whole = a.merge(b)
    folds = a.histograms(whole).merge(b.histograms(whole))
    sf.save_stats(folds, tmp_path / "folds.npz")
    assert (tmp_path / "folds.npz").read_bytes() == (tmp_path / "two.npz").read_bytes()
    with pytest.raises(UserError, match="do not cover"):
        b.histograms(a)


@pytest.mark.parametrize("absmax", [1e-30, 0.37, 1.0, 2047.0, 3.3e12])
def test_global_geometry_is_power_of_two_and_never_coarser(absmax: float):
    top, count = hg.global_geometry(absmax, 2048)
    width = top / (count - 1)
    assert np.frexp(width)[0] == 0.5  # a power of two: every edge is exact
    assert width <= absmax / 2047 < 2 * width and 2048 <= count <= 4095
    assert (count - 1.5) * width <= absmax < (count - 0.5) * width  # absmax falls in the last bin
    assert float(hg.bin_width(top, count)) == width


def test_one_pass_equals_two_passes_for_tpu_mlir_histogram():
    """observe_growing (one pass, as tpu-mlir works) gives the two-pass statistics exactly: growth, an all-zero
    sample, a tiny one and a restart (more than 8M bins) included."""
    samples = _samples()
    samples.insert(3, {k: np.zeros_like(v) for k, v in samples[0].items()})
    samples.insert(5, {k: v * np.float32(1e-10) for k, v in samples[1].items()})
    samples.insert(7, {k: v * np.float32(1e6) for k, v in samples[2].items()})  # restarts every histogram
    with pytest.warns(UserWarning, match="restarts"):
        two = _run(samples, hg.CalibrationStats(histogram="tpu-mlir"))
    one = hg.CalibrationStats(histogram="tpu-mlir")
    with pytest.warns(UserWarning, match="restarts"):
        for s in samples:
            for name, x in s.items():
                one.observe_growing(name, x)
    one = one.finish_growing()
    for name, st in two.tensors.items():
        got = one.tensors[name]
        assert np.array_equal(got.hist, st.hist) and got.hist_range == st.hist_range, name
        assert (got.zeros, got.binned, got.peaks, got.min, got.max) == (st.zeros, st.binned, st.peaks, st.min, st.max)
    assert tm.table_rows(one, "kl") == tm.table_rows(two, "kl")
    with pytest.raises(UserError, match="needs the ranges first"):
        hg.CalibrationStats().observe_growing("conv", samples[0]["conv"])


def test_statistics_of_two_geometries_do_not_merge():
    samples = _samples(2)
    a = _run(samples, hg.CalibrationStats(), phase="range")
    b = _run(samples, hg.CalibrationStats(histogram="tpu-mlir"), phase="range")
    with pytest.raises(UserError, match="same --histogram"):
        a.merge(b)
    with pytest.raises(UserError, match="--histogram 'sorted' is not one of global, tpu-mlir"):
        hg.CalibrationStats(histogram="sorted")


def test_geometry_follows_tpu_mlir_combine_histogram():
    """Bins appended at the old step `range / bins`; float32 range until the first extension, float64 after."""
    geometry, final = hg.histogram_geometry({0: 2.0, 1: 1.0, 2: 3.0, 3: 3.5, 4: 0.0}, 2048)
    step = 2.0 / 2048
    added = int((3.0 - 2.0) // step + 1)
    th = added * step + 2.0
    step2 = th / (2048 + added)
    added2 = int((3.5 - th) // step2 + 1)
    assert geometry[0] == geometry[1] == (2.0, 2048) and geometry[2] == (th, 2048 + added)
    assert geometry[3] == final == (added2 * step2 + th, 2048 + added + added2)
    assert geometry[4] == (final[0], 0)  # an all-zero sample adds nothing
    # more than 8M bins: tpu-mlir restarts from the current sample, the earlier ones are dropped
    with pytest.warns(UserWarning, match="differ too much"):
        geometry, final = hg.histogram_geometry({0: 1e-3, 1: 100.0}, 2048)
    assert geometry == {0: (float(np.float32(1e-3)), 0), 1: (100.0, 2048)} and final == (100.0, 2048)


def test_histogram_matches_tpu_mlir_binning():
    x = np.concatenate([RNG.normal(0, 2, 5000), [0.0, 0.0, -0.0]]).astype(np.float32)
    absmax = np.float32(np.abs(x).max())
    counts, zeros = hg.histogram_abs(x, absmax, 2048)
    t = np.abs(x)
    t = t[t != 0]
    width = absmax / np.float32(2047)
    ref, _ = np.histogram(np.floor(t / width + np.float32(0.5)), bins=2048, range=(0, 2047))
    assert counts.tolist() == ref.tolist() and zeros == 3
    assert counts[-1] >= 1  # the absmax lands in the last bin


def _kl_reference(hist: np.ndarray, bins: int = 128) -> np.ndarray:
    """Direct per-bin transcription of the algorithm in quant.md §1.2 (slow loops, float64)."""
    n = len(hist)
    count = hist.sum()
    costs = []
    for i in range(bins, n + 1, bins):
        p = np.zeros(i)
        for j in range(n):
            p[min(j, i - 1)] += hist[j]
        p /= count
        q = np.zeros(i)
        expand = i // bins
        first = hist[:i].sum()
        for g in range(bins):
            seg = hist[g * expand : (g + 1) * expand]
            base = seg.sum() / max(int((seg > 0).sum()), 1) / first
            q[g * expand : (g + 1) * expand] = np.where(seg > 0, base, 0.0)
        costs.append(float(np.sum(p * (np.log10(p + 1e-30) - np.log10(q + 1e-30)))))
    return np.array(costs)


@pytest.mark.parametrize("kind", ["normal", "laplace", "cubed", "sparse"])
def test_kl_vectorized_equals_reference(kind):
    x = {
        "normal": lambda: RNG.normal(0, 1, 200_000),
        "laplace": lambda: RNG.laplace(0, 1, 200_000),
        "cubed": lambda: RNG.normal(0, 1, 5000) ** 3,
        "sparse": lambda: RNG.normal(0, 1, 300),
    }[kind]().astype(np.float32)
    hist, _ = hg.histogram_abs(x, np.abs(x).max(), 2048)
    got = tm.kl_divergences(hist)
    ref = _kl_reference(hist)
    assert got.shape == (16,)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)
    assert int(np.argmin(got)) == int(np.argmin(ref))


def test_kl_pads_to_multiple_of_dst_bins():
    hist = RNG.integers(0, 50, 1000)
    padded = np.concatenate([hist, np.zeros(24, dtype=hist.dtype)])
    np.testing.assert_allclose(tm.kl_divergences(hist), _kl_reference(padded), rtol=1e-9)
    assert tm.kl_threshold(np.zeros(2048, np.int64), 0.1) == 0.0


def _single_tensor(x: np.ndarray) -> hg.TensorStats:
    stats = hg.CalibrationStats()
    stats.observe_range("t", x)
    stats = stats.freeze()
    stats.observe_histogram("t", x)
    return stats.tensors["t"]


def test_threshold_methods_on_gaussian_and_laplacian():
    rng = np.random.default_rng(11)  # its own generator: the figures must not depend on which tests ran first
    g = _single_tensor(rng.normal(0, 1, 1_000_000).astype(np.float32))
    lap = _single_tensor(rng.laplace(0, 1, 1_000_000).astype(np.float32))
    assert tm.compute_threshold(g, "max") == g.absmax
    # KL: a multiple of 128 bins, inside (3 sigma, absmax]
    kl_g = tm.compute_threshold(g, "kl")
    assert 3.0 < kl_g <= g.absmax
    kl_l = tm.compute_threshold(lap, "kl")
    assert 6.0 < kl_l < 0.95 * lap.absmax  # heavy tail gets clipped
    assert kl_l == pytest.approx(lap.width * 128 * round(kl_l / (lap.width * 128)), rel=1e-6)
    # MSE: the known optimal 8-bit clipping (ACIQ: 3.92 sigma for Gauss, 9.90 b for Laplace)
    assert 3.7 < tm.compute_threshold(g, "mse") < 4.2
    assert 9.0 < tm.compute_threshold(lap, "mse") < 11.0
    # percentile of |x|: Gaussian 99.99% two-sided quantile is 3.8906
    assert tm.compute_threshold(g, "percentile", percentile=99.99) == pytest.approx(3.8906, abs=0.03)
    assert tm.compute_threshold(g, "percentile", percentile=50) == pytest.approx(0.6745, abs=0.01)


def test_percentile_counts_zeros_and_uniform_edges():
    u = _single_tensor(np.linspace(0, 1, 100_001, dtype=np.float32))
    assert tm.compute_threshold(u, "percentile", percentile=99.99) == pytest.approx(0.9999, abs=2 * u.width)
    half_zero = _single_tensor(np.concatenate([np.zeros(1000), np.ones(1000)]).astype(np.float32))
    assert half_zero.zeros == 1000
    assert tm.compute_threshold(half_zero, "percentile", percentile=40) == tm.MIN_THRESHOLD


def test_degenerate_tensors_and_table_rows():
    stats = hg.CalibrationStats()
    for _ in range(2):
        stats.observe_range("zero", np.zeros(8, np.float32))
        stats.observe_range("relu", np.array([0.0, 1.0, 3.0], np.float32))
    stats = stats.freeze()
    for _ in range(2):
        stats.observe_histogram("zero", np.zeros(8, np.float32))
        stats.observe_histogram("relu", np.array([0.0, 1.0, 3.0], np.float32))
    rows = tm.table_rows(stats, "kl")
    assert rows["zero"] == (1e-5, 0.0, 1e-5)
    assert rows["relu"] == (3.0, 0.0, 3.0)
    table = ct.table_from_rows(rows, method="kl", sample_number=2)
    assert ct.format_table(table).endswith("zero 0.0000100 0.0000000 0.0000100\nrelu 3.0000000 0.0000000 3.0000000\n")


def test_golden_smallcnn_input_statistics():
    """The range pass over tpu-mlir's 20 calibration samples reproduces its table row for `input`."""
    stats = hg.CalibrationStats()
    files = sorted((GOLDEN / "cv18xx" / "smallcnn_cali_samples").glob("*.npz"))
    assert len(files) == 20
    xs = [np.load(f)["input"] for f in files]
    for x in xs:
        stats.observe_range("input", x)
    stats = stats.freeze()
    for x in xs:
        stats.observe_histogram("input", x)
    golden_rows = (GOLDEN / "cv18xx" / "smallcnn_cali_table.txt").read_text().splitlines()
    ours = ct.format_table(ct.table_from_rows(tm.table_rows(stats, "kl"))).splitlines()
    assert ours[-1] == golden_rows[10] == "input 4.7247663 -4.7247663 4.4531603"
    assert f"{stats.tensors['input'].min:.7f} {stats.tensors['input'].max:.7f}" == "-4.7247663 4.4531603"


def test_user_errors(tmp_path):
    stats = hg.CalibrationStats()
    stats.observe_range("a", np.ones(4, np.float32))
    with pytest.raises(UserError, match="no frozen range"):
        stats.observe_histogram("a", np.ones(4))
    with pytest.raises(UserError, match="needs the histogram pass"):
        tm.compute_threshold(stats.tensors["a"], "kl")
    with pytest.raises(UserError, match="NaN or Inf"):
        stats.observe_range("a", np.array([np.nan], np.float32))
    frozen = stats.freeze()
    with pytest.raises(UserError, match="exceeds the range pass"):
        frozen.observe_histogram("a", np.full(4, 2.0, np.float32))
    with pytest.raises(UserError, match="range pass after freeze"):
        frozen.observe_range("a", np.ones(4))
    with pytest.raises(UserError, match="unknown calibration method 'entropy'"):
        tm.compute_threshold(frozen.tensors["a"], "entropy")
    with pytest.raises(UserError, match="does not take parameters"):
        tm.compute_threshold(frozen.tensors["a"], "max", percentile=3)
    with pytest.raises(UserError, match="percentile 0"):
        tm.compute_threshold(frozen.tensors["a"], "percentile", percentile=0)
    with pytest.raises(UserError, match="bins"):
        hg.CalibrationStats(bins=16)
    with pytest.raises(UserError, match="range-pass shard with a histogram-pass shard"):
        stats.merge(frozen)
    other = hg.CalibrationStats()
    other.observe_range("a", np.full(4, 3.0, np.float32))
    with pytest.raises(UserError, match="different ranges"):
        frozen.merge(other.freeze())


def test_corrupt_statistics_files(tmp_path):
    stats = _run(_samples(2))
    good = tmp_path / "good.npz"
    sf.save_stats(stats, good)
    data = good.read_bytes()
    cases = {
        "truncated.npz": data[: len(data) // 2],
        "random.npz": RNG.integers(0, 256, 4000, dtype=np.uint8).tobytes(),
        "empty.npz": b"",
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(UserError, match="not a npuc statistics"):
            sf.load_stats(tmp_path / name)
    # a member whose header claims a huge array must not be allocated
    liar = tmp_path / "liar.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(liar, "w") as dst:
        for info in src.infolist():
            blob = src.read(info)
            if info.filename == "hist.npy":  # a much larger shape than the data
                length = sum(len(st.hist) for st in stats.tensors.values())
                blob = blob.replace(f"'shape': ({length},)".encode(), b"'shape': (9999999,)")
                assert b"9999999" in blob
            dst.writestr(info, blob)
    with pytest.raises(UserError, match="size does not match"):
        sf.load_stats(liar)
    # a compression method zipfile does not know; a .npy header that does not parse (bench/fuzz.py seed 13)
    method, header = tmp_path / "method.npz", tmp_path / "header.npz"
    blob = bytearray(data)
    for at in (0, blob.index(b"PK\x01\x02") + 2):  # the first member's local and central headers
        blob[at + 8 : at + 10] = (99).to_bytes(2, "little")
    method.write_bytes(bytes(blob))
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(header, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info).replace(b"'descr':", b"'descr'(", 1))
    for broken in (method, header):
        with pytest.raises(UserError, match="not a npuc statistics"):
            sf.load_stats(broken)
    # well-formed zip, wrong contents
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, names=np.array(["a"]), bins=np.array(2048))
    with pytest.raises(UserError, match="corrupt statistics file: missing array"):
        sf.load_stats(wrong)
    with pytest.raises(UserError, match="cannot read statistics"):
        sf.load_stats(tmp_path / "missing.npz")
    assert tm.table_rows(sf.load_stats(good), "mse") == tm.table_rows(stats, "mse")


def test_kl_threshold_of_a_range_near_float32_max_stays_finite() -> None:
    """An attention mask filled with -FLT_MAX: the float32 product would overflow to inf; the threshold is
    float32's largest value instead (no warning, no inf row in the table)."""
    import warnings

    from npuc.passes.calibration.threshold_methods import kl_threshold

    hist = np.zeros(2048)
    hist[-1] = 10.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = kl_threshold(hist, float(np.finfo(np.float32).max) / 2048)
    assert value == float(np.finfo(np.float32).max)
