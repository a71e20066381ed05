"""ConvTranspose on cv18xx: a stride-1 TIU conv over an input the TIU spreads with zeros (`conv_opd0_*_ins0`).

- npuc's simulator reads the insertion fields from the descriptor bytes: a hand-built descriptor (zeros between
  rows and columns and after the last ones) gives what numpy computes on the explicitly spread input.
- The `conv_transpose` (2x2 stride 2) and `conv_transpose_4x4` (4x4 stride 2 pad 1, ReLU) families, int8 and
  bf16, on cv183x and cv181x: `npuc run` == the vendor simulator == npuc's quantized reference, bit for bit,
  and the output follows the float model (cosine >= 0.99 int8, >= 0.999 bf16).
- A tall input is cut into row tiles whose input rows map back through the insertion, still bit-exact.
- Padding larger than the kernel reaches is refused with a one-line UserError.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from metrics import cosine
from onnx import TensorProto, helper, numpy_helper

from npuc.backends.cv18xx import isa, tiu
from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.backends.cv18xx.chips import chip_spec
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf, tiu_op_name
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.emit import TIU_DEFAULTS, encode_tiu
from npuc.backends.cv18xx.lmem import LocalAllocator
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.backends.cv18xx.sim_mem import LocalMemory
from npuc.backends.cv18xx.sim_tiu import TiuContext, qdm, tiu_conv
from npuc.backends.cv18xx.weights import channel_records, conv_filter
from npuc.cli.app import main
from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.interp import run
from npuc.compiler.kernels.conv import conv2d_nchw, pad_hw
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.targets import BuildRequest
from npuc.models.make_models import make_model
from npuc.passes.calibration.calitable import read_table
from npuc.passes.quantization.quantize import quantize

from .cv18xx_build_util import build, calibrated, float_graph, generated_model, quantized_reference, random_feeds
from .cv18xx_sim import run_vendor

CHIPS = ["cv181x", "cv183x"]
FAMILIES = {"conv_transpose": (1, 4, 32, 32), "conv_transpose_4x4": (1, 8, 32, 32)}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _tiu_fields(path: Path, chip: str) -> list[dict[str, int]]:
    ins = split_cmdbuf(read_cvimodel(path).sections["subfunc_0"], chip_spec(chip))
    return [i.fields for i in ins if i.engine == isa.ENGINE_TIU]


# ---- the simulator's insertion, on one hand-built descriptor -----------------------------------------------


@pytest.mark.parametrize("chip", CHIPS)
def test_simulator_inserts_zeros_as_numpy_does(chip: str) -> None:
    """1 zero between rows, 2 between columns, 1 extra row and 2 extra columns after the last; pads 2/1/1/3;
    a 3x2 kernel: the TIU's int8 result equals a plain conv of the explicitly spread, padded input."""
    spec = chip_spec(chip)
    rng = np.random.default_rng(7)
    n, ic, oc, h, w, kh, kw = 1, 3, 5, 4, 5, 3, 2
    x = rng.integers(-128, 128, (n, ic, h, w))
    wt = rng.integers(-128, 128, (oc, ic, kh, kw))
    bias = rng.integers(-5000, 5000, oc)
    mult = np.full(oc, 1 << 30)
    shift = np.full(oc, 6)
    spread = np.zeros((n, ic, (h - 1) * 2 + 1 + 1, (w - 1) * 3 + 1 + 2), np.int64)
    spread[:, :, 0 : (h - 1) * 2 + 1 : 2, 0 : (w - 1) * 3 + 1 : 3] = x
    top, bottom, left, right = 2, 1, 1, 3
    acc = np.rint(conv2d_nchw(pad_hw(spread.astype(np.float64), (top, left, bottom, right)), wt.astype(np.float64),
                              (1, 1), (0, 0, 0, 0), (1, 1), 1)).astype(np.int64)  # fmt: skip
    oh, ow = acc.shape[2:]
    assert (oh, ow) == (9, 18)  # (4-1)*2+1+1 + 2+1 - 3 + 1, (5-1)*3+1+2 + 1+3 - 2 + 1
    expected = np.clip(qdm(acc + bias.reshape(1, -1, 1, 1), mult.reshape(1, -1, 1, 1), shift.reshape(1, -1, 1, 1)),
                       -128, 127)  # fmt: skip

    local = LocalAllocator(spec, "test")
    lx = local.tensor((n, ic, h, w), "i8")
    lw = local.tensor((1, oc, kh * kw, ic), "i8", eu_align=False)
    lp = local.tensor((1, oc, 1, 9), "i8", eu_align=False)
    ly = local.tensor((n, oc, oh, ow), "i8")
    win = tiu.Window(kh, kw, pads=(top, bottom, left, right), ins_h=1, ins_w=2)
    fields = {**TIU_DEFAULTS, **tiu.conv(ly, lx, lw, lp, win, False, True)}  # as CmdStream.tiu fills them
    fields.update({"conv_opd0_y_ins0_last": 1, "conv_opd0_x_ins0_last": 2})
    table = isa.tiu_table(spec.tiu_layout)
    decoded = isa.decode(table, encode_tiu(spec, fields))  # the simulator reads the bytes
    assert tiu_op_name(decoded) == "conv"
    lmem = LocalMemory.create(spec.lanes, spec.lmem_size)
    lmem.write(lx.addr, lx.shape, lx.strides, "i8", x)
    lmem.write(lw.addr, lw.shape, lw.strides, "i8", conv_filter(wt))
    lmem.write(lp.addr, lp.shape, lp.strides, "u8", channel_records(bias, mult, shift))
    tiu_conv(TiuContext(decoded, lmem, spec))
    got = lmem.read(ly.addr, ly.shape, ly.strides, "i8")
    assert np.array_equal(got, expected)
    assert np.count_nonzero(got == expected[0, 0, 0, 0]) < got.size // 4  # a real result, not a constant

    # one more output row than the spread input gives: a corrupt descriptor, refused by name
    bad = dict(decoded)
    bad["res0_h"] = oh + 1
    with pytest.raises(CorruptFileError, match="windows"):
        tiu_conv(TiuContext(bad, lmem, spec))


