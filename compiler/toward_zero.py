"""float32 sums whose every addition rounds toward zero, term after term (the cv18xx TIU's bf16 accumulator),
and the TIU's orders of them: `accumulate_windows` (conv, depthwise, average pool) and `accumulate_products`
(matrix multiply), fitted on the vendor simulator (compiler/kernels/quantized/bf16_conv.py tells how).

`TowardZeroSum.add_terms` adds a stack of terms in order. Two exact ways, one result:
- the CPU's own rounding: the floating-point environment's rounding mode set to toward-zero (C `fesetround`,
  through ctypes) around numpy's float32 additions, which then round as IEEE 754 says. Used only after a
  self-test has shown, on this machine, that numpy's additions in that mode give the software results below
  (array lengths that take the vector and the scalar loops, subnormals, overflow); the mode is restored after
  each stack, also when an exception leaves it;
- software: the nearest float32 sum s and its exact error e (TwoSum, exact whenever s is finite, subnormals
  included): the true sum is s + e, so where e is non-zero with the sign opposite to s's, s lies beyond it
  and the result is the next float32 toward zero (one less in s's magnitude bits).
Sums with an operand or a nearest sum that is not finite (Inf, NaN) go through `add_toward_zero_wide`, the
float64 formulation, which defines those cases; the CPU path is taken only for stacks of finite terms.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

# FE_TOWARDZERO differs between architectures (x86 0xc00, ARM 0xc00000, POWER / RISC-V / s390 1); each is
# tried and kept only if the self-test passes with it
_MODE_CANDIDATES = (0xC00, 0xC00000, 1, 3)
_hardware: tuple[ctypes._CFuncPtr, ctypes._CFuncPtr, int] | None | bool = False  # False: not probed yet


def add_toward_zero_wide(acc: np.ndarray, term: np.ndarray) -> np.ndarray:
    """float32 `acc + term` rounded toward zero through float64: the float64 sum and its exact error (TwoSum)
    give the true sum's side of the nearest float32, so the result is exact even when float64 cannot hold the
    sum; Inf and NaN operands follow from the same arithmetic."""
    a = np.asarray(acc, np.float64)
    b = np.asarray(term, np.float64)
    s = a + b
    t = s - a
    err = (a - (s - t)) + (b - t)  # the exact sum is s + err
    with np.errstate(over="ignore", invalid="ignore"):
        nearest = s.astype(np.float32)
        beyond = (nearest.astype(np.float64) - s) - err  # nearest - exact sum; its sign is exact
    outward = (beyond != 0) & (np.signbit(beyond) == np.signbit(nearest)) & (nearest != 0)
    return np.where(outward, np.nextafter(nearest, np.float32(0)), nearest).astype(np.float32)


class TowardZeroSum:
    """A float32 accumulator (zeros of `shape`) and the scratch buffers of its software additions."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.acc = np.zeros(shape, np.float32)
        self._scratch: tuple[np.ndarray, ...] | None = None

    def add(self, term: np.ndarray) -> None:
        """acc + term, rounded toward zero (term broadcasts to acc's shape)."""
        self.add_terms(np.asarray(term, np.float32)[None])

    def add_terms(self, terms: np.ndarray) -> None:
        """terms[0], terms[1], ... added in order, each addition rounded toward zero."""
        finite = bool(np.isfinite(terms).all() and np.isfinite(self.acc).all())
        cpu = _cpu_rounding() if finite else None
        if cpu is None:
            for term in terms:
                self._add_software(term)
            return
        acc = self.acc
        with _rounding_mode(*cpu), np.errstate(over="ignore"):  # an overflow rounds to the largest float32
            for term in terms:
                np.add(acc, term, out=acc)

    def _add_software(self, term: np.ndarray) -> None:
        if self._scratch is None:
            shape = self.acc.shape
            self._scratch = (np.empty(shape, np.float32), np.empty(shape, np.float32),
                             np.empty(shape, np.float32), np.empty(shape, bool))  # fmt: skip
        acc, (s, back, err, step) = self.acc, self._scratch
        with np.errstate(over="ignore", invalid="ignore"):
            np.add(acc, term, out=s)
            np.subtract(s, acc, out=back)
            np.subtract(s, back, out=err)
            np.subtract(acc, err, out=err)  # acc's part lost in s
            np.subtract(term, back, out=back)  # term's part lost in s
            np.add(err, back, out=err)
        if not np.isfinite(s).all():
            acc[...] = add_toward_zero_wide(acc, term)
            return
        np.not_equal(np.copysign(err, s, out=back), err, out=step)  # err != 0 with the sign opposite to s's
        np.subtract(s.view(np.int32), step, out=s.view(np.int32))
        self.acc, self._scratch = s, (acc, back, err, step)


def add_toward_zero(acc: np.ndarray, term: np.ndarray) -> np.ndarray:
    """float32 `acc + term` rounded toward zero (software, element-wise, broadcasting)."""
    total = TowardZeroSum(np.broadcast_shapes(np.shape(acc), np.shape(term)))
    total.acc[...] = acc
    total._add_software(np.asarray(term, np.float32))
    return total.acc


CHUNK_ELEMENTS = 1 << 18  # products formed at once before they are added (1 MiB of float32)


