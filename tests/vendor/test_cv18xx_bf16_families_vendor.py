"""bf16 code generation for every generated op family on cv18xx, on the vendor simulator.

- Every family the cv18xx runs (convolutions of every shape, pooling, eltwise, the activations, FC/MatMul,
  concat, nearest upsampling), built with --quant bf16 for cv181x and cv183x: `npuc run`'s output equals the
  vendor simulator's and npuc's bf16 reference (passes.quantization.quantize + QUANT_KERNELS) bit for bit, and follows
  the float model.
- Hard-sigmoid, hard-swish, LeakyReLU and PReLU are TIU arithmetic (compiler/kernels/quantized/bf16_act.py):
  a lone activation fed every bf16 value in (-300, 300) equals the vendor and the reference bit for bit.
- The bf16 quantize rule splits off fused activations a bf16 op cannot apply (LeakyReLU, ReLU6).
- Average pooling that excludes the padding (ONNX's default) rescales the output blocks whose windows reach
  into the padding by bf16(kh·kw/count), across row tiles and with strides, asymmetric pads and ceil_mode.
- A softmax that ends a bf16 model runs in the runtime's CPU `softmax` routine on the bf16 logits as fp32.

- A bf16 convolution sums its products in float32 rounding toward zero, kernel position by position with the
  input channels innermost, the bias last (compiler/kernels/quantized/bf16_conv.py): npuc's reference equals
  the vendor on inputs where a float64 sum misses its last bit.
  npuc's simulator (backends/cv18xx/sim_tiu.py) sums the same way and reads subnormal MUL/MAC operands as
  zero, so `npuc run` equals the vendor on those inputs too.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.backends.cv18xx.chips import chip_spec
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf, tiu_op_name
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.isa import ENGINE_TIU
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.backends.cv18xx.sim_cpu import cpu_softmax
from npuc.compiler.interp import run
from npuc.compiler.kernels.conv import conv2d_nchw
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.kernels.quantized.bf16_act import bf16_constant, hard_sigmoid, hard_swish, prelu
from npuc.compiler.numformats.bf16_fp16 import round_to_bf16
from npuc.compiler.targets import BuildRequest
from npuc.compiler.toward_zero import add_toward_zero
from npuc.models.make_models import make_model
from npuc.passes.quantization.quantize import ThresholdMap, quantize

from .cv18xx_build_util import float_graph, random_feeds
from .cv18xx_sim import run_vendor

CHIPS = ["cv181x", "cv183x"]
FAMILIES = [
    "tinycnn", "conv_basic", "conv_stride2", "conv_depthwise", "conv_group", "conv_dilated", "conv_1x1_nobias",
    "conv_5x5", "conv_asym_pad", "conv_rect", "pad_conv", "conv_bn_relu",
    "pool_max", "pool_max_3x3_s2", "pool_avg", "pool_global_avg",
    "eltwise_add", "eltwise_sub", "eltwise_mul", "eltwise_div_const", "eltwise_broadcast",
    "act_relu", "act_relu6", "act_leakyrelu", "act_prelu", "act_sigmoid", "act_tanh", "act_hardswish",
    "act_hardsigmoid", "gemm", "matmul_dense", "matmul_3d", "concat", "resize_nearest", "upsample_nearest",
    "pool_avg_3x3_pad", "reshape_transpose",
]  # fmt: skip
SEED = 0
LONE_SHAPE = (1, 32, 32, 64)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _build(model: Path, chip: str, out: Path, **options: object) -> tuple[Path, dict]:
    request = BuildRequest(float_graph(model), model, out, chip=chip, quant="bf16", options=dict(options))
    data, summary = compile_cvimodel(request)
    out.write_bytes(data)
    return out, summary


def _reference(model: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    qgraph = quantize(copy.deepcopy(float_graph(model)), None, "cv18xx_bf16")
    return run(qgraph, feeds, kernels=QUANT_KERNELS)["output"]


def _three_ways(model: Path, chip: str, feeds: dict[str, np.ndarray], out: Path,
                **options: object) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(`npuc run`'s output, the vendor simulator's); npuc's bf16 reference is asserted equal to the vendor's."""
    path, _ = _build(model, chip, out, **options)
    ours = run_cvimodel(read_cvimodel(path), feeds)["output"]
    vendor = run_vendor(path, feeds)["output"].reshape(ours.shape)
    assert _same(_reference(model, feeds).reshape(ours.shape), vendor)
    assert np.all(ours.view(np.uint32) & 0xFFFF == 0)  # bf16 values
    return ours, vendor


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_family_equals_vendor_and_reference(family: str, chip: str, tmp_path: Path) -> None:
    model = tmp_path / f"{family}.onnx"
    onnx.save(make_model(family), model)
    feeds = random_feeds(float_graph(model), SEED)
    ours, vendor = _three_ways(model, chip, feeds, tmp_path / f"{family}.cvimodel")
    assert _same(ours, vendor)
    exact = run(float_graph(model), feeds)["output"].reshape(ours.shape)
    assert len(np.unique(ours)) >= min(ours.size, 100)  # a real result, not a constant
    # bf16 rounding (and tanh's table, 0.02 off at worst), nothing worse
    assert np.abs(ours - exact).max() <= 0.025 * np.abs(exact).max()