# ---- the families on the vendor simulator ------------------------------------------------------------------


def _bf16_reference(model: Path, feeds: dict[str, np.ndarray], shapes: dict | None = None) -> np.ndarray:
    qgraph = quantize(copy.deepcopy(float_graph(model, shapes)), None, "cv18xx_bf16")
    assert [op.attrs.quant.mode for op in qgraph.ops if op.kind == "conv_transpose2d"] == ["bf16"]
    return run(qgraph, feeds, kernels=QUANT_KERNELS)["output"]


def _check_bf16(model: Path, chip: str, out: Path, feeds: dict, shapes: dict | None = None) -> np.ndarray:
    request = BuildRequest(float_graph(model, shapes), model, out, chip=chip, quant="bf16", options={})
    out.write_bytes(compile_cvimodel(request)[0])
    ours = run_cvimodel(read_cvimodel(out), feeds)["output"]
    vendor = run_vendor(out, feeds)["output"].reshape(ours.shape)
    assert _same(ours, vendor)
    assert _same(_bf16_reference(model, feeds, shapes).reshape(ours.shape), vendor)
    exact = run(float_graph(model, shapes), feeds)["output"].reshape(ours.shape)
    assert cosine(ours, exact) >= 0.999
    return ours


def _check_int8(model: Path, table: Path, chip: str, out: Path, feeds: dict, shapes: dict | None = None
                ) -> np.ndarray:  # fmt: skip
    build(model, table, chip, "int8", out, shapes, quant_output=True)
    ((name, ours),) = run_cvimodel(read_cvimodel(out), feeds).items()
    vendor = run_vendor(out, feeds)[name].reshape(ours.shape)
    assert ours.dtype == np.int8 and _same(ours, vendor)
    reference = quantized_reference(model, table, feeds, shapes)
    assert np.array_equal(ours, reference["output_i8"].reshape(ours.shape))
    build(model, table, chip, "int8", out.with_suffix(".f32.cvimodel"), shapes)
    dequantized = run_cvimodel(read_cvimodel(out.with_suffix(".f32.cvimodel")), feeds)["output"]
    exact = run(float_graph(model, shapes), feeds)["output"].reshape(dequantized.shape)
    assert cosine(dequantized, exact) >= 0.99
    return ours


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_conv_transpose_bf16_equals_vendor_and_reference(family: str, chip: str, tmp_path: Path) -> None:
    model = tmp_path / f"{family}.onnx"
    onnx.save(make_model(family), model)
    feeds = random_feeds(float_graph(model), 3)
    ours = _check_bf16(model, chip, tmp_path / f"{family}.cvimodel", feeds)
    assert ours.shape == FAMILIES[family]
    assert len(np.unique(ours)) > 500
    convs = [f for f in _tiu_fields(tmp_path / f"{family}.cvimodel", chip) if tiu_op_name(f) == "conv"]
    f = convs[0]
    assert (f["conv_opd0_y_ins0"], f["conv_opd0_x_ins0"], f["conv_op_y_str"], f["conv_op_x_str"]) == (1, 1, 1, 1)
    pad = 1 if family == "conv_transpose" else 2  # dilation*(k-1) - pad
    assert (f["conv_opd0_up_pad"], f["conv_opd0_dn_pad"], f["conv_opd0_lf_pad"], f["conv_opd0_rt_pad"]) == (pad,) * 4


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_conv_transpose_int8_equals_vendor_and_reference(family: str, chip: str, tmp_path: Path) -> None:
    model, table = generated_model(family, tmp_path)
    feeds = random_feeds(float_graph(model), 3)
    ours = _check_int8(model, table, chip, tmp_path / f"{family}.cvimodel", feeds)
    assert ours.shape == FAMILIES[family]
    assert len(np.unique(ours)) > 60  # of at most 128 codes after the ReLU
    qgraph = quantize(copy.deepcopy(float_graph(model)), read_table(table), "cv18xx_int8")
    (op,) = [op for op in qgraph.ops if op.kind == "conv_transpose2d"]
    assert op.attrs.quant.mode == "int8"
    assert qgraph.const(op.inputs[1]).dtype == np.int8 and qgraph.const(op.inputs[2]).dtype == np.int32


