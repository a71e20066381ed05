"""The quantized kernel registry: op kind -> dispatcher on the op's mode (int8, bf16, cast)."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

import numpy as np

from ...errors import UnsupportedError
from ...ir import Op
from ...ops import OPS
from ..registry import KernelFn
from .params import op_quant

# Filled at import time by the decorators in int8.py / bf16.py / cast.py; read-only afterwards.
_BY_MODE: dict[str, dict[str, KernelFn]] = {"int8": {}, "bf16": {}, "cast": {}}


def quant_kernel(mode: str, *kinds: str) -> Callable[[KernelFn], KernelFn]:
    """Register `fn` as the `mode` kernel of each op kind in `kinds`."""

    def register(fn: KernelFn) -> KernelFn:
        for kind in kinds:
            if kind in _BY_MODE[mode]:
                raise ValueError(f"{mode} kernel for {kind!r} registered twice")
            _BY_MODE[mode][kind] = fn
        return fn

    return register


def _dispatch(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    mode = op_quant(op).mode
    kernel = _BY_MODE[mode].get(op.kind)
    if kernel is None:
        raise UnsupportedError(f"op '{op.name}': no {mode} kernel for op kind '{op.kind}'")
    return kernel(op, inputs)


QUANT_KERNELS: MappingProxyType[str, KernelFn] = MappingProxyType({kind: _dispatch for kind in OPS})
