"""Lowering of layout ops and CPU layers: transposes as views, flatten and softmax."""

from __future__ import annotations

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op

from .layers import Layer
from .lower_context import Lowering, Value, lowers
from .lower_decode import rows_alias

TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def _alias(ctx: Lowering, op: Op, src: Value, **changes: object) -> None:
    fields = {**src.__dict__, **changes}
    ctx.values[op.outputs[0]] = Value(**fields)


@lowers("transpose")
def lower_transpose(ctx: Lowering, op: Op) -> None:
    """NCHW<->NHWC transposes only relabel how the graph sees the same buffer."""
    src = ctx.value(op)
    perm = tuple(op.attrs.perm)
    if perm == TO_NHWC and src.view == "nchw":
        _alias(ctx, op, src, view="nhwc")
    elif perm == TO_NCHW and src.view == "nhwc":
        _alias(ctx, op, src, view="nchw")
    else:
        raise UserError(f"transpose '{op.name}' {list(perm)} of a {src.view} tensor has no DV700 lowering")


def _hwc_positions(c: int, h: int, w: int) -> np.ndarray:
    """For each element of a C,H,W-ordered flat vector, its position in the H,W,C-ordered buffer."""
    ci, yi, xi = np.meshgrid(np.arange(c), np.arange(h), np.arange(w), indexing="ij")
    return ((yi * w + xi) * c + ci).reshape(-1)


@lowers("reshape")
def lower_reshape(ctx: Lowering, op: Op) -> None:
    src = ctx.value(op)
    w, h, c = src.dims
    out_shape = ctx.graph.shape(op.outputs[0])
    if len(out_shape) == 3 and rows_alias(ctx, op, src):
        return
    if len(out_shape) == 4 and out_shape[0] == 1 and out_shape[2:] == (1, 1) and src.perm is None and w * h == 1:
        _alias(ctx, op, src, view="nchw")
        return
    if len(out_shape) != 2 or out_shape[0] != 1 or src.view == "flat":
        raise UserError(f"reshape '{op.name}' to {list(out_shape)}: DV700 only flattens a 1xCxHxW tensor to (1, N)")
    if w * h == 1:
        _alias(ctx, op, src, view="flat", dims=(1, 1, c))
        return
    perm = None if src.view == "nhwc" else _hwc_positions(c, h, w)
    out = Value(ctx.new_buffer(w * h * c * 2), (1, 1, w * h * c), "hwc", "float16", "flat", perm)
    layer = Layer(op.name, "LT_FLATTEN", 0, 0, 0, [], [], ops=[op.name])
    ctx.add_layer(layer, src, out)
    layer.output_dim = [w * h * c]
    ctx.values[op.outputs[0]] = out


@lowers("softmax")
def lower_softmax(ctx: Lowering, op: Op) -> None:
    """Channel softmax on the CPU: un-permute the FPGA layout to HWC, output fp32."""
    src = ctx.value(op)
    shape = ctx.graph.shape(op.inputs[0])
    axis = op.attrs.axis % len(shape)
    channel_axis = {"nchw": 1, "nhwc": 3, "flat": 1}[src.view]
    trailing_ones = all(d == 1 for d in shape[axis + 1 :])
    if axis != channel_axis or (op.attrs.coerce_2d and not trailing_ones and src.view != "nhwc"):
        raise UserError(
            f"softmax '{op.name}' over axis {op.attrs.axis} of a {src.view} tensor: DV700 runs channel softmax only"
        )
    if src.perm is not None:
        raise UserError(f"softmax '{op.name}' reads a reordered flat vector; softmax before flattening instead")
    out = Value(ctx.new_buffer(int(np.prod(src.dims)) * 4), src.dims, "hwc", "float32", src.view)
    layer = Layer(op.name, "LT_SOFTMAX", 0, 0, 0, [], [], is_f32_output=True, softmax_axis=2, ops=[op.name])
    ctx.add_layer(layer, src, out)
    if src.dims[0] * src.dims[1] == 1:
        layer.output_dim = [src.dims[2]]
    ctx.values[op.outputs[0]] = out
