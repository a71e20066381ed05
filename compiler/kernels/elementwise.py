"""Broadcasting arithmetic (eltwise, prelu, channel_scale), layer normalization and softmax."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ..ir import Op
from .activation import apply_activation
from .registry import float_kernel


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # ONNX integer Div truncates toward zero (C semantics); numpy's // floors.
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))
    return q + fix.astype(q.dtype)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        with np.errstate(divide="ignore"):
            return _int_div(a, b)
    return np.divide(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # The result has the base's type (ONNX Pow); integer powers go through float64 like std::pow.
    if np.issubdtype(a.dtype, np.integer):
        return np.power(a.astype(np.float64), b.astype(np.float64))
    if a.dtype != b.dtype:
        return np.power(a.astype(np.float64), b.astype(np.float64))
    return np.power(a, b)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": _div,
    "max": np.maximum,
    "min": np.minimum,
    "pow": _pow,
}


@float_kernel("eltwise")
def eltwise(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    fn = _BINARY[op.attrs.kind]
    dtype = inputs[0].dtype
    out = functools.reduce(lambda a, b: np.asarray(fn(a, b)).astype(dtype, copy=False), inputs)
    out = np.broadcast_to(out, np.broadcast_shapes(*(x.shape for x in inputs)))
    return [apply_activation(np.array(out, dtype=dtype), op.attrs.act)]


@float_kernel("prelu")
def prelu(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, slope = inputs
    return [np.where(x < 0, x * slope.astype(x.dtype), x).astype(x.dtype)]


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast along `axis` of an ndim-array."""
    shape = [1] * ndim
    shape[axis] = v.size
    return v.reshape(shape)


@float_kernel("channel_scale")
def channel_scale(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, scale, bias = inputs
    axis = op.attrs.axis % x.ndim
    y = x * _along(scale.astype(x.dtype), axis, x.ndim) + _along(bias.astype(x.dtype), axis, x.ndim)
    return [apply_activation(y, op.attrs.act)]


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """Numerically stable softmax along `axis`."""
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


@float_kernel("layer_norm")
def layer_norm(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x = inputs[0]
    axes = tuple(range(op.attrs.axis % x.ndim, x.ndim))
    x64 = x.astype(np.float64)
    centred = x64 - x64.mean(axis=axes, keepdims=True)
    normed = centred / np.sqrt((centred * centred).mean(axis=axes, keepdims=True) + op.attrs.epsilon)
    y = normed * inputs[1]
    if len(inputs) > 2:
        y = y + inputs[2]
    return [y.astype(x.dtype)]


@float_kernel("softmax")
def softmax_kernel(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x = inputs[0]
    axis = op.attrs.axis % max(x.ndim, 1)
    if op.attrs.coerce_2d:
        lead = int(np.prod(x.shape[:axis], dtype=np.int64))
        return [softmax(x.reshape(lead, -1), 1).reshape(x.shape)]
    return [softmax(x, axis)]
