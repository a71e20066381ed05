"""Matrix products: gemm and (batched, broadcasting) matmul."""

from __future__ import annotations

import numpy as np

from ..ir import Op
from .activation import apply_activation
from .registry import float_kernel


@float_kernel("gemm")
def gemm(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a = op.attrs
    x, w = inputs[0], inputs[1]
    x = x.T if a.trans_a else x
    w = w.T if a.trans_b else w
    t = x.dtype.type
    y = np.matmul(x, w.astype(x.dtype, copy=False))
    if a.alpha != 1.0:
        y = y * t(a.alpha)
    if len(inputs) > 2:
        c = inputs[2].astype(x.dtype, copy=False)
        y = y + (c if a.beta == 1.0 else c * t(a.beta))
    return [apply_activation(y, a.act)]


@float_kernel("matmul")
def matmul(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, w = inputs
    return [apply_activation(np.matmul(x, w.astype(x.dtype, copy=False)), op.attrs.act)]
