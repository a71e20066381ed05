"""bf16 functions of one argument by two table lookups, f(x) = E[exponent index of x] * M[low byte of x]:
reciprocal (division: the eltwise div kernel is here) and reciprocal square root (normalization).

A local TDMA move with `mv_lut_idx` turns each bf16 into the index of its exponent (sign in bit 7, the
unbiased exponent + 63 in bits 0..6, for |x| in 2^-63 .. 2^63); a TIU lookup reads that index as the low
byte and picks a signed power of two. A second lookup reads x itself: its low byte is the exponent's last
bit and the 7 mantissa bits, which pick the mantissa factor. One TIU multiply joins them.
"""

from __future__ import annotations

import math

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, no_kernel, quant_of
from npuc.backends.cv18xx.kernels.elementwise import ELTWISE_KERNELS, _part, clamp, operands, tiles
from npuc.backends.cv18xx.kernels.lut import lookup, replicated_bf16_table, table_shape
from npuc.backends.cv18xx.lmem import LocalAllocator, LTensor
from npuc.compiler.ir import Op

EXPONENT_BASE = 64  # index 0 is the biased exponent 64 (2^-63)


def _exponents() -> np.ndarray:
    """The unbiased exponent of each positive index 0..127."""
    return np.arange(EXPONENT_BASE, EXPONENT_BASE + 128) - 127


def reciprocal_tables() -> tuple[np.ndarray, np.ndarray]:
    """1/x = 2^-e * 1/(1 + m): the exponent table holds +-2^-e, the mantissa table 1/(1 + m) for either
    exponent parity."""
    power = np.exp2(-_exponents().astype(np.float64))
    exponent = np.concatenate([power, -power]).astype(np.float32)
    m = (np.arange(256) & 0x7F) / 128.0
    return exponent, (1.0 / (1.0 + m)).astype(np.float32)


def rsqrt_tables() -> tuple[np.ndarray, np.ndarray]:
    """1/sqrt(x) = 2^(-e/2) (1 + m)^(-1/2) for x > 0: the exponent table holds the power for an even e
    (e - 1 where e is odd, the remaining 2^(-1/2) going into the mantissa table, whose bit 7 is the
    exponent's last bit: clear for an odd e, as the bias 127 is odd); negative entries are 0."""
    e = _exponents()
    even = np.where(e % 2 == 0, e, e - 1)
    exponent = np.zeros(256, np.float32)
    exponent[:128] = np.exp2(-even / 2.0)
    b = np.arange(256)
    m = (b & 0x7F) / 128.0
    odd_exponent = (b >> 7) == 0
    return exponent, (np.where(odd_exponent, math.sqrt(0.5), 1.0) / np.sqrt(1.0 + m)).astype(np.float32)


TABLES = {"reciprocal": reciprocal_tables, "rsqrt": rsqrt_tables}


def load_tables(cg: Codegen, local: LocalAllocator, name: str, function: str) -> tuple[LTensor, LTensor]:
    """The function's two tables, replicated per lane in the weight area and loaded into local memory."""
    resident = []
    for part, values in zip(("exponent", "mantissa"), TABLES[function]()):
        g = cg.weights.add(f"{name}_{function}_{part}_table", replicated_bf16_table(cg.chip, values), "bf16")
        lt = local.tensor(table_shape(cg.chip, "bf16"), "bf16")
        dma.load(cg.stream, g, lt)
        resident.append(lt)
    return resident[0], resident[1]


def emit_lookup(cg: Codegen, out: LTensor, x: LTensor, factor: LTensor, tables: tuple[LTensor, LTensor]) -> None:
    """out = f(x) for x laid out like `out` (default strides); `factor` is a scratch tile of the same shape.
    `out` may not be `x`: the mantissa lookup reads x after the exponent index is written."""
    exponent_table, mantissa_table = tables
    dma.copy_local(cg.stream, x, out, exponent_index=True)
    cg.stream.tiu(lookup(cg.chip, out, out, exponent_table))
    cg.stream.tiu(lookup(cg.chip, factor, x, mantissa_table))
    cg.stream.tiu(tiu.mul(out, out, factor))


def divide(cg: Codegen, op: Op) -> None:
    """bf16 a / b as a * (1/b), the reciprocal from b's exponent and mantissa (above); b is
    first copied into a tile of its own (its operand view may repeat along H/W)."""
    if quant_of(op).mode != "bf16" or len(op.inputs) != 2:
        raise no_kernel(op, "an int8 eltwise div (or one of more than two inputs)")
    (a, b), y = operands(cg, op)
    local = cg.local(op)
    tables = load_tables(cg, local, op.name, "reciprocal")
    top = local.top
    for n, cs, hs in tiles(cg, op, y.shape, y.fmt, 2 * 2 + 4):  # the tables take 1 KiB: counted as tiles
        local.reset(top)
        ta, tb = (x.load(cg, local, n, cs, hs, y.shape[3]) for x in (a, b))
        shape = (1, cs[1] - cs[0], hs[1] - hs[0], y.shape[3])
        divisor, inverse, factor = (local.tensor(shape, "bf16") for _ in range(3))
        cg.stream.tiu(tiu.copy(divisor, tb))
        emit_lookup(cg, inverse, divisor, factor, tables)
        cg.stream.tiu(tiu.mul(inverse, ta, inverse))
        clamp(cg, op, inverse)
        dma.store(cg.stream, inverse, _part(y, n, cs, hs))


ELTWISE_KERNELS["div"] = divide
