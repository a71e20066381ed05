"""Elementwise activations (the `act` of fused ops and the standalone `activation` op), and erf."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..ir import Op
from ..ops import Activation
from .registry import float_kernel

# Maclaurin series of erf: 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1)). 48 terms reach float64
# rounding for |x| < 3; beyond that the asymptotic expansion of erfc is accurate to ~1e-9.
_ERF_SERIES_LIMIT = 3.0
_ERF_SERIES = np.array(
    [(-1) ** n * 2 / math.sqrt(math.pi) / (math.factorial(n) * (2 * n + 1)) for n in range(48)], np.float64
)
# erfc(x) ~ exp(-x^2) / (x sqrt(pi)) * sum_n (-1)^n (2n-1)!! / (2x^2)^n, truncated before it diverges at x=3.
_ERFC_ASYMPTOTIC = np.array([(-1) ** n * math.prod(range(1, 2 * n, 2)) for n in range(9)], np.float64)


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorized error function, accurate to float64 ~1e-9 absolute; returns x's float dtype."""
    x64 = np.asarray(x, np.float64)
    ax = np.abs(x64)
    small = ax < _ERF_SERIES_LIMIT
    xs = np.where(small, x64, 0.0)
    x2 = xs * xs
    series = np.zeros_like(x64)
    for c in _ERF_SERIES[::-1]:  # Horner in x^2
        series = series * x2 + c
    series *= xs
    xl = np.where(small, _ERF_SERIES_LIMIT, ax)
    inv = 1.0 / (2.0 * xl * xl)
    tail = np.zeros_like(x64)
    for c in _ERFC_ASYMPTOTIC[::-1]:
        tail = tail * inv + c
    erfc = np.exp(-xl * xl) / (xl * math.sqrt(math.pi)) * tail
    out = np.where(small, series, np.copysign(1.0 - erfc, x64))
    dtype = x.dtype if np.issubdtype(np.asarray(x).dtype, np.floating) else np.float32
    return out.astype(dtype)


def sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _clip(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        lo_i = info.min if lo == -np.inf else max(info.min, math.ceil(lo))
        hi_i = info.max if hi == np.inf else min(info.max, math.floor(hi))
        return np.clip(x, x.dtype.type(lo_i), x.dtype.type(hi_i))
    return np.clip(x, x.dtype.type(lo), x.dtype.type(hi))


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1).astype(x.dtype)


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    t = x.dtype.type
    if approximate == "tanh":
        inner = t(math.sqrt(2 / math.pi)) * (x + t(0.044715) * x * x * x)
        return t(0.5) * x * (t(1) + np.tanh(inner))
    return t(0.5) * x * (t(1) + erf(x * t(1 / math.sqrt(2))))


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x > 0, x, x.dtype.type(alpha) * np.expm1(np.minimum(x, 0))).astype(x.dtype)


_ACTIVATIONS: dict[str, Callable[[np.ndarray, Activation], np.ndarray]] = {
    "relu": lambda x, a: np.maximum(x, x.dtype.type(0)),
    "leaky_relu": lambda x, a: np.where(x >= 0, x, x * x.dtype.type(a.alpha)),
    "clip": lambda x, a: _clip(x, float(a.lo), float(a.hi)),
    "sigmoid": lambda x, a: sigmoid(x),
    "tanh": lambda x, a: np.tanh(x),
    "hard_sigmoid": lambda x, a: _hard_sigmoid(x, a.alpha, a.beta),
    "hard_swish": lambda x, a: x * _hard_sigmoid(x, 1 / 6, 0.5),
    "gelu": lambda x, a: _gelu(x, a.approximate),
    "erf": lambda x, a: erf(x),
    "elu": lambda x, a: _elu(x, a.alpha),
    # IEEE results outside the domain (sqrt/log of a negative: NaN, 1/0: inf), as onnxruntime gives them
    "sqrt": lambda x, a: _ieee(np.sqrt, x),
    "exp": lambda x, a: _ieee(np.exp, x),
    "log": lambda x, a: _ieee(np.log, x),
    "reciprocal": lambda x, a: _ieee(np.reciprocal, x),
    "neg": lambda x, a: np.negative(x),
    "abs": lambda x, a: np.abs(x),
}


def _ieee(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return fn(x)


def apply_activation(x: np.ndarray, act: Activation | None) -> np.ndarray:
    """`act` applied elementwise to `x` (x itself when there is none), keeping x's dtype."""
    if act is None:
        return x
    return np.asarray(_ACTIVATIONS[act.kind](x, act), dtype=x.dtype)


@float_kernel("activation")
def activation_kernel(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return [apply_activation(inputs[0], op.attrs.act)]