CONV_CASES = {  # family: seeds where float64 conv sums miss the vendor's last bit
    "conv_basic": [1, 3, 5], "conv_group": [5, 7], "conv_dilated": [0, 1], "conv_5x5": [4, 8],
    "conv_depthwise": [6], "eltwise_mul": [0, 2],
}  # fmt: skip


@pytest.mark.parametrize("family", list(CONV_CASES))
def test_bf16_conv_sums_equal_vendor(family: str, tmp_path: Path) -> None:
    """npuc's reference and `npuc run` on inputs where the last bit of a conv depends on the order and
    rounding of its sum."""
    model = tmp_path / f"{family}.onnx"
    onnx.save(make_model(family), model)
    path, _ = _build(model, "cv181x", tmp_path / f"{family}.cvimodel")
    misses = 0
    for seed in CONV_CASES[family]:
        feeds = random_feeds(float_graph(model), seed)
        reference = _reference(model, feeds)
        vendor = run_vendor(path, feeds)["output"].reshape(reference.shape)
        assert _same(reference, vendor)
        assert _same(run_cvimodel(read_cvimodel(path), feeds)["output"].reshape(vendor.shape), vendor)
        qgraph = quantize(copy.deepcopy(float_graph(model)), None, "cv18xx_bf16")
        conv = run(qgraph, feeds, kernels=QUANT_KERNELS, keep_all=True)
        (op,) = [op for op in qgraph.ops if op.kind == "conv2d"][:1]
        x, w, b = (conv[n] if n in conv else qgraph.const(n) for n in op.inputs)
        wide = conv2d_nchw(x.astype(np.float64), w.astype(np.float64), op.attrs.strides, op.attrs.pads,
                           op.attrs.dilations, op.attrs.group) + b.reshape(1, -1, 1, 1)  # fmt: skip
        misses += np.count_nonzero(round_to_bf16(wide.astype(np.float32)) != conv[op.outputs[0]])
    assert misses >= 1  # the float64 sum would have missed here


def test_add_toward_zero() -> None:
    one = np.float32(1.0)
    eps = np.float32(2.0**-23)
    # 1 + 1.5 ulp rounds to 1 + 1 ulp (nearest would give 1 + 2 ulp); -(1 + 1.5 ulp) to -(1 + 1 ulp)
    assert add_toward_zero(one + eps, eps / 2) == one + eps
    assert add_toward_zero(-(one + eps), -eps / 2) == -(one + eps)
    # a term far below float64's reach of the sum still pulls it toward zero
    assert add_toward_zero(one, np.float32(-(2.0**-60))) == np.nextafter(one, np.float32(0))
    assert add_toward_zero(one, np.float32(2.0**-60)) == one
    assert add_toward_zero(np.float32(3.0), np.float32(-3.0)) == 0