def accumulate_windows(win: np.ndarray, w: np.ndarray, group: int, bias: np.ndarray | None = None) -> np.ndarray:
    """float32 sums (N, OC, OH, OW) of bf16 windows `win` (N, C, OH, OW, KH, KW) with filters `w`
    (OC, C/group, KH, KW), plus the fp32 `bias` (OC,), in the TIU's order and rounding."""
    n, c, oh, ow, kh, kw = win.shape
    oc = w.shape[0]
    cg, ocg = c // group, oc // group
    x = np.asarray(win, np.float32)
    f = np.asarray(w, np.float32).reshape(group, ocg, cg, kh, kw)
    total = TowardZeroSum((n, group, ocg, oh * ow))
    step = max(1, CHUNK_ELEMENTS // max(total.acc.size, 1))
    for i in range(kh):
        for j in range(kw):
            # one kernel position's inputs, contiguous per input channel: (cg, n, group, 1, oh * ow)
            xs = np.ascontiguousarray(x[..., i, j].reshape(n, group, cg, oh, ow).transpose(2, 0, 1, 3, 4))
            xs = xs.reshape(cg, n, group, 1, oh * ow)
            fs = np.ascontiguousarray(f[..., i, j].transpose(2, 0, 1))[:, None, :, :, None]
            for k in range(0, cg, step):
                total.add_terms(xs[k : k + step] * fs[k : k + step])
    if bias is not None:
        total.add(np.asarray(bias, np.float32).reshape(1, group, ocg, 1))
    return total.acc.reshape(n, oc, oh, ow)


def accumulate_products(left: np.ndarray, right: np.ndarray, group_width: int, bias: np.ndarray | None = None,
                        ) -> np.ndarray:  # fmt: skip
    """float32 sums (rows, cols) of bf16 matrices `left` (rows, K) @ `right` (K, cols), plus the fp32 `bias`
    (cols,), as the TIU's matrix multiply forms them. K lies in local memory as column groups of
    `group_width` (one per lane); the TIU adds position 0 of every group, then position 1 of every group, and
    so on, each addition rounded toward zero, the bias last. Fitted on the vendor simulator: PP-OCRv6's
    (40 x 160) @ (160 x 80) in groups of 8 agrees on all 3200 sums; K in plain order misses one."""
    left, right = np.asarray(left, np.float32), np.asarray(right, np.float32)
    k_total = left.shape[1]
    order = np.arange(-(-k_total // group_width) * group_width).reshape(-1, group_width).T.ravel()
    order = order[order < k_total]  # position 0 of every group, then position 1, ...
    total = TowardZeroSum((left.shape[0], right.shape[1]))
    step = max(1, CHUNK_ELEMENTS // max(total.acc.size, 1))
    for k in range(0, len(order), step):
        ks = order[k : k + step]
        total.add_terms(left.T[ks][:, :, None] * right[ks][:, None, :])
    if bias is not None:
        total.add(np.asarray(bias, np.float32).reshape(1, -1))
    return total.acc


# ---- the CPU's rounding mode -----------------------------------------------------------------------------


@contextmanager
def _rounding_mode(get: ctypes._CFuncPtr, set_: ctypes._CFuncPtr, mode: int) -> Iterator[None]:
    previous = get()
    if set_(mode):
        raise RuntimeError(f"fesetround({mode:#x}) failed after it had passed the self-test")
    try:
        yield
    finally:
        set_(previous)


def _self_test(get: ctypes._CFuncPtr, set_: ctypes._CFuncPtr, mode: int) -> bool:
    """Do numpy's float32 additions under `mode` give the software's toward-zero sums, bit for bit?"""
    rng = np.random.default_rng(0)
    tiny, big = np.float32(2.0**-149), np.finfo(np.float32).max
    edges = np.array([1, -1, 2.0**-24 * 1.5, -(2.0**-24) * 1.5, tiny, -tiny, 3 * tiny, big, -big, 0, -0.0,
                      2.0**-126, -(2.0**-126), 1e-40, -1e-40], np.float32)  # fmt: skip
    a, b = np.meshgrid(edges, edges)
    bits = rng.integers(0, 1 << 32, (2, 4099), dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = rng.standard_normal((2, 4099)).astype(np.float32) * np.float32(2.0**-130)
    pairs = [(a.ravel(), b.ravel()), tuple(bits), tuple(scaled), (bits[0], scaled[1])]
    for x, y in pairs:
        keep = np.isfinite(x) & np.isfinite(y)
        x, y = x[keep], y[keep]
        want = add_toward_zero(x, y)
        for length in (1, 3, 8, 17, 64, len(x)):  # the scalar and the vector loops, with remainders
            got = x[:length].copy()
            try:
                with _rounding_mode(get, set_, mode), np.errstate(all="ignore"):
                    np.add(got, y[:length], out=got)
            except RuntimeError:
                return False
            if not np.array_equal(got.view(np.uint32), want[:length].view(np.uint32)):
                return False
    return True


def _cpu_rounding() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr, int] | None:
    """(fegetround, fesetround, the toward-zero mode) once the self-test has passed here, else None."""
    global _hardware
    if _hardware is False:
        _hardware = None
        try:
            libm = ctypes.CDLL(ctypes.util.find_library("m") or None)
            get, set_ = libm.fegetround, libm.fesetround
        except (OSError, AttributeError):
            return None
        get.restype, get.argtypes = ctypes.c_int, []
        set_.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
        for mode in _MODE_CANDIDATES:
            if _self_test(get, set_, mode):
                _hardware = (get, set_, mode)
                break
    return _hardware or None
