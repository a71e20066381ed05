"""Quantized reference kernels (cv18xx int8 and bf16 semantics), registered in QUANT_KERNELS."""

from . import bf16, cast, int8  # noqa: F401  (fill the registries)
from .params import OpQuant, op_quant, with_quant
from .registry import QUANT_KERNELS

__all__ = ["QUANT_KERNELS", "OpQuant", "op_quant", "with_quant"]