# ---- the TIU-arithmetic activations on every bf16 value ----------------------------------------------------


def _every_bf16_value() -> np.ndarray:
    bits = np.arange(1 << 16, dtype=np.uint32) << 16
    values = bits.view(np.float32)
    values = values[np.isfinite(values) & (np.abs(values) < 300)]
    return np.resize(values, int(np.prod(LONE_SHAPE))).reshape(LONE_SHAPE).astype(np.float32)


# per-channel PReLU slopes of every kind: negative, zero, fractional, one and above one
PRELU_SLOPES = np.linspace(-1.5, 2.375, LONE_SHAPE[1]).astype(np.float32).reshape(-1, 1, 1)
LONE = {
    "HardSigmoid": ({"alpha": 0.2, "beta": 0.5}, lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
    "HardSwish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "LeakyRelu": ({"alpha": 0.1}, lambda x: np.where(x < 0, 0.1 * x, x)),
    "PRelu": ({}, lambda x: np.where(x < 0, PRELU_SLOPES * x, x)),
}


def _lone_activation(kind: str, folder: Path) -> Path:
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, LONE_SHAPE) for n in ("input", "output")]
    inputs, init = ["input"], []
    if kind == "PRelu":
        init.append(numpy_helper.from_array(PRELU_SLOPES, "slope"))
        inputs.append("slope")
    node = helper.make_node(kind, inputs, ["output"], **LONE[kind][0])
    graph = helper.make_graph([node], kind.lower(), vi[:1], vi[1:], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    path = folder / f"{kind.lower()}.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("kind", list(LONE))
def test_tiu_activation_on_every_bf16_value(kind: str, chip: str, tmp_path: Path) -> None:
    x = _every_bf16_value()
    ours, vendor = _three_ways(_lone_activation(kind, tmp_path), chip, {"input": x}, tmp_path / f"{kind}.cvimodel")
    assert np.unique(x).size == 34603
    # subnormal MUL/MAC operands read as zero, as on the vendor: every value agrees, the subnormals included
    assert _same(ours, vendor)
    exact = LONE[kind][1](x.astype(np.float64))
    # a bf16 step of the exact function, plus what the bf16 constants move (1/6 is 0.1670 in bf16)
    assert np.all(np.abs(ours - exact) <= 2.0**-7 * np.abs(exact) + 2.0**-8)
    assert np.count_nonzero(ours != x) > x.size // 4  # the activation changed a good share of the values


def test_hard_sigmoid_and_swish_reference_steps() -> None:
    """bf16(x * bf16(alpha) + bf16(beta)) clamped to [0, 1]; hard-swish multiplies it by x, rounded once."""
    x = np.array([-4.0, -3.0, -1.0, 0.0, 1.0, 2.5, 3.0, 250.0], np.float32)
    sixth = bf16_constant(1 / 6)
    assert sixth == np.float32(0.1669921875)
    hs = hard_sigmoid(x, 1 / 6, 0.5)
    # -3 * 0.16699 + 0.5 = -0.00098 clamps to 0; +-1 * 0.16699 + 0.5 round to 0.33203125 and 0.66796875
    assert hs.tolist() == [0.0, 0.0, 0.33203125, 0.5, 0.66796875, 0.91796875, 1.0, 1.0]
    assert hard_swish(x).tolist() == [0.0, 0.0, -0.33203125, 0.0, 0.66796875, 2.296875, 3.0, 250.0]
    assert np.all(hard_swish(x).view(np.uint32) != 0x80000000)  # the TIU's zero products are +0
    # PReLU/leaky: max(x, 0) + min(x, 0) * slope, any slope sign
    y = prelu(np.array([-2.0, -0.5, 3.0], np.float32), np.array([-1.5, 0.1, 2.0], np.float32))
    assert y.tolist() == [3.0, -0.050048828125, 3.0]


def test_hard_swish_kernel_and_layer_group(tmp_path: Path) -> None:
    """Stand-alone: two ops fill beta (0.5), a MAC by bf16(1/6), the [0, 1] clamp and the multiply, all bf16
    and no table; in a layer group with its conv the activation gives the same bytes."""
    model = tmp_path / "act_hardswish.onnx"
    onnx.save(make_model("act_hardswish"), model)
    feeds = random_feeds(float_graph(model), SEED)
    alone, summary = _build(model, "cv181x", tmp_path / "alone.cvimodel", layer_group=False)
    assert summary["layer_groups"] == 0
    ins = split_cmdbuf(read_cvimodel(alone).sections["subfunc_0"], chip_spec("cv181x"))
    tiu_ops = [i.fields for i in ins if i.engine == ENGINE_TIU]
    names = [tiu_op_name(f) for f in tiu_ops]
    # the input's fp32 -> bf16 copy, the conv, the activation (one tile), the fp32 output cast
    assert names == ["copy", "conv", "max", "min", "mac", "max", "min", "mul", "xor", "copy"]
    assert all(f["opd_typ"] == 1 for f in tiu_ops[2:8])
    assert [f["opd1_addr"] for f in tiu_ops[2:8] if f["opt_opd1_const"]] == [0x3F00, 0x3F00, 0x3E2B, 0, 0x3F80]
    grouped, summary = _build(model, "cv181x", tmp_path / "grouped.cvimodel")
    assert summary["layer_groups"] == 1
    a = run_cvimodel(read_cvimodel(alone), feeds)["output"]
    b = run_cvimodel(read_cvimodel(grouped), feeds)["output"]
    assert _same(a, b) and _same(b, run_vendor(grouped, feeds)["output"].reshape(b.shape))


# ---- the quantize rule --------------------------------------------------------------------------------------


def _kinds(family: str, tmp_path: Path, scheme: str, float_layers: list[str] | None = None) -> list[tuple]:
    model = tmp_path / f"{family}.onnx"
    onnx.save(make_model(family), model)
    graph = float_graph(model)
    table = ThresholdMap({name: 4.0 for name in graph.tensors if not graph.tensors[name].is_const})
    qgraph = quantize(copy.deepcopy(graph), table, scheme, float_layers or [])
    return [(op.kind, op.attrs.quant.mode, getattr(getattr(op.attrs, "act", None), "kind", None)) for op in qgraph.ops]


def test_bf16_rule_splits_activations_a_bf16_op_cannot_apply(tmp_path: Path) -> None:
    conv_then = [("cast", "cast", None), ("conv2d", "bf16", None), ("activation", "bf16", "{}"),
                 ("cast", "cast", None)]  # fmt: skip
    for family, act in (("act_leakyrelu", "leaky_relu"), ("act_relu6", "clip")):
        expect = [(k, m, a.format(act) if a else a) for k, m, a in conv_then]
        assert _kinds(family, tmp_path, "cv18xx_bf16") == expect
    # ReLU stays fused: the TIU applies it with the result
    assert _kinds("act_relu", tmp_path, "cv18xx_bf16")[1] == ("conv2d", "bf16", "relu")
    # int8 keeps ReLU6 fused (an int8 clamp); a conv kept in bf16 hands it to a bf16 activation
    assert _kinds("act_relu6", tmp_path, "cv18xx_int8")[1] == ("conv2d", "int8", "clip")
    mixed = _kinds("act_relu6", tmp_path, "cv18xx_int8", ["conv_5"])
    assert [k[:2] for k in mixed if k[0] != "cast"] == [("conv2d", "bf16"), ("activation", "bf16")]


# ---- average pooling that excludes the padding, and the CPU softmax tail -----------------------------------

EXCLUDED_PAD_POOLS = {  # input shape, AveragePool attributes (count_include_pad defaults to 0)
    "s2_rows_tiled": ((1, 16, 64, 64), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "5x5_many_tiles": ((1, 64, 96, 96), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    "asym_ceil_batch2": ((2, 8, 15, 17), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1],
                                          "ceil_mode": 1}),
}  # fmt: skip


def _lone_pool(shape: tuple[int, ...], attrs: dict, folder: Path) -> Path:
    vi = [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape),
          helper.make_tensor_value_info("output", TensorProto.FLOAT, None)]  # fmt: skip
    graph = helper.make_graph([helper.make_node("AveragePool", ["input"], ["output"], **attrs)], "pool", vi[:1], vi[1:])
    path = folder / "pool.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.mark.parametrize("case", list(EXCLUDED_PAD_POOLS))
