"""Float reference kernels, continued from tests/test_kernels_float.py: data movement, reductions, resize and the
kernel registry, each checked op by op against onnxruntime / onnx.reference with the same harness
(tests/kernel_cases.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_cases import assert_close, ir_outputs, onnx_outputs, rand
from onnx import helper

from npuc.compiler import ops as O
from npuc.compiler.errors import UserError
from npuc.compiler.kernels import FLOAT_KERNELS

# ---------------------------------------------------------------------------------------------------------
# data movement and reductions
# ---------------------------------------------------------------------------------------------------------


def test_concat_reshape_transpose() -> None:
    feeds = {"a": rand(2, 3, 4), "b": rand(2, 1, 4, seed=1)}
    want = onnx_outputs([helper.make_node("Concat", ["a", "b"], ["y"], axis=1)], feeds)[0]
    assert_close(ir_outputs("concat", O.Concat(1), feeds)[0], want, rtol=0)
    x = rand(2, 3, 4)
    assert_close(ir_outputs("reshape", O.Reshape((4, 6)), {"x": x})[0], x.reshape(4, 6), rtol=0)
    want = onnx_outputs([helper.make_node("Transpose", ["x"], ["y"], perm=[2, 0, 1])], {"x": x})[0]
    got = ir_outputs("transpose", O.Transpose((2, 0, 1)), {"x": x})[0]
    assert_close(got, want, rtol=0)
    assert got.flags.c_contiguous


SLICES = [
    ((1,), (3,), (1,), (1,)),
    ((0, -1), (2**31, 0), (0, 2), (1, -1)),
    ((-3, 5), (-1, 0), (2, 1), (1, -2)),
    ((0,), (-(2**31),), (1,), (-1,)),
    ((1, 0), (100, 4), (-1, -3), (2, 3)),
]


@pytest.mark.parametrize("case", SLICES)
def test_slice(case) -> None:
    starts, ends, axes, steps = case
    x = rand(3, 4, 6)
    consts = {k: np.array(v, np.int64) for k, v in zip(("s", "e", "a", "t"), case, strict=True)}
    want = onnx_outputs([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], {"x": x}, consts)[0]
    got = ir_outputs("slice", O.Slice(starts, ends, tuple(a % 3 for a in axes), steps), {"x": x})[0]
    assert_close(got, want, rtol=0)


def test_split() -> None:
    x = rand(2, 7, 3)
    node = helper.make_node("Split", ["x", "sz"], ["y0", "y1", "y2"], axis=1)
    want = onnx_outputs([node], {"x": x}, {"sz": np.array([2, 4, 1], np.int64)}, outputs=("y0", "y1", "y2"))
    got = ir_outputs("split", O.Split(1, (2, 4, 1)), {"x": x}, outputs=("y0", "y1", "y2"))
    for g_, w_ in zip(got, want, strict=True):
        assert_close(g_, w_, rtol=0)


PADS = [(0, 1, 2, 1, 0, 2), (1, 0, 0, 0, 3, 1), (2, 2, 2, 2, 2, 2)]
PAD_CASES = [(m, p) for m in ("constant", "reflect", "edge", "wrap") for p in PADS] + [
    ("constant", (0, 2, -1, 0, -1, 2)),  # negative pads crop
]


@pytest.mark.parametrize("mode,pads", PAD_CASES)
def test_pad(mode: str, pads) -> None:
    x = rand(3, 4, 5)
    consts = {"p": np.array(pads, np.int64), "v": np.array(1.5, np.float32)}
    node = helper.make_node("Pad", ["x", "p", "v"], ["y"], mode=mode)
    want = onnx_outputs([node], {"x": x}, consts, opset=19)[0]
    got = ir_outputs("pad", O.Pad(pads, mode, 1.5), {"x": x})[0]
    assert_close(got, want, rtol=0)


@pytest.mark.parametrize("axis,idx", [(0, [[0, 2], [-1, 1]]), (1, [3, 0, -4]), (2, 1), (-1, [[-1]])])
def test_gather(axis: int, idx) -> None:
    x = rand(3, 4, 5)
    consts = {"i": np.array(idx, np.int64)}
    want = onnx_outputs([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], {"x": x}, consts)[0]
    assert_close(ir_outputs("gather", O.Gather(axis % 3), {"x": x}, consts)[0], want, rtol=0)


def test_gather_out_of_range_is_user_error() -> None:
    with pytest.raises(UserError, match="index out of range"):
        ir_outputs("gather", O.Gather(0), {"x": rand(3, 2)}, {"i": np.array([3], np.int64)})


@pytest.mark.parametrize("src,shape", [((3, 1), (2, 3, 4)), ((1,), (5,)), ((2, 1, 3), (1, 4, 1))])
def test_expand(src, shape) -> None:
    x = rand(*src)
    consts = {"s": np.array(shape, np.int64)}
    want = onnx_outputs([helper.make_node("Expand", ["x", "s"], ["y"])], {"x": x}, consts)[0]
    assert_close(ir_outputs("expand", O.Expand(shape), {"x": x})[0], want, rtol=0)


@pytest.mark.parametrize("to", ["int32", "int64", "float16", "bool", "uint8", "float32"])
def test_cast(to: str) -> None:
    x = np.array([[-2.7, -0.5, 0.0, 0.4, 1.5, 3.99, 100.2, 7.0]], np.float32)
    if to == "uint8":
        x = np.abs(x)
    node = helper.make_node("Cast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(to)))
    want = onnx_outputs([node], {"x": x}, out_dtype=np.dtype(to))[0]
    assert_close(ir_outputs("cast", O.Cast(to), {"x": x})[0], want, rtol=0)


def test_cast_int_to_float() -> None:
    x = np.array([-3, 0, 2**20 + 1], np.int64)
    assert_close(ir_outputs("cast", O.Cast("float32"), {"x": x})[0], x.astype(np.float32), rtol=0)


REDUCE_OPS = {"mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "sum": "ReduceSum"}


@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("axes", [(1,), (0, 2), (1, 2, 3)])
@pytest.mark.parametrize("kind", sorted(REDUCE_OPS))
def test_reduce(kind: str, axes, keepdims: bool) -> None:
    x = rand(2, 3, 4, 5)
    node = helper.make_node(REDUCE_OPS[kind], ["x", "a"], ["y"], keepdims=int(keepdims))
    want = onnx_outputs([node], {"x": x}, {"a": np.array(axes, np.int64)})[0]
    assert_close(ir_outputs("reduce", O.Reduce(kind, axes, keepdims), {"x": x})[0], want)


def test_reduce_int_mean_truncates() -> None:
    x = np.array([[1, 2], [3, 5], [-3, -4]], np.int32)
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)
    want = onnx_outputs([node], {"x": x}, opset=13)[0]
    got = ir_outputs("reduce", O.Reduce("mean", (1,), False), {"x": x})[0]
    assert_close(got, want)
    np.testing.assert_array_equal(got, [1, 4, -3])


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_lrn(size: int) -> None:
    x = rand(2, 6, 3, 4)
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=2e-3, beta=0.6, bias=1.5)
    if size % 2:
        want = onnx_outputs([node], {"x": x})[0]
    else:  # onnxruntime rejects even sizes (and onnx.reference loops over N, not C): use the spec formula
        lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
        sq = np.stack([np.sum(x[:, max(0, c - lo) : c + hi + 1] ** 2, axis=1) for c in range(6)], axis=1)
        want = (x / (1.5 + 2e-3 / size * sq) ** 0.6).astype(np.float32)
    assert_close(ir_outputs("lrn", O.LRN(size, 2e-3, 0.6, 1.5), {"x": x})[0], want)


# ---------------------------------------------------------------------------------------------------------
# resize
# ---------------------------------------------------------------------------------------------------------


def resize_pair(
    x: np.ndarray, mode: str, coord: str, *, scales=None, sizes=None, roi=None, engine: str = "ort", **kw
) -> tuple[np.ndarray, np.ndarray]:
    """(ours, reference) for one ONNX Resize node given scales or sizes."""
    consts = {"roi": np.array(roi or [], np.float32)}
    if scales is not None:
        consts["scales"] = np.array(scales, np.float32)
        inputs = ["x", "roi", "scales"]
        out = tuple(int(d * s) for d, s in zip(x.shape, consts["scales"], strict=True))
        used = tuple(float(s) for s in consts["scales"])
    else:
        consts["sizes"] = np.array(sizes, np.int64)
        inputs, out, used = ["x", "roi", "", "sizes"], tuple(sizes), ()
    onnx_kw = {"coordinate_transformation_mode": coord, "mode": mode, **kw}
    want = onnx_outputs(
        [helper.make_node("Resize", inputs, ["y"], **onnx_kw)], {"x": x}, consts, opset=19, engine=engine
    )[0]
    attrs = O.Resize(
        out, used, mode, coord, kw.get("nearest_mode", "round_prefer_floor"), kw.get("cubic_coeff_a", -0.75),
        bool(kw.get("exclude_outside", 0)), kw.get("extrapolation_value", 0.0), tuple(roi or ()),
        bool(kw.get("antialias", 0)),
    )  # fmt: skip
    return ir_outputs("resize", attrs, {"x": x})[0], want


RESIZE_COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
RESIZE_TARGETS = [
    {"scales": [1, 1, 2, 3]},
    {"scales": [1, 1, 0.6, 0.5]},
    {"scales": [1, 1, 1.7, 1.25]},
    {"sizes": [1, 2, 8, 4]},
    {"sizes": [1, 2, 3, 1]},
]


@pytest.mark.parametrize("target", RESIZE_TARGETS, ids=str)
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("coord", [*RESIZE_COORDS, "tf_half_pixel_for_nn"])
def test_resize_nearest(coord: str, nearest_mode: str, target) -> None:
    got, want = resize_pair(rand(1, 2, 5, 6), "nearest", coord, nearest_mode=nearest_mode, **target)
    assert_close(got, want, rtol=0)


@pytest.mark.parametrize("target", RESIZE_TARGETS, ids=str)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coord", RESIZE_COORDS)
def test_resize_linear_cubic(coord: str, mode: str, target) -> None:
    got, want = resize_pair(rand(1, 2, 5, 6), mode, coord, **target)
    assert_close(got, want)


@pytest.mark.parametrize("a,exclude", [(-0.5, 0), (-0.5, 1), (-0.75, 1)])
@pytest.mark.parametrize("target", RESIZE_TARGETS[:3], ids=str)
def test_resize_cubic_coeff_exclude_outside(a: float, exclude: int, target) -> None:
    got, want = resize_pair(rand(1, 2, 5, 6), "cubic", "half_pixel", cubic_coeff_a=a, exclude_outside=exclude, **target)
    assert_close(got, want)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("target", [{"sizes": [1, 2, 4, 5]}, {"scales": [1, 1, 0.8, 1.5]}], ids=str)
def test_resize_tf_crop_and_resize_extrapolates(mode: str, target) -> None:
    roi = [0, 0, 0.2, -0.3, 1, 1, 0.9, 1.4]
    got, want = resize_pair(rand(1, 2, 5, 6), mode, "tf_crop_and_resize", roi=roi, extrapolation_value=-7.0, **target)
    assert_close(got, want)
    assert np.sum(got == -7.0) > 0  # the roi reaches outside the image


@pytest.mark.parametrize("engine", ["ort", "ref"])
@pytest.mark.parametrize("exclude", [0, 1])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize(
    "target", [{"scales": [1, 1, 0.5, 0.4]}, {"sizes": [1, 2, 3, 2]}, {"scales": [1, 1, 0.6, 2]}], ids=str
)
def test_resize_antialias(mode: str, exclude: int, engine: str, target) -> None:
    x = rand(1, 2, 9, 11)
    got, want = resize_pair(x, mode, "half_pixel", antialias=1, exclude_outside=exclude, engine=engine, **target)
    assert_close(got, want)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_uint8(mode: str) -> None:
    x = np.random.default_rng(0).integers(0, 256, (1, 3, 4, 5)).astype(np.uint8)
    got, want = resize_pair(x, mode, "asymmetric", scales=[1, 1, 2, 2])
    np.testing.assert_allclose(got.astype(int), want.astype(int), atol=1)
    assert got.dtype == np.uint8


# ---------------------------------------------------------------------------------------------------------
# the kernel registry
# ---------------------------------------------------------------------------------------------------------


def test_every_op_kind_but_lut_has_a_float_kernel() -> None:
    assert sorted(FLOAT_KERNELS) == sorted(set(O.OPS) - {"lut"})


def test_attr_choices_are_what_the_kernels_look_up() -> None:
    """`ops.ATTR_CHOICES` (what a serialized graph's reader accepts) names exactly the keys of the kernels'
    tables, and only fields that exist as strings on the op's attribute dataclass."""
    from dataclasses import fields

    from npuc.compiler.kernels import elementwise, resize, tensor

    choices = O.ATTR_CHOICES
    assert set(choices["eltwise"]["kind"]) == set(elementwise._BINARY)
    assert set(choices["reduce"]["kind"]) == set(tensor._REDUCERS)
    assert set(choices["pad"]["mode"]) == set(tensor._PAD_MODES)
    assert set(choices["resize"]["mode"]) == {"nearest", *resize._FILTERS}
    assert set(choices["resize"]["coord_mode"]) == set(resize.COORD_MODES)
    assert set(choices["resize"]["nearest_mode"]) == set(resize.NEAREST_MODES)
    for kind, attrs in choices.items():
        declared = {f.name: str(f.type) for f in fields(O.OPS[kind].attrs)}
        for name, values in attrs.items():
            assert declared.get(name) == "str", (kind, name)
            default = next(f.default for f in fields(O.OPS[kind].attrs) if f.name == name)
            if isinstance(default, str):
                assert default in values, (kind, name, default)
