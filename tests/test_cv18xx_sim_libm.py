"""The simulator's expf (backends/cv18xx/sim_libm.py) is the C library's, bit for bit: the vendor runtime's CPU
softmax calls it, and it is not the correctly rounded exp."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import numpy as np

from npuc.backends.cv18xx.sim_libm import expf


def _libm_expf(x: np.ndarray) -> np.ndarray:
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    return np.array([libm.expf(float(v)) for v in x], np.float32)


def test_expf_equals_the_c_library() -> None:
    name, version = platform.libc_ver()
    assert name == "glibc" and tuple(map(int, version.split("."))) >= (2, 28)  # the algorithm modelled
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.uniform(-103.9, 88.7, 60_000),  # the whole range, subnormal results included
        rng.uniform(-20.0, 0.0, 60_000),  # where a softmax's exp(x - max) lives
        np.float32([0.0, -0.0, 1.0, -1.0, 88.0, -87.0, -103.0]),
    ]).astype(np.float32)  # fmt: skip
    got, want = expf(x), _libm_expf(x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # ...and that is not the correctly rounded exp: a simulator rounding the exact value differs from the
    # runtime on about one input in a thousand, by one unit in the last place
    exact = np.exp(x.astype(np.float64)).astype(np.float32)
    differ = got != exact
    assert 20 < differ.sum() < 1000
    assert np.abs(got[differ].view(np.int32) - exact[differ].view(np.int32)).max() == 1


def test_expf_out_of_range_equals_the_c_library() -> None:
    """Underflow to 0 (an attention mask's -FLT_MAX), overflow to +inf, the edges, infinities and NaN."""
    x = np.float32([-3.4028235e38, -1e30, -104.0, -103.972, -103.97, -87.5, 88.72, 88.7229, 88.8, 1e30,
                    -np.inf, np.inf, np.nan])  # fmt: skip
    got, want = expf(x), _libm_expf(x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
