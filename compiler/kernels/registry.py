"""The kernel registries: op kind → numpy function computing the op's outputs from its input arrays."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir import Op

KernelFn = Callable[[Op, list[np.ndarray]], list[np.ndarray]]

# Filled once at import time by the @float_kernel decorators in the family modules; read-only afterwards.
FLOAT_KERNELS: dict[str, KernelFn] = {}


def float_kernel(kind: str) -> Callable[[KernelFn], KernelFn]:
    """Register `fn` as the float reference kernel of op kind `kind`."""

    def register(fn: KernelFn) -> KernelFn:
        if kind in FLOAT_KERNELS:
            raise ValueError(f"float kernel for {kind!r} registered twice")
        FLOAT_KERNELS[kind] = fn
        return fn

    return register
