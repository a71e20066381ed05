"""bf16 sigmoid, tanh, erf and GELU as the cv18xx computes them: a 256-entry value table and a slope table,
interpolated.

The TPU has no exp, so tpu-mlir evaluates these activations with two bf16 lookups (specs/cv18xx.md §4; the
"slope" recipe of its `LutBF16` op). npuc's variant, step by step on bf16 values:

1. `xs = bf16(x * scale)`: the input in table steps (index k stands for x = k / scale);
2. `xs` clamped to [-128, 127], so every index is in the table and the ends hold the function's limits;
3. `k = trunc(xs)`: the TDMA's bf16 -> int8 conversion in its round-toward-zero mode;
4. `d = xs - k` (exact; in (-1, 1), negative for negative xs);
5. `y = bf16(base[k] + d * slope[k])`: one TIU multiply-accumulate.

Results of the multiply (1) and the multiply-accumulate (5) below the smallest normal float become +0 before
rounding, as the TIU does.

GELU is not bounded, so its table holds the bounded factor Phi(x) = GELU(x) / x (the normal CDF, or its tanh
approximation) and a sixth step multiplies: `y = bf16(x * Phi)` (`PRODUCT_KINDS`).

Truncation toward zero means a negative `xs` sits between k - 1 and k, so the slope of a negative index is the
backward difference `base[k] - base[k - 1]`, of a non-negative one the forward difference. This, not the exact
float function, is the reference: `npuc run`, the quantized interpreter and the vendor simulator agree on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

import numpy as np

from npuc.compiler.kernels.activation import erf
from npuc.compiler.numformats.bf16_fp16 import round_to_bf16
from npuc.compiler.ops import Activation

ENTRIES = 256
INDEX_LO, INDEX_HI = -128.0, 127.0  # the clamp of step 2, in table steps


@dataclass(frozen=True)
class SlopeTable:
    """The two tables of one activation (float32 holding bf16 values, entry i for the int8 code i as a byte)
    and the bf16 scale from input units to table steps."""

    kind: str
    scale: np.float32
    base: np.ndarray
    slope: np.ndarray


def _erf(x: np.ndarray) -> np.ndarray:
    return erf(np.asarray(x, np.float64))


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))


def _tanh_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


# kind -> (function, scale). The scales are exact bf16 values covering about tpu-mlir's ranges
# (sigmoid +-12, tanh +-15), where the functions are flat to within a bf16 step (erf beyond +-3.5, the GELU
# factors beyond about +-4.5; the table reaches +-4 and +-6).
_FUNCTIONS: MappingProxyType[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = MappingProxyType(
    {
        "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x)), 10.0),
        "tanh": (np.tanh, 8.5),
        "erf": (_erf, 32.0),
        "gelu": (_normal_cdf, 21.25),
        "gelu_tanh": (_tanh_cdf, 21.25),
    }
)
PRODUCT_KINDS = ("gelu", "gelu_tanh")  # the table holds y / x; the input multiplies the looked-up value


def table_kind(act: Activation) -> str | None:
    """The table of activation `act`, or None when it has none."""
    kind = "gelu_tanh" if act.kind == "gelu" and act.approximate == "tanh" else act.kind
    return kind if kind in _FUNCTIONS else None


def table_kinds() -> tuple[str, ...]:
    return tuple(_FUNCTIONS)


def _by_byte(values_by_index: np.ndarray) -> np.ndarray:
    """Entries for indices -128..127 reordered so entry b belongs to the int8 code whose byte is b."""
    return np.roll(values_by_index, -128)


@cache
def slope_table(kind: str) -> SlopeTable:
    """The value and slope tables of activation `kind` (one of `table_kinds()`)."""
    fn, scale = _FUNCTIONS[kind]
    k = np.arange(-128, 128, dtype=np.float64)
    base = round_to_bf16(fn(k / scale).astype(np.float32))
    forward = np.append(base[1:] - base[:-1], np.float32(0))  # index 127 is only reached with d = 0
    backward = np.insert(base[1:] - base[:-1], 0, np.float32(0))  # nor is -128 with d != 0
    slope = round_to_bf16(np.where(k < 0, backward, forward).astype(np.float32))
    for t in (base, slope):
        t.setflags(write=False)
    return SlopeTable(kind, np.float32(scale), _by_byte(base), _by_byte(slope))


FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def flush_subnormal(x: np.ndarray) -> np.ndarray:
    """The TIU's bf16 multiply/accumulate gives +0 for a result below the smallest normal float."""
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < FLT_MIN, np.float32(0), x)


def table_index(x: np.ndarray, table: SlopeTable) -> tuple[np.ndarray, np.ndarray]:
    """Steps 1-4: (int8 index, bf16 fraction) of bf16 values `x`."""
    xs = round_to_bf16(flush_subnormal(flush_subnormal(x) * table.scale))  # a subnormal operand reads as 0
    xs = np.clip(xs, np.float32(INDEX_LO), np.float32(INDEX_HI))
    k = np.trunc(xs)
    return k.astype(np.int8), (xs - k).astype(np.float32)


def multiply_accumulate(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """bf16 `acc + a * b` as the TIU MAC rounds it: subnormal operands read as zero, the exact product added in
    float32, a subnormal result flushed to +0, rounded to bf16. (The vendor simulator gives 0 for a subnormal
    times 1.625 although the product is a normal float: operands are flushed, not only results.)"""
    a, b, acc = (flush_subnormal(v) for v in (a, b, acc))
    return round_to_bf16(flush_subnormal(acc + a * b))


def slope_lookup(x: np.ndarray, kind: str) -> np.ndarray:
    """The activation `kind` of bf16 values `x` (float32 array) through its tables, as the TPU computes it."""
    table = slope_table(kind)
    k, d = table_index(x, table)
    byte = k.view(np.uint8)
    y = multiply_accumulate(d, table.slope[byte], table.base[byte]).astype(np.float32)
    if kind in PRODUCT_KINDS:
        y = multiply_accumulate(np.asarray(x, np.float32), y, np.float32(0)).astype(np.float32)
    return y
