"""Elementwise activations (the `act` of fused ops and the standalone `activation` op), and erf."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..ir import Op
from ..ops import Activation
from .registry import float_kernel

# erf by cubic Hermite interpolation of a table of math.erf and of its slope 2/sqrt(pi) exp(-x^2) on a 1/128
# grid of [0, 6] (error <= h^4/384 max|erf^(4)| ~ 2e-10; erf is 1 to float64 rounding past 6), and by its
# Maclaurin series below 0.5, where values are small and must be accurate relatively: 2/sqrt(pi) sum (-1)^n
# x^(2n+1) / (n! (2n+1)), 14 terms reach float64 rounding. Several times faster than a series over the range.
_ERF_STEP = 1.0 / 128
_ERF_END = 6.0
_ERF_SERIES_LIMIT = 0.5
_ERF_SERIES = np.array(
    [(-1) ** n * 2 / math.sqrt(math.pi) / (math.factorial(n) * (2 * n + 1)) for n in range(14)], np.float64
)


def _erf_cubics() -> np.ndarray:
    """Per grid interval [x_i, x_i + h]: the coefficients c0..c3 of erf(x_i + t h) = c0 + c1 t + c2 t^2 + c3 t^3."""
    grid = np.arange(round(_ERF_END / _ERF_STEP) + 1) * _ERF_STEP
    y = np.array([math.erf(v) for v in grid])
    d = 2 / math.sqrt(math.pi) * np.exp(-grid * grid) * _ERF_STEP  # the slope per unit of t
    y0, y1, d0, d1 = y[:-1], y[1:], d[:-1], d[1:]
    return np.stack([y0, d0, 3 * (y1 - y0) - 2 * d0 - d1, 2 * (y0 - y1) + d0 + d1])


_ERF_CUBICS = _erf_cubics()


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorized error function, accurate to float64 ~1e-10 absolute (~1e-16 relative below 0.5); returns x's
    float dtype."""
    x64 = np.array(x, np.float64, ndmin=1)
    ax = np.minimum(np.abs(x64), _ERF_END)
    pos = np.nan_to_num(ax) * (1 / _ERF_STEP)
    index = np.minimum(pos.astype(np.intp), _ERF_CUBICS.shape[1] - 1)
    t = pos - index
    c0, c1, c2, c3 = (row[index] for row in _ERF_CUBICS)
    out = c0 + t * (c1 + t * (c2 + t * c3))
    small = ax < _ERF_SERIES_LIMIT
    if small.any():
        xs = ax[small]
        x2, series = xs * xs, np.zeros_like(xs)
        for c in _ERF_SERIES[::-1]:  # Horner in x^2
            series = series * x2 + c
        out[small] = series * xs
    out = np.where(np.isnan(x64), np.nan, np.copysign(out, x64))
    dtype = x.dtype if np.issubdtype(np.asarray(x).dtype, np.floating) else np.float32
    return out.astype(dtype).reshape(np.shape(x))


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