def test_bf16_avg_pool_excluding_padding(case: str, tmp_path: Path) -> None:
    shape, attrs = EXCLUDED_PAD_POOLS[case]
    model = _lone_pool(shape, attrs, tmp_path)
    feeds = random_feeds(float_graph(model), SEED)
    ours, vendor = _three_ways(model, "cv181x", feeds, tmp_path / "pool.cvimodel", layer_group=False)
    assert _same(ours, vendor)
    exact = run(float_graph(model), feeds)["output"].reshape(ours.shape)
    # two bf16 roundings of an average: without the rescale the border would be off by a third or more
    assert np.abs(ours - exact).max() <= 2.0**-6 * np.abs(exact).max()


def test_excluded_padding_rescales_border_blocks(tmp_path: Path) -> None:
    """3x3, pad 1, stride 1 on 16x16: the 4 corners (x9/4) and the 4 edges (x9/6) are one MUL each."""
    model = tmp_path / "pool_avg_3x3_pad.onnx"
    onnx.save(make_model("pool_avg_3x3_pad"), model)
    path, _ = _build(model, "cv181x", tmp_path / "pool.cvimodel", layer_group=False)
    ins = split_cmdbuf(read_cvimodel(path).sections["subfunc_0"], chip_spec("cv181x"))
    tiu_ops = [i.fields for i in ins if i.engine == ENGINE_TIU]
    start = [tiu_op_name(f) for f in tiu_ops].index("avg_pool")
    muls = tiu_ops[start + 1 : start + 9]
    assert [tiu_op_name(f) for f in muls] == ["mul"] * 8
    # row blocks [0,1), [1,15), [15,16) times the same column blocks, the interior left alone
    assert [(f["res0_h"], f["res0_w"], f["opd1_addr"]) for f in muls] == [
        (1, 1, 0x4010), (1, 14, 0x3FC0), (1, 1, 0x4010), (14, 1, 0x3FC0),
        (14, 1, 0x3FC0), (1, 1, 0x4010), (1, 14, 0x3FC0), (1, 1, 0x4010),
    ]  # fmt: skip
    assert tiu_op_name(tiu_ops[start + 9]) != "mul"


