"""The standalone activation op: an int8 table lookup, a bf16 interpolated table (sigmoid, tanh, erf, GELU),
or the TIU's min/max/multiply steps (ReLU family, hard-sigmoid/-swish, leaky ReLU)."""

from __future__ import annotations

from npuc.backends.cv18xx.codegen import Codegen, kernel, quant_of
from npuc.backends.cv18xx.kernels.elementwise import relu_like
from npuc.backends.cv18xx.kernels.lut import emit_bf16_slope_lut, emit_int8_lut, is_bf16_table_activation
from npuc.compiler.ir import Op


@kernel("activation")
def activation(cg: Codegen, op: Op) -> None:
    q = quant_of(op)
    if q.mode == "int8" and q.lut is not None:
        emit_int8_lut(cg, op)
    elif is_bf16_table_activation(op):
        emit_bf16_slope_lut(cg, op)
    else:
        relu_like(cg, op)
