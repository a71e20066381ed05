"""cv18xx op kernels: one module per op family; importing the package registers them all."""

from npuc.backends.cv18xx.kernels import (  # noqa: F401
    activation,
    conv,
    csc,
    elementwise,
    group,
    matmul,
    norm,
    pool,
    prelu,
    preprocess,
    reduce,
    scientific,
    tensor,
)