@pytest.mark.parametrize("chip", CHIPS)
def test_bf16_softmax_tail_runs_on_the_cpu(chip: str, tmp_path: Path) -> None:
    """The TPU writes the bf16 logits as fp32, the runtime's `softmax` routine makes the output: it equals the
    vendor's bit for bit, and the CPU routine applied to npuc's bf16 reference logits."""
    model = tmp_path / "act_softmax.onnx"
    onnx.save(make_model("act_softmax"), model)
    feeds = random_feeds(float_graph(model), SEED)
    path, _ = _build(model, chip, tmp_path / "softmax.cvimodel")
    program = read_cvimodel(path)
    ours = run_cvimodel(program, feeds)["output"]
    vendor = run_vendor(path, feeds)["output"].reshape(ours.shape)
    assert _same(ours, vendor)
    qgraph = quantize(copy.deepcopy(float_graph(model)), None, "cv18xx_bf16")
    (softmax,) = [op for op in qgraph.ops if op.kind == "softmax"]
    logits = run(qgraph, feeds, kernels=QUANT_KERNELS, keep_all=True)[softmax.inputs[0]]
    (want,) = cpu_softmax({"axis": 1}, [logits], [(np.dtype(np.float32), logits.shape)])
    assert _same(want.reshape(ours.shape), vendor)
    assert np.count_nonzero(ours.view(np.uint32) & 0xFFFF) >= 9  # fp32 probabilities, not bf16 ones
    assert abs(float(ours.sum()) - 1.0) < 1e-6
