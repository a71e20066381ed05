"""Data movement (concat, reshape, transpose, slice, split, pad, gather, expand, cast) and reduce."""

from __future__ import annotations

import numpy as np

from ..errors import UserError
from ..ir import Op
from .registry import float_kernel


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of an IR dtype name (bfloat16 and float8 kinds come from ml_dtypes)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        kind = getattr(ml_dtypes, name, None)
        if kind is None:
            raise UserError(f"unknown tensor dtype '{name}'; use a numpy dtype name such as float32") from None
        return np.dtype(kind)


@float_kernel("concat")
def concat(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return [np.concatenate(inputs, axis=op.attrs.axis)]


@float_kernel("reshape")
def reshape(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return [inputs[0].reshape(op.attrs.shape)]


@float_kernel("transpose")
def transpose(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return [np.ascontiguousarray(inputs[0].transpose(op.attrs.perm))]


@float_kernel("slice")
def slice_kernel(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a = op.attrs
    x = inputs[0]
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(a.starts, a.ends, a.axes, a.steps, strict=True):
        index[axis % x.ndim] = slice(int(start), int(end), int(step))
    return [x[tuple(index)].copy()]


@float_kernel("split")
def split(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a = op.attrs
    cuts = np.cumsum(a.sizes)[:-1]
    return [part.copy() for part in np.split(inputs[0], cuts, axis=a.axis)]


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


@float_kernel("pad")
def pad(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    # Negative ONNX pads crop; numpy pads only grow, so pad the positive part and then crop.
    a = op.attrs
    x = inputs[0]
    rank = x.ndim
    begins, ends = np.asarray(a.pads[:rank], np.int64), np.asarray(a.pads[rank:], np.int64)
    width = list(zip(np.maximum(begins, 0).tolist(), np.maximum(ends, 0).tolist(), strict=True))
    mode = _PAD_MODES[a.mode]
    if mode == "constant":
        y = np.pad(x, width, mode="constant", constant_values=np.asarray(a.value).astype(x.dtype))
    else:
        y = np.pad(x, width, mode=mode)
    crop = tuple(slice(int(max(-b, 0)), int(n - max(-e, 0))) for b, e, n in zip(begins, ends, y.shape, strict=True))
    return [y[crop].copy()]


@float_kernel("gather")
def gather(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, indices = inputs
    axis = op.attrs.axis % x.ndim
    n = x.shape[axis]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise UserError(
            f"op '{op.name}' (gather): index out of range [{-n}, {n - 1}] on axis {axis}; "
            "check the indices the model feeds"
        )
    return [np.take(x, indices.astype(np.int64), axis=axis)]


@float_kernel("expand")
def expand(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x = inputs[0]
    return [np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(op.attrs.shape))).copy()]


@float_kernel("cast")
def cast(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return [inputs[0].astype(numpy_dtype(op.attrs.dtype))]


_REDUCERS = {"mean": np.mean, "max": np.max, "min": np.min, "sum": np.sum}


@float_kernel("reduce")
def reduce(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a = op.attrs
    x = inputs[0]
    axes = tuple(sorted(ax % x.ndim for ax in a.axes))
    y = _REDUCERS[a.kind](x, axis=axes, keepdims=a.keepdims)
    return [np.asarray(y).astype(x.dtype, copy=False)]
