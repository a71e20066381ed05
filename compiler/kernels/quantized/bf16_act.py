"""bf16 piecewise-linear activations as the cv18xx TIU computes them: min/max against constants, multiplies and
multiply-accumulates, each result rounded to bf16 (specs/cv18xx.md §3.4, §4).

The code generator (backends/cv18xx/kernels/elementwise.py, prelu.py) emits exactly these steps, so the
reference and the vendor simulator agree bit for bit. Every constant is its bf16 value. A TIU multiply or
multiply-accumulate reads subnormal operands as zero, forms the exact product, adds in float32, flushes a
result below the smallest normal to +0 and rounds to bf16 (bf16_lut.multiply_accumulate).

- relu / clip: `max(x, lo)`, `min(·, hi)` (exact);
- leaky relu and PReLU: `max(x, 0) + min(x, 0) * slope` in one MAC, right for any slope;
- hard sigmoid: `y = beta`, then `y += x * alpha` (one rounding), then clamped to [0, 1];
- hard swish: `x * hard_sigmoid(x; 1/6, 1/2)`, one rounded multiply.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

import numpy as np

from npuc.compiler.numformats.bf16_fp16 import round_to_bf16

from ...ops import Activation
from .bf16_lut import multiply_accumulate

HARD_SWISH_ALPHA, HARD_SWISH_BETA = 1.0 / 6.0, 0.5


def bf16_constant(value: float) -> np.float32:
    """The bf16 value of a float constant (round to nearest even)."""
    return np.float32(round_to_bf16(np.float32(value)))


def tiu_mul(a: np.ndarray, b: np.ndarray | np.float32) -> np.ndarray:
    """bf16 a * b as the TIU rounds it (the product of two bf16 values is exact in float32)."""
    return multiply_accumulate(a, b, np.float32(0))


def clip(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    y = np.asarray(x, np.float32)
    if np.isfinite(lo):
        y = np.maximum(y, bf16_constant(lo))
    if np.isfinite(hi):
        y = np.minimum(y, bf16_constant(hi))
    return y


def prelu(x: np.ndarray, slope: np.ndarray | np.float32) -> np.ndarray:
    """`max(x, 0) + min(x, 0) * slope` in one MAC (`slope`: bf16 values broadcasting against x)."""
    x = np.asarray(x, np.float32)
    return multiply_accumulate(np.minimum(x, np.float32(0)), slope, np.maximum(x, np.float32(0)))


def hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    y = multiply_accumulate(x, bf16_constant(alpha), np.full(np.shape(x), bf16_constant(beta), np.float32))
    return np.minimum(np.maximum(y, np.float32(0)), np.float32(1))


def hard_swish(x: np.ndarray) -> np.ndarray:
    return tiu_mul(x, hard_sigmoid(x, HARD_SWISH_ALPHA, HARD_SWISH_BETA))


_KINDS: MappingProxyType[str, Callable[[np.ndarray, Activation], np.ndarray]] = MappingProxyType(
    {
        "relu": lambda x, a: clip(x, 0.0, np.inf),
        "clip": lambda x, a: clip(x, a.lo, a.hi),
        "leaky_relu": lambda x, a: prelu(x, bf16_constant(a.alpha)),
        "hard_sigmoid": lambda x, a: hard_sigmoid(x, a.alpha, a.beta),
        "hard_swish": lambda x, a: hard_swish(x),
    }
)


def tiu_activation_kinds() -> tuple[str, ...]:
    """Activation kinds computed by TIU arithmetic (no table)."""
    return tuple(_KINDS)


def tiu_activation(x: np.ndarray, act: Activation) -> np.ndarray:
    """bf16 activation `act` (one of `tiu_activation_kinds()`) of bf16 values `x`, step by step as the TIU."""
    return _KINDS[act.kind](np.asarray(x, np.float32), act).astype(np.float32)
