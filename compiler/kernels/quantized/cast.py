"""The format-conversion op a quantized graph uses at its edges and between int8 and bf16 regions."""

from __future__ import annotations

import numpy as np

from ...ir import Op
from .formats import convert
from .params import op_quant
from .registry import quant_kernel


@quant_kernel("cast", "cast")
def cast(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    q = op_quant(op)
    y = convert(inputs[0], q.inputs[0], q.output)
    return [np.asarray(y, dtype=op.attrs.dtype)]
