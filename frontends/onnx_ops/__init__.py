"""ONNX → IR converters, registered by (op_type, since_version)."""

from . import composite, elementwise, nn, tensor  # noqa: F401  (importing registers the converters)
from .registry import ConvertContext, Converter, converter, find_converter, supported_op_types

__all__ = ["ConvertContext", "Converter", "converter", "find_converter", "supported_op_types"]
