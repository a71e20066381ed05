"""Generate the small, seeded ONNX models the demo, tests and benches use.

``python -m npuc.models.make_models OUTDIR [NAME...]`` writes ``<name>.onnx`` files. Weights are seeded
normals scaled so activations stay O(1); every run writes the same bytes.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_bytes
from npuc.models.netbuilder import NetBuilder

FAMILY_SHAPE = (1, 8, 16, 16)  # the input of every per-op-family model unless it says otherwise
Builder = Callable[[NetBuilder], onnx.ModelProto]


def _single(b: NetBuilder, out: str, shape: tuple[int, ...] = FAMILY_SHAPE, opset: int = 13) -> onnx.ModelProto:
    return b.build({"input": shape}, {"output": out}, opset=opset)


# -- whole networks ------------------------------------------------------------------------------------


def tinycnn(b: NetBuilder) -> onnx.ModelProto:
    x = b.op("Relu", b.batchnorm(b.conv("input", 3, 16), 16))
    p = b.op("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("Relu", b.conv(p, 16, 16))
    r = b.op("Add", p, y)
    g = b.op("Flatten", b.op("GlobalAveragePool", r), axis=1)
    return _single(b, b.gemm(g, 16, 10), (1, 3, 32, 32))


def _basic_block(b: NetBuilder, x: str, cin: int, cout: int, stride: int) -> str:
    y = b.op("Relu", b.batchnorm(b.conv(x, cin, cout, stride=stride, bias=False), cout))
    # A small last gamma keeps the residual sum O(1) across eight blocks (like zero-init residuals).
    y = b.batchnorm(b.conv(y, cout, cout, bias=False), cout, gamma=0.3)
    if stride != 1 or cin != cout:
        x = b.batchnorm(b.conv(x, cin, cout, k=1, stride=stride, bias=False, gain=1.0), cout)
    return b.op("Relu", b.op("Add", x, y))


def resnet18_224(b: NetBuilder) -> onnx.ModelProto:
    x = b.op("Relu", b.batchnorm(b.conv("input", 3, 64, k=7, stride=2, bias=False), 64))
    x = b.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        x = _basic_block(b, x, cin, cout, stride)
        x = _basic_block(b, x, cout, cout, 1)
        cin = cout
    g = b.op("Flatten", b.op("GlobalAveragePool", x), axis=1)
    return _single(b, b.gemm(g, 512, 1000), (1, 3, 224, 224))


def resnet_stem_tall(b: NetBuilder) -> onnx.ModelProto:
    """A ResNet stem and two blocks on a tall input: layer groups must slice it into row tiles with halos."""
    x = b.op("Relu", b.batchnorm(b.conv("input", 3, 16, k=7, stride=2, bias=False), 16))
    x = b.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = _basic_block(b, x, 16, 16, 1)
    return _single(b, _basic_block(b, x, 16, 32, 2), (1, 3, 192, 160))


def resnet_deep_stage(b: NetBuilder) -> onnx.ModelProto:
    """ResNet18's third stage on a 28x28 map: 256-channel 3x3 filters (more than a cv183x lane holds) and a
    stride-2 block whose 3x3 and 1x1 convs read the same input: one layer group, filters streamed."""
    x = _basic_block(b, "input", 128, 256, 2)
    return _single(b, _basic_block(b, x, 256, 256, 1), (1, 128, 28, 28))


# -- convolutions --------------------------------------------------------------------------------------


def conv_transpose(b: NetBuilder) -> onnx.ModelProto:
    w = b.const("w", b.normal((8, 4, 2, 2), np.sqrt(2.0 / 8)))
    bias = b.const("b", b.normal((4,), 0.1))
    return _single(b, b.op("ConvTranspose", "input", w, bias, kernel_shape=[2, 2], strides=[2, 2]))


def conv_transpose_4x4(b: NetBuilder) -> onnx.ModelProto:
    """Learned 2x upsampling as real models do it: 4x4 kernel, stride 2, pad 1, then ReLU."""
    w = b.const("w", b.normal((8, 8, 4, 4), np.sqrt(2.0 / 32)))
    bias = b.const("b", b.normal((8,), 0.1))
    y = b.op("ConvTranspose", "input", w, bias, kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1])
    return _single(b, b.op("Relu", y))


def conv_asym_pad(b: NetBuilder) -> onnx.ModelProto:
    # TF "SAME" stride 2 pads only the bottom/right; then a lopsided pad on every side.
    y = b.conv("input", 8, 8, stride=2, pads=(0, 0, 1, 1))
    return _single(b, b.conv(y, 8, 8, pads=(1, 0, 2, 1)))


def conv_rect(b: NetBuilder) -> onnx.ModelProto:
    return _single(b, b.conv(b.conv("input", 8, 8, k=(1, 3)), 8, 8, k=(3, 1)))


def pad_conv(b: NetBuilder) -> onnx.ModelProto:
    pads = b.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64))
    value = b.const("pad_value", np.array(0.0, dtype=np.float32))
    return _single(b, b.conv(b.op("Pad", "input", pads, value, mode="constant"), 8, 8, pads=(0, 0, 0, 0)))


def nhwc_input(b: NetBuilder) -> onnx.ModelProto:
    # TensorFlow exports feed NHWC and transpose first; the transpose becomes the input's layout.
    x = b.op("Transpose", "input", perm=[0, 3, 1, 2])
    return _single(b, b.op("Relu", b.conv(x, 8, 8)), (1, 16, 16, 8))


def _conv_then(**conv_args: object) -> Builder:
    def build(b: NetBuilder) -> onnx.ModelProto:
        return _single(b, b.conv("input", **conv_args))  # type: ignore[arg-type]

    return build


# -- pooling -------------------------------------------------------------------------------------------


def _pool(op: str, **attrs: object) -> Builder:
    def build(b: NetBuilder) -> onnx.ModelProto:
        return _single(b, b.op(op, b.conv("input", 8, 8), **attrs))

    return build


# -- element-wise --------------------------------------------------------------------------------------


def _binary(op: str) -> Builder:
    def build(b: NetBuilder) -> onnx.ModelProto:
        return _single(b, b.op(op, b.conv("input", 8, 8), b.conv("input", 8, 8)))

    return build


def eltwise_div_const(b: NetBuilder) -> onnx.ModelProto:
    divisor = b.const("divisor", b.rng.uniform(0.5, 2.0, (1, 8, 1, 1)).astype(np.float32))
    return _single(b, b.op("Div", b.conv("input", 8, 8), divisor))


def eltwise_broadcast(b: NetBuilder) -> onnx.ModelProto:
    # Per-channel Mul then Add: an unfolded BatchNorm, as Paddle exports leave them.
    scale = b.const("scale", b.normal((1, 8, 1, 1), 0.2, 1.0))
    shift = b.const("shift", b.normal((1, 8, 1, 1), 0.2))
    return _single(b, b.op("Add", b.op("Mul", b.conv("input", 8, 8), scale), shift))


# -- activations ---------------------------------------------------------------------------------------


def _activation(op: str, opset: int = 13, **attrs: object) -> Builder:
    def build(b: NetBuilder) -> onnx.ModelProto:
        # gain 8 spreads the pre-activation over about [-6, 6], where the non-linearities bend.
        return _single(b, b.op(op, b.conv("input", 8, 8, gain=8.0), **attrs), opset=opset)

    return build


def act_prelu(b: NetBuilder) -> onnx.ModelProto:
    slope = b.const("slope", b.rng.uniform(0.05, 0.3, (8, 1, 1)).astype(np.float32))
    return _single(b, b.op("PRelu", b.conv("input", 8, 8, gain=8.0), slope))


def prelu_tall(b: NetBuilder) -> onnx.ModelProto:
    """P-Net-like: conv, PReLU, pool, conv, PReLU on a tall input, so layer groups slice PReLU into row tiles."""
    x = "input"
    for cin, cout in ((3, 16), (16, 24)):
        slope = b.const("slope", b.rng.uniform(0.05, 0.3, (cout, 1, 1)).astype(np.float32))
        x = b.op("PRelu", b.conv(x, cin, cout, gain=4.0), slope)
        if cin == 3:
            x = b.op("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2])
    return _single(b, x, (1, 3, 160, 120))


def act_relu6(b: NetBuilder) -> onnx.ModelProto:
    lo = b.const("min", np.array(0.0, dtype=np.float32))
    hi = b.const("max", np.array(6.0, dtype=np.float32))
    return _single(b, b.op("Clip", b.conv("input", 8, 8, gain=8.0), lo, hi))


def act_softmax(b: NetBuilder) -> onnx.ModelProto:
    flat = b.op("Flatten", "input", axis=1)
    return _single(b, b.op("Softmax", b.gemm(flat, 128, 10), axis=1), (1, 8, 4, 4))


# -- dense, concat, shapes, resize ---------------------------------------------------------------------


def gemm(b: NetBuilder) -> onnx.ModelProto:
    h = b.op("Relu", b.gemm(b.op("Flatten", "input", axis=1), 128, 32))
    return _single(b, b.gemm(h, 32, 10), (1, 8, 4, 4))


def matmul_dense(b: NetBuilder) -> onnx.ModelProto:
    # The Keras-export spelling of a dense layer (MTCNN R-Net): MatMul + Add.
    w = b.const("w", b.normal((128, 32), np.sqrt(1.0 / 128)))
    bias = b.const("b", b.normal((32,), 0.1))
    return _single(b, b.op("Add", b.op("MatMul", b.op("Flatten", "input", axis=1), w), bias), (1, 8, 4, 4))


def matmul_3d(b: NetBuilder) -> onnx.ModelProto:
    w = b.const("w", b.normal((32, 24), np.sqrt(1.0 / 32)))
    return _single(b, b.op("MatMul", "input", w), (1, 16, 32))


def concat(b: NetBuilder) -> onnx.ModelProto:
    parts = [b.conv("input", 8, 4), b.conv("input", 8, 6, k=1), "input"]
    return _single(b, b.op("Concat", *parts, axis=1))


def reshape_transpose(b: NetBuilder) -> onnx.ModelProto:
    # ShuffleNet's channel shuffle, then NCHW -> NHWC and a flatten of the spatial axes.
    groups = b.const("shape5", np.array([1, 2, 4, 16, 16], dtype=np.int64))
    back = b.const("shape4", np.array([1, 8, 16, 16], dtype=np.int64))
    tokens = b.const("shape3", np.array([1, 256, 8], dtype=np.int64))
    x = b.op("Reshape", b.conv("input", 8, 8), groups)
    x = b.op("Reshape", b.op("Transpose", x, perm=[0, 2, 1, 3, 4]), back)
    return _single(b, b.op("Reshape", b.op("Transpose", x, perm=[0, 2, 3, 1]), tokens))


def resize_nearest(b: NetBuilder) -> onnx.ModelProto:
    scales = b.const("scales", np.array([1, 1, 2, 2], dtype=np.float32))
    y = b.op(
        "Resize",
        b.conv("input", 8, 8),
        "",
        scales,
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    )
    return _single(b, y, (1, 8, 8, 8))


def upsample_nearest(b: NetBuilder) -> onnx.ModelProto:
    # Upsample left the standard at opset 10; older exports still carry it.
    scales = b.const("scales", np.array([1, 1, 2, 2], dtype=np.float32))
    return _single(b, b.op("Upsample", b.conv("input", 8, 8), scales, mode="nearest"), (1, 8, 8, 8), opset=9)


MODELS: dict[str, Builder] = {
    "tinycnn": tinycnn,
    "resnet18_224": resnet18_224,
    "resnet_stem_tall": resnet_stem_tall,
    "resnet_deep_stage": resnet_deep_stage,
    "conv_basic": _conv_then(cin=8, cout=16),
    "conv_stride2": _conv_then(cin=8, cout=16, stride=2),
    "conv_depthwise": _conv_then(cin=8, cout=8, group=8),
    "conv_group": _conv_then(cin=8, cout=16, group=2),
    "conv_dilated": _conv_then(cin=8, cout=8, dilation=2),
    "conv_1x1_nobias": _conv_then(cin=8, cout=16, k=1, bias=False),
    "conv_5x5": _conv_then(cin=8, cout=8, k=5),
    "conv_asym_pad": conv_asym_pad,
    "conv_rect": conv_rect,
    "conv_transpose": conv_transpose,
    "conv_transpose_4x4": conv_transpose_4x4,
    "pad_conv": pad_conv,
    "nhwc_input": nhwc_input,
    "conv_bn_relu": lambda b: _single(b, b.op("Relu", b.batchnorm(b.conv("input", 8, 16), 16))),
    "pool_max": _pool("MaxPool", kernel_shape=[2, 2], strides=[2, 2]),
    "pool_max_3x3_s2": _pool("MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "pool_avg": _pool("AveragePool", kernel_shape=[2, 2], strides=[2, 2]),
    "pool_avg_3x3_pad": _pool("AveragePool", kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0),
    "pool_avg_ceil": _pool("AveragePool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "pool_avg_asym_pad": _pool("AveragePool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1]),
    "pool_global_avg": _pool("GlobalAveragePool"),
    "eltwise_add": _binary("Add"),
    "eltwise_sub": _binary("Sub"),
    "eltwise_mul": _binary("Mul"),
    "eltwise_div_const": eltwise_div_const,
    "eltwise_broadcast": eltwise_broadcast,
    "act_relu": _activation("Relu"),
    "act_sigmoid": _activation("Sigmoid"),
    "act_tanh": _activation("Tanh"),
    "act_hardswish": _activation("HardSwish", opset=14),
    "act_hardsigmoid": _activation("HardSigmoid", alpha=0.2, beta=0.5),
    "act_leakyrelu": _activation("LeakyRelu", alpha=0.1),
    "act_prelu": act_prelu,
    "prelu_tall": prelu_tall,
    "act_relu6": act_relu6,
    "act_softmax": act_softmax,
    "gemm": gemm,
    "matmul_dense": matmul_dense,
    "matmul_3d": matmul_3d,
    "concat": concat,
    "reshape_transpose": reshape_transpose,
    "resize_nearest": resize_nearest,
    "upsample_nearest": upsample_nearest,
}


def make_model(name: str) -> onnx.ModelProto:
    """Build generated model ``name``; its seed comes from the name alone, so models are independent."""
    if name not in MODELS:
        raise UserError(f"unknown generated model {name!r}; choose one of: {', '.join(MODELS)}")
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return MODELS[name](NetBuilder(name, rng))


def make_all(outdir: str | os.PathLike[str], names: list[str] | None = None) -> dict[str, Path]:
    """Write ``<name>.onnx`` for every generated model (or just ``names``) into ``outdir``."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names or list(MODELS):
        path = out / f"{name}.onnx"
        atomic_write_bytes(path, make_model(name).SerializeToString(deterministic=True))
        paths[name] = path
    return paths


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print("usage: python -m npuc.models.make_models OUTDIR [NAME...]", file=sys.stderr)
        return 2
    try:
        for name, path in make_all(args[0], args[1:] or None).items():
            print(f"{name}\t{path}")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
