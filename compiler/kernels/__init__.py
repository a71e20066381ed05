"""Reference numpy kernels, one per IR op kind, looked up by kind in a registry."""

from . import activation, conv, elementwise, linalg, pool, recurrent, resize, tensor  # noqa: F401  (fill the registry)
from .activation import apply_activation
from .registry import FLOAT_KERNELS, KernelFn, float_kernel

__all__ = ["FLOAT_KERNELS", "KernelFn", "apply_activation", "float_kernel"]