@pytest.mark.parametrize("quant", ["int8", "bf16"])
def test_row_tiled_conv_transpose(quant: str, tmp_path: Path) -> None:
    """A 96x96 input to 192x192: output rows in several tiles, each loading the input rows its windows reach
    through the insertion (pads per tile: the halo's position in the spread input)."""
    proto = make_model("conv_transpose_4x4")
    for value, size in ((proto.graph.input[0], 96), (proto.graph.output[0], 192)):
        for dim in value.type.tensor_type.shape.dim[2:]:
            dim.dim_value = size
    del proto.graph.value_info[:]
    model = tmp_path / "tall.onnx"
    onnx.save(proto, model)
    table, shapes = calibrated(model, tmp_path), None
    feeds = random_feeds(float_graph(model), 4)
    out = tmp_path / f"tall_{quant}.cvimodel"
    if quant == "bf16":
        _check_bf16(model, "cv181x", out, feeds, shapes)
    else:
        _check_int8(model, table, "cv181x", out, feeds, shapes)
    convs = [f for f in _tiu_fields(out, "cv181x") if tiu_op_name(f) == "conv"]
    assert len(convs) > 2 and sum(f["res0_h"] for f in convs) == 192
    assert all(f["conv_opd0_y_ins0"] == 1 and f["res0_w"] == 192 and f["opd0_w"] == 96 for f in convs)
    # the first tile reads from the top pad (2 rows), later ones start on an input row or one zero above it
    assert convs[0]["conv_opd0_up_pad"] == 2 and {f["conv_opd0_up_pad"] for f in convs[1:-1]} <= {0, 1}
    assert convs[-1]["conv_opd0_dn_pad"] == 2


def _odd_conv_transpose(folder: Path, pads: list[int], output_padding: list[int], group: int = 2) -> Path:
    """3x3 stride 2 grouped ConvTranspose of 8 channels (to 3 per group) with output padding."""
    rng = np.random.default_rng(11)
    ocg = 3 if group < 8 else 1
    w = numpy_helper.from_array(rng.normal(0, 0.3, (8, ocg, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, ocg * group).astype(np.float32), "b")
    node = helper.make_node("ConvTranspose", ["input", "w", "b"], ["output"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=pads, output_padding=output_padding, group=group)  # fmt: skip
    vi = helper.make_tensor_value_info("input", TensorProto.FLOAT, (1, 8, 10, 12))
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "ct", [vi], [out], [w, b])
    path = folder / "ct_odd.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.mark.parametrize(("group", "tiu_op"), [(2, "conv"), (8, "depthwise")])
def test_grouped_conv_transpose_with_output_padding_through_the_cli(group: int, tiu_op: str, tmp_path: Path) -> None:
    """`npuc build` of a grouped (or depthwise: the TIU depthwise unit) output-padded ConvTranspose: bit-exact on
    the vendor simulator and the reference, deterministic."""
    model = _odd_conv_transpose(tmp_path, [1, 0, 1, 2], [1, 1], group)
    out = tmp_path / "ct.cvimodel"
    with pytest.raises(SystemExit) as exit_:
        main(["build", str(model), "--target", "cv18xx", "--chip", "cv181x", "--quant", "bf16", "-o", str(out)])
    assert exit_.value.code in (0, None)
    feeds = random_feeds(float_graph(model), 1)
    ours = run_cvimodel(read_cvimodel(out), feeds)["output"]
    assert ours.shape == (1, 3 * group if group < 8 else 8, 20, 24)  # 2*(10-1)+3+1 - 1-1, 2*(12-1)+3+1 - 0-2
    assert _same(ours, run_vendor(out, feeds)["output"].reshape(ours.shape))
    assert _same(ours, _bf16_reference(model, feeds).reshape(ours.shape))
    ops = [tiu_op_name(f) for f in _tiu_fields(out, "cv181x")]
    assert ops.count(tiu_op) == (group if tiu_op == "conv" else 1)
    request = BuildRequest(float_graph(model), model, out, chip="cv181x", quant="bf16", options={})
    assert compile_cvimodel(request)[0] == out.read_bytes()


def test_padding_beyond_the_kernel_is_refused(tmp_path: Path) -> None:
    model = _odd_conv_transpose(tmp_path, [3, 0, 0, 0], [0, 0])
    request = BuildRequest(float_graph(model), model, tmp_path / "x.cvimodel", chip="cv181x", quant="bf16", options={})
    with pytest.raises(UserError, match=r"pads \(3, 0, 0, 0\) larger than dilation\*\(kernel-1\)") as err:
        compile_cvimodel(request)
    assert "\n" not in str(err.value) and str(err.value).startswith("op '")
