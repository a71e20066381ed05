"""Converters for data-movement ONNX ops and the shape arithmetic that folds to constants."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npuc.compiler import ops

from .registry import ConvertContext, converter


def _reshape(ctx: ConvertContext, shape: tuple[int, ...]) -> None:
    ctx.emit("reshape", [ctx.input(0)], ops.Reshape(tuple(int(d) for d in shape)))


@converter("Reshape", 5, const_inputs=(1,))
def reshape(ctx: ConvertContext) -> None:
    src = ctx.shape(0)
    target = ctx.ints(1)
    allow_zero = bool(ctx.attr("allowzero", 0))
    out = [src[i] if d == 0 and not allow_zero else d for i, d in enumerate(target)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(src)) // known if known else 0
    _reshape(ctx, tuple(out))


@converter("Flatten", 1)
def flatten(ctx: ConvertContext) -> None:
    shape = ctx.shape(0)
    axis = int(ctx.attr("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    _reshape(ctx, (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))


def _squeeze_axes(ctx: ConvertContext, axes) -> None:
    shape = ctx.shape(0)
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    axes = {a % len(shape) for a in axes}
    _reshape(ctx, tuple(d for i, d in enumerate(shape) if i not in axes))


def _unsqueeze_axes(ctx: ConvertContext, axes) -> None:
    shape = list(ctx.shape(0))
    rank = len(shape) + len(axes)
    for axis in sorted(a % rank for a in axes):
        shape.insert(axis, 1)
    _reshape(ctx, tuple(shape))


converter("Squeeze", 1)(lambda ctx: _squeeze_axes(ctx, ctx.attr("axes")))
converter("Squeeze", 13, const_inputs=(1,))(lambda ctx: _squeeze_axes(ctx, ctx.ints(1)))
converter("Unsqueeze", 1)(lambda ctx: _unsqueeze_axes(ctx, ctx.attr("axes")))
converter("Unsqueeze", 13, const_inputs=(1,))(lambda ctx: _unsqueeze_axes(ctx, ctx.ints(1)))


@converter("Transpose", 1)
def transpose(ctx: ConvertContext) -> None:
    perm = ctx.attr("perm") or list(range(ctx.rank(0)))[::-1]
    ctx.emit("transpose", [ctx.input(0)], ops.Transpose(tuple(int(p) for p in perm)))


@converter("Concat", 4)
def concat(ctx: ConvertContext) -> None:
    inputs = [name for name in ctx.inputs if ctx.graph.tensors[name].size or len(ctx.inputs) == 1]
    ctx.emit("concat", inputs, ops.Concat(ctx.axis(int(ctx.attr("axis")))))


def _slice(ctx: ConvertContext, starts, ends, axes, steps) -> None:
    shape = ctx.shape(0)
    axes = list(range(len(starts))) if axes is None else [a % len(shape) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    big = np.iinfo(np.int64).max

    def clamp(v: int) -> int:  # ONNX uses INT64_MAX/MIN as "to the end"; python slices want plain ints
        return max(min(int(v), big // 2), -big // 2)

    ctx.emit(
        "slice",
        [ctx.input(0)],
        ops.Slice(
            tuple(clamp(v) for v in starts),
            tuple(clamp(v) for v in ends),
            tuple(axes),
            tuple(int(s) for s in steps),
        ),
    )


converter("Slice", 1)(lambda ctx: _slice(ctx, ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None))
converter("Slice", 10, const_inputs=(1, 2, 3, 4))(
    lambda ctx: _slice(ctx, ctx.ints(1), ctx.ints(2), ctx.ints(3), ctx.ints(4))
)


def _split(ctx: ConvertContext, sizes) -> None:
    axis = ctx.axis(int(ctx.attr("axis", 0)))
    length = ctx.shape(0)[axis]
    n_out = len(ctx.node.output)
    if sizes is None:
        num = int(ctx.attr("num_outputs", n_out))
        chunk = -(-length // num)
        sizes = [min(chunk, length - i * chunk) for i in range(num)]
    ctx.emit("split", [ctx.input(0)], ops.Split(axis, tuple(int(s) for s in sizes)), list(ctx.node.output))


converter("Split", 2)(lambda ctx: _split(ctx, ctx.attr("split")))
converter("Split", 13, const_inputs=(1,))(lambda ctx: _split(ctx, ctx.ints(1)))


def _pad(ctx: ConvertContext, pads, value, axes) -> None:
    rank = ctx.rank(0)
    if axes is not None:
        full = [0] * (2 * rank)
        for i, axis in enumerate(a % rank for a in axes):
            full[axis], full[axis + rank] = pads[i], pads[i + len(axes)]
        pads = full
    if any(p < 0 for p in pads):
        raise ctx.unsupported("negative pads (cropping) are not supported", "use Slice to crop")
    mode = ctx.attr("mode", "constant")
    ctx.emit("pad", [ctx.input(0)], ops.Pad(tuple(int(p) for p in pads), mode, float(value)))


converter("Pad", 2)(lambda ctx: _pad(ctx, ctx.attr("pads"), ctx.attr("value", 0.0), None))
converter("Pad", 11, const_inputs=(1, 2, 3))(
    lambda ctx: _pad(ctx, ctx.ints(1), np.asarray(ctx.const(2, 0.0)).reshape(-1)[0], ctx.ints(3))
)


def _resize(ctx: ConvertContext, scales, sizes, roi, axes, mode: str, coord: str, nearest: str) -> None:
    shape = ctx.shape(0)
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    full_scales = [1.0] * rank
    out = list(shape)
    if sizes is not None and len(sizes):
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        ratios = [sizes[i] / shape[a] for i, a in enumerate(axes)]
        if policy != "stretch":
            common = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [common] * len(axes)
            sizes = [int(np.floor(common * shape[a] + 0.5)) for a in axes]
        for i, a in enumerate(axes):
            full_scales[a], out[a] = ratios[i], int(sizes[i])
    elif scales is not None and len(scales):
        full_roi = None
        if coord == "tf_crop_and_resize" and roi is not None and len(roi):
            full_roi = list(roi)
        for i, a in enumerate(axes):
            full_scales[a] = float(scales[i])
            extent = (full_roi[i + len(axes)] - full_roi[i]) if full_roi else 1.0
            out[a] = int(np.floor(shape[a] * extent * float(scales[i])))
    else:
        raise ctx.unsupported("neither scales nor sizes is given")
    full_roi_vals: tuple[float, ...] = ()
    if roi is not None and len(roi) and coord == "tf_crop_and_resize":
        starts, ends = [0.0] * rank, [1.0] * rank
        for i, a in enumerate(axes):
            starts[a], ends[a] = float(roi[i]), float(roi[i + len(axes)])
        full_roi_vals = tuple(starts + ends)
    attrs = ops.Resize(
        out_shape=tuple(out),
        scales=tuple(full_scales),
        mode=mode,
        coord_mode=coord,
        nearest_mode=nearest,
        cubic_coeff_a=float(ctx.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(ctx.attr("exclude_outside", 0)),
        extrapolation_value=float(ctx.attr("extrapolation_value", 0.0)),
        roi=full_roi_vals,
        antialias=bool(ctx.attr("antialias", 0)),
    )
    ctx.emit("resize", [ctx.input(0)], attrs)


def _floats(ctx: ConvertContext, i: int):
    data = ctx.const(i)
    return None if data is None or data.size == 0 else [float(v) for v in data.reshape(-1)]


@converter("Resize", 10, const_inputs=(1,))
def resize_10(ctx: ConvertContext) -> None:
    _resize(ctx, _floats(ctx, 1), None, None, None, ctx.attr("mode", "nearest"), "asymmetric", "floor")


@converter("Resize", 11, const_inputs=(1, 2, 3))
def resize(ctx: ConvertContext) -> None:
    sizes = ctx.ints(3)
    _resize(
        ctx,
        _floats(ctx, 2),
        sizes if sizes else None,
        _floats(ctx, 1),
        ctx.attr("axes"),
        ctx.attr("mode", "nearest"),
        ctx.attr("coordinate_transformation_mode", "half_pixel"),
        ctx.attr("nearest_mode", "round_prefer_floor"),
    )


def _upsample(ctx: ConvertContext, scales) -> None:
    mode = ctx.attr("mode", "nearest")
    mode = "linear" if mode in ("linear", "bilinear") else mode
    _resize(ctx, scales, None, None, None, mode, "asymmetric", "floor")


converter("Upsample", 7)(lambda ctx: _upsample(ctx, ctx.attr("scales")))
converter("Upsample", 9, const_inputs=(1,))(lambda ctx: _upsample(ctx, _floats(ctx, 1)))


def _reduce(ctx: ConvertContext, kind: str, axes) -> None:
    rank = ctx.rank(0)
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            ctx.alias(ctx.input(0))
            return
        axes = list(range(rank))
    attrs = ops.Reduce(kind, tuple(sorted(a % rank for a in axes)), bool(ctx.attr("keepdims", 1)))
    ctx.emit("reduce", [ctx.input(0)], attrs)


# (op, reduction, opset from which the axes come as an input instead of an attribute)
for _op, _kind, _axes_input in (("ReduceMean", "mean", 18), ("ReduceSum", "sum", 13), ("ReduceMax", "max", 18),
                                ("ReduceMin", "min", 18)):  # fmt: skip
    converter(_op, 1)(lambda ctx, kind=_kind: _reduce(ctx, kind, ctx.attr("axes")))
    converter(_op, _axes_input, const_inputs=(1,))(lambda ctx, kind=_kind: _reduce(ctx, kind, ctx.ints(1)))


@converter("Gather", 1)
def gather(ctx: ConvertContext) -> None:
    axis = ctx.axis(int(ctx.attr("axis", 0)))
    ctx.emit("gather", [ctx.input(0), ctx.input(1)], ops.Gather(axis))


_CAST_DTYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
}


@converter("Cast", 6)
def cast(ctx: ConvertContext) -> None:
    to = int(ctx.attr("to"))
    if to not in _CAST_DTYPES:
        name = onnx.TensorProto.DataType.Name(to)
        raise ctx.unsupported(f"cast to {name} is not supported", "cast to a numeric type numpy supports")
    ctx.emit("cast", [ctx.input(0)], ops.Cast(_CAST_DTYPES[to]))


@converter("Expand", 8, const_inputs=(1,))
def expand(ctx: ConvertContext) -> None:
    ctx.emit("expand", [ctx.input(0)], ops.Expand(tuple(ctx.ints(1))))


# ---- shape arithmetic: with static shapes these are constants -------------------------------------------


@converter("Shape", 1)
def shape(ctx: ConvertContext) -> None:
    dims = np.asarray(ctx.shape(0), np.int64)
    rank = len(dims)
    start, end = int(ctx.attr("start", 0)), ctx.attr("end")
    end = rank if end is None else int(end)
    ctx.emit_const(dims[slice(max(min(start, rank), -rank), max(min(end, rank), -rank - 1))])


@converter("Size", 1)
def size(ctx: ConvertContext) -> None:
    ctx.emit_const(np.asarray(np.prod(ctx.shape(0)), np.int64))


@converter("ConstantOfShape", 9, const_inputs=(0,))
def constant_of_shape(ctx: ConvertContext) -> None:
    value = ctx.attr("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    ctx.emit_const(np.full(ctx.ints(0), fill[0], dtype=fill.dtype))


# Comparisons and selections appear in exported shape arithmetic (attention-mask broadcasting): on pinned
# shapes their inputs are constants and they fold; on activations npuc has no op for them.
@converter("Equal", 1, const_inputs=(0, 1))
def equal(ctx: ConvertContext) -> None:
    ctx.emit_const(np.equal(ctx.const(0), ctx.const(1)))


@converter("Where", 9, const_inputs=(0, 1, 2))
def where(ctx: ConvertContext) -> None:
    ctx.emit_const(np.where(ctx.const(0), ctx.const(1), ctx.const(2)))


@converter("Range", 11, const_inputs=(0, 1, 2))
def range_(ctx: ConvertContext) -> None:
    start, limit, delta = (ctx.const(i) for i in (0, 1, 2))
    count = max(int(np.ceil((limit - start) / delta)), 0)
    ctx.emit_const((start + np.arange(count) * delta).astype(np.asarray(start).dtype))


@converter("Constant", 1)
def constant(ctx: ConvertContext) -> None:
    attr = ctx.node.attribute[0]
    if attr.name == "sparse_value":
        raise ctx.unsupported("sparse constants are not supported", "store the constant densely")
    value = helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        ctx.emit_const(numpy_helper.to_array(value))
    elif attr.name in ("value_float", "value_floats"):
        ctx.emit_const(np.asarray(value, np.float32))
    elif attr.name in ("value_int", "value_ints"):
        ctx.emit_const(np.asarray(value, np.int64))
    else:
        raise ctx.unsupported(f"constant attribute '{attr.name}' is not supported", "use a numeric tensor")


@converter("Identity", 1)
def identity(ctx: ConvertContext) -> None:
    ctx.alias(ctx.input(0))


@converter("Dropout", 1)
def dropout(ctx: ConvertContext) -> None:
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        # inference: nothing is dropped, the mask is all ones
        ctx.emit_const(np.ones(ctx.shape(0), bool), ctx.node.output[1])
    ctx.alias(ctx.input(0))
