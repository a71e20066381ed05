"""The TPU routine of a list of ops: each op (or layer group) through the kernel registered for its kind.

Importing the kernel package here registers every kernel; codegen.py holds the registry and the helpers the
kernels share, so the dependency runs one way: generate -> kernels -> codegen.
"""

from __future__ import annotations

from npuc.backends.cv18xx import kernels  # noqa: F401  (registers the kernels)
from npuc.backends.cv18xx.codegen import KERNELS, Codegen, no_kernel
from npuc.compiler.coverage import per_op
from npuc.compiler.ir import Op


def generate(cg: Codegen, ops: list[Op]) -> None:
    for index, op in enumerate(ops):
        cg.stream.layer = index + 1
        cg.top_aligned = index % 2 == 1
        with per_op(op):
            fn = KERNELS.get(op.kind)
            if fn is None:
                raise no_kernel(op, f"a {op.kind} op")
            fn(cg, op)
