"""bf16 kernels: each op computed in float (float32 operands that are bf16 values), its result rounded to bf16.

This is the cv18xx bf16 path (specs/cv18xx.md §4): the TIU takes bf16 operands, accumulates wider and rounds
each op's result to the nearest even bf16; a conv/gemm bias is fp32. A conv sums its products as the TIU
does, in float32 rounding toward zero in a fixed order (bf16_conv.py). Average pooling multiplies the window
sum by the bf16 constant 1/(kh·kw), as the hardware has no divider; where a window counts fewer cells (the
padding excluded, ONNX's default, or a ceil_mode overhang), the output is then multiplied by the bf16 of
kh·kw/count, rounded again.
Sigmoid and tanh are not the exact functions but the chip's table interpolation (bf16_lut.py); ReLU-like,
hard-sigmoid/-swish and PReLU follow the TIU's step-by-step arithmetic (bf16_act.py). The matmul's
accumulation is not modelled (float math); softmax is computed in float64 and rounded once.
"""

from __future__ import annotations

import numpy as np

from npuc.compiler.numformats.bf16_fp16 import round_to_bf16

from ...ir import Op
from ...ops import OPS
from ..activation import apply_activation
from ..registry import FLOAT_KERNELS, KernelFn
from .bf16_act import prelu as prelu_steps
from .bf16_act import tiu_activation, tiu_activation_kinds
from .bf16_conv import conv2d_sums, conv_transpose2d_sums
from .bf16_lut import slope_lookup, table_kind
from .int8 import window_cell_counts, window_sums
from .registry import quant_kernel


def _rounded(kernel: KernelFn) -> KernelFn:
    def run(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [round_to_bf16(y) if y.dtype == np.float32 else y for y in kernel(op, inputs)]

    return run


def _avg_factor(count: int) -> np.float32:
    return round_to_bf16(np.float32(1.0) / np.float32(count))


def _with_act(op: Op, y: np.ndarray) -> np.ndarray:
    return round_to_bf16(apply_activation(round_to_bf16(y), getattr(op.attrs, "act", None)))


def pad_exclusion_factors(op: Op, in_hw: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray | None:
    """(oh, ow) bf16 factors kh·kw/count that turn a kh·kw average into ONNX's average over the cells it
    counts (padding excluded, ceil_mode overhang); None when every window counts kh·kw."""
    counts = window_cell_counts(op, in_hw, out_hw)
    if counts is None:
        return None
    kh, kw = op.attrs.kernel
    return round_to_bf16(np.float32(kh * kw) / np.maximum(counts, 1).astype(np.float32))


def pool2d(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    if op.attrs.mode == "max":
        return _rounded(FLOAT_KERNELS["pool2d"])(op, inputs)
    kh, kw = op.attrs.kernel
    total = window_sums(op, inputs[0].astype(np.float64))
    y = _with_act(op, (total * _avg_factor(kh * kw)).astype(np.float32))
    factors = pad_exclusion_factors(op, inputs[0].shape[2:], y.shape[2:])
    return [y if factors is None else round_to_bf16(y * factors)]


def global_pool(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x = inputs[0]
    axes = tuple(range(2, x.ndim))
    if op.attrs.mode == "max":
        return [x.max(axis=axes, keepdims=True)]
    count = int(np.prod(x.shape[2:]))
    total = x.astype(np.float64).sum(axis=axes, keepdims=True)
    return [round_to_bf16((total * _avg_factor(count)).astype(np.float32))]


def activation(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Sigmoid/tanh/erf/GELU through the cv18xx bf16 tables, piecewise-linear ones by the TIU's steps (what the TPU
    computes); other activations rounded."""
    kind = op.attrs.act.kind
    table = table_kind(op.attrs.act)
    if table is not None:
        return [slope_lookup(round_to_bf16(inputs[0]), table)]
    if kind in tiu_activation_kinds():
        return [tiu_activation(round_to_bf16(inputs[0]), op.attrs.act)]
    return _rounded(FLOAT_KERNELS["activation"])(op, inputs)


def prelu(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    x, slope = (round_to_bf16(np.asarray(v, np.float32)) for v in inputs)
    return [prelu_steps(x, slope)]


def conv2d(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a = op.attrs
    bias = inputs[2] if len(inputs) > 2 else None
    y = conv2d_sums(inputs[0], inputs[1], a.strides, a.pads, a.dilations, a.group, bias)
    return [round_to_bf16(apply_activation(round_to_bf16(y), a.act))]


def conv_transpose2d(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    bias = inputs[2] if len(inputs) > 2 else None
    y = conv_transpose2d_sums(inputs[0], inputs[1], op.attrs, bias)
    return [round_to_bf16(apply_activation(round_to_bf16(y), op.attrs.act))]


def softmax(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """In float64, rounded once: the exact ONNX form computes it so (passes/export/qdq_exact.IN_DOUBLE), and a
    float32 exp differs between libraries in the last bit, which can move the bf16 rounding."""
    y = FLOAT_KERNELS["softmax"](op, [np.asarray(inputs[0], np.float64)])[0]
    return [round_to_bf16(y.astype(np.float32))]


_SPECIAL: dict[str, KernelFn] = {
    "conv_transpose2d": conv_transpose2d,
    "pool2d": pool2d,
    "global_pool": global_pool,
    "activation": activation,
    "prelu": prelu,
    "conv2d": conv2d,
    "softmax": softmax,
}

for _kind in OPS:
    if _kind in _SPECIAL:
        quant_kernel("bf16", _kind)(_SPECIAL[_kind])
    elif _kind in FLOAT_KERNELS:
        quant_kernel("bf16", _kind)(_rounded(FLOAT_KERNELS[_kind]))
