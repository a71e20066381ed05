"""bf16 on cv18xx: table activations and int8 <-> bf16 casts inside the TPU routine, on the vendor simulator.

- bf16 sigmoid/tanh interpolate between two 256-entry bf16 tables (compiler/kernels/quantized/bf16_lut.py):
  a lone activation fed every bf16 value in (-300, 300) (34,603 of them, subnormals and zeros included) and
  the generated conv + activation models, built with --quant bf16 for cv183x and cv181x: `npuc run` equals
  the vendor simulator and npuc's bf16 reference bit for bit.
- int8 smallcnn with one middle conv kept in bf16 (--float-layers): int8 -> bf16 on the load, bf16 -> int8 by
  a bf16 multiply and the store's round-half-to-even conversion. Over a thousand of the products are exact
  ties there, so rounding half away from zero would show (it changes the vendor's logits).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from golden import GOLDEN_ROOT
from onnx import TensorProto, helper

from npuc.backends.cv18xx.chips import chip_spec
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf, tiu_op_name
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.isa import ENGINE_TDMA, ENGINE_TIU
from npuc.backends.cv18xx.sim import run_cvimodel, tdma_convert
from npuc.compiler.interp import run
from npuc.compiler.kernels.activation import erf
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.kernels.quantized.bf16_lut import slope_lookup, slope_table
from npuc.compiler.numformats.bf16_fp16 import float32_to_bf16_bits, round_to_bf16
from npuc.passes.calibration.calitable import read_table
from npuc.passes.quantization.quantize import quantize

from .cv18xx_build_util import build, float_graph, generated_model, random_feeds
from .cv18xx_sim import run_vendor

CHIPS = ["cv183x", "cv181x"]
SMALLCNN = GOLDEN_ROOT / "cv18xx"
LONE_SHAPE = (1, 32, 32, 64)
EXACT = {
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "Tanh": np.tanh,
    "Erf": lambda x: erf(x),
    "Gelu": lambda x: 0.5 * x * (1.0 + erf(x / np.sqrt(2.0))),
}
OPSET = {"Gelu": 20}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _bf16_reference(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    qgraph = quantize(copy.deepcopy(float_graph(model)), None, "cv18xx_bf16")
    return run(qgraph, feeds, kernels=QUANT_KERNELS)


def _every_bf16_value() -> np.ndarray:
    bits = np.arange(1 << 16, dtype=np.uint32) << 16
    values = bits.view(np.float32)
    values = values[np.isfinite(values) & (np.abs(values) < 300)]
    return np.resize(values, int(np.prod(LONE_SHAPE))).reshape(LONE_SHAPE).astype(np.float32)


def _lone_activation(kind: str, folder: Path) -> Path:
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, LONE_SHAPE) for n in ("input", "output")]
    graph = helper.make_graph([helper.make_node(kind, ["input"], ["output"])], kind.lower(), vi[:1], vi[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET.get(kind, 13))], ir_version=10)
    path = folder / f"{kind.lower()}.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("kind", list(EXACT))
def test_table_activation_on_every_bf16_value(kind: str, chip: str, tmp_path: Path) -> None:
    model = _lone_activation(kind, tmp_path)
    x = _every_bf16_value()
    feeds = {"input": x}
    path = build(model, None, chip, "bf16", tmp_path / f"{kind}.cvimodel")
    ours = run_cvimodel(read_cvimodel(path), feeds)["output"]
    vendor = run_vendor(path, feeds)["output"].reshape(ours.shape)
    reference = _bf16_reference(model, feeds)["output"]
    assert np.unique(x).size == 34603
    assert _same(ours, vendor)
    assert _same(ours, reference)
    assert np.all(ours.view(np.uint32) & 0xFFFF == 0)  # bf16 values
    # the interpolation is within one bf16 step of the exact function everywhere (GELU: of its value's step)
    exact = EXACT[kind](x.astype(np.float64))
    assert np.all(np.abs(ours - exact) < 0.005 + np.abs(exact) * 2.0**-8)
    lookups = [i for i in split_cmdbuf(read_cvimodel(path).sections["subfunc_0"], chip_spec(chip))
               if i.engine == ENGINE_TIU and tiu_op_name(i.fields) == "lookup"]  # fmt: skip
    assert len(lookups) % 2 == 0 and len(lookups) >= 2  # a slope and a value lookup per tile
    assert all(f.fields["opd_typ"] == 1 and (f.fields["opd1_h"], f.fields["opd1_w"]) == (32, 8) for f in lookups)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("family", ["act_sigmoid", "act_tanh"])
def test_bf16_activation_families_equal_vendor_and_reference(family: str, chip: str, tmp_path: Path) -> None:
    model, _ = generated_model(family, tmp_path)
    feeds = random_feeds(float_graph(model), 5)
    path = build(model, None, chip, "bf16", tmp_path / f"{family}.cvimodel")
    ours = run_cvimodel(read_cvimodel(path), feeds)["output"]
    vendor = run_vendor(path, feeds)["output"].reshape(ours.shape)
    reference = _bf16_reference(model, feeds)["output"]
    assert _same(ours, vendor) and _same(ours, reference)
    assert len(np.unique(ours)) > 100


@pytest.mark.parametrize("chip", CHIPS)
def test_int8_model_with_a_bf16_sigmoid(chip: str, tmp_path: Path) -> None:
    """int8 conv, then the sigmoid kept in bf16: int8 -> bf16 cast, the table kernel, the fp32 output."""
    model, table = generated_model("act_sigmoid", tmp_path)
    feeds = random_feeds(float_graph(model), 11)
    path = build(model, table, chip, "int8", tmp_path / "mixed.cvimodel", float_layers=["sigmoid_4"])
    ours = run_cvimodel(read_cvimodel(path), feeds)["output"]
    vendor = run_vendor(path, feeds)["output"].reshape(ours.shape)
    qgraph = quantize(copy.deepcopy(float_graph(model)), read_table(table), "cv18xx_int8", ["sigmoid_4"])
    assert [op.attrs.quant.mode for op in qgraph.ops] == ["cast", "int8", "cast", "bf16", "cast"]
    reference = run(qgraph, feeds, kernels=QUANT_KERNELS)["output"]
    assert _same(ours, vendor) and _same(ours, reference)
    assert 0.0 < ours.min() and ours.max() <= 1.0 and len(np.unique(ours)) > 50


@pytest.fixture(scope="module")
def smallcnn_feeds() -> dict[str, np.ndarray]:
    with np.load(SMALLCNN / "smallcnn_in.npz") as d:
        return {"input": d["input"]}


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize(("layer", "cast"), [("conv_11", "relu_17_i8"), ("conv_19", "bn_24_i8")])
def test_smallcnn_with_one_bf16_conv(layer: str, cast: str, chip: str, tmp_path: Path,
                                     smallcnn_feeds: dict[str, np.ndarray]) -> None:  # fmt: skip
    model, table = SMALLCNN / "smallcnn.onnx", SMALLCNN / "smallcnn_cali_table.txt"
    qgraph = quantize(copy.deepcopy(float_graph(model)), read_table(table), "cv18xx_int8", [layer])
    modes = {op.name: op.attrs.quant.mode for op in qgraph.ops}
    assert modes[layer] == "bf16" and modes[cast] == "cast" and list(modes.values()).count("bf16") == 1
    reference = run(qgraph, smallcnn_feeds, kernels=QUANT_KERNELS, keep_all=True)
    # the bf16 -> int8 cast has exact .5 ties, where half-even and half-away rounding disagree
    (cast_op,) = [op for op in qgraph.ops if op.name == cast]
    product = round_to_bf16(reference[cast_op.inputs[0]] * _bf16(127.0 / cast_op.attrs.quant.output.threshold))
    assert np.count_nonzero(product - np.floor(product) == 0.5) > 150
    path = build(model, table, chip, "int8", tmp_path / "q.cvimodel", float_layers=[layer], quant_output=True)
    ours = run_cvimodel(read_cvimodel(path), smallcnn_feeds)["output_i8"]
    vendor = run_vendor(path, smallcnn_feeds)["output_i8"].reshape(ours.shape)
    assert ours.dtype == np.int8 and _same(ours, vendor)
    assert np.array_equal(ours.ravel(), reference["output_i8"].ravel())
    path = build(model, table, chip, "int8", tmp_path / "f.cvimodel", float_layers=[layer], layer_group=False)
    ours = run_cvimodel(read_cvimodel(path), smallcnn_feeds)["output"]
    assert _same(ours, run_vendor(path, smallcnn_feeds)["output"].reshape(ours.shape))
    assert int(np.argmax(ours)) == 0  # smallcnn's class for this input, as in the all-int8 build


def _bf16(value: float) -> np.float32:
    bits = float32_to_bf16_bits(np.float32(value)).astype(np.uint32) << 16
    return bits.view(np.float32)


def test_smallcnn_cast_kernel_layout(tmp_path: Path) -> None:
    """The bf16 -> int8 cast: a bf16 load, one bf16 multiply, an int8 store that converts."""
    path = build(SMALLCNN / "smallcnn.onnx", SMALLCNN / "smallcnn_cali_table.txt", "cv181x", "int8",
                 tmp_path / "m.cvimodel", float_layers=["conv_19"], layer_group=False)  # fmt: skip
    ins = split_cmdbuf(read_cvimodel(path).sections["subfunc_0"], chip_spec("cv181x"))
    stores = [i.fields for i in ins if i.engine == ENGINE_TDMA and i.fields["trans_dir"] == 1]
    converting = [f for f in stores if (f["src_fmt"], f["dst_fmt"]) == (2, 1)]
    assert converting and all(f["int8_rnd_mode"] == 0 and f["int8_sign"] == 1 for f in converting)


def test_tdma_bf16_to_int8_rounding_modes() -> None:
    x = np.array([-200.0, -2.5, -1.5, -0.75, -0.5, 0.5, 0.75, 1.5, 2.5, 126.5, 200.0], np.float32)
    bits = float32_to_bf16_bits(x).astype(np.uint16)
    assert tdma_convert(bits, "bf16", "i8").tolist() == [-128, -2, -2, -1, 0, 0, 1, 2, 2, 126, 127]
    assert tdma_convert(bits, "bf16", "i8", toward_zero=True).tolist() == [-128, -2, -1, 0, 0, 0, 0, 1, 2, 126, 127]


def test_slope_tables() -> None:
    for kind, fn in (("sigmoid", EXACT["Sigmoid"]), ("tanh", EXACT["Tanh"])):
        t = slope_table(kind)
        assert t.base.shape == t.slope.shape == (256,) and t.base.dtype == np.float32
        by_index = np.roll(t.base, 128)  # entries for indices -128..127
        assert np.all(np.diff(by_index) >= 0)  # both functions increase
        assert np.all(float32_to_bf16_bits(t.base).astype(np.uint32) << 16 == t.base.view(np.uint32))
        k = np.arange(-128, 128)
        assert np.abs(by_index - fn(k / float(t.scale))).max() <= 2.0**-8
    # the byte of the int8 index picks the entry: code -1 is byte 255, whose x is -1/scale
    t = slope_table("sigmoid")
    assert float(t.scale) == 10.0 and t.base[0] == 0.5 and t.base[255] == _bf16(1 / (1 + np.exp(0.1)))
    # index 3.5 steps = 0.35: base[3] + 0.5 * slope[3]; -0.35: base[-3] - 0.5 * (base[-3] - base[-4])
    y = slope_lookup(np.array([0.35, -0.35, 50.0, -50.0], np.float32), "sigmoid")
    assert y[0] == _bf16(t.base[3] + np.float32(0.5) * t.slope[3])
    assert y[1] == _bf16(t.base[253] - np.float32(0.5) * t.slope[253])
    assert y[2] == t.base[127] and y[3] == t.base[128]  # clamped to the table's ends
