"""Average pooling whose windows count fewer than kh·kw cells, on the vendor's CV18xx simulator.

ONNX divides a window that overlaps the padding (count_include_pad=0) or overhangs the input (ceil_mode=1)
by the cells it counts. npuc follows it with one rounding per output:
- int8: one TIU average pool per block of output positions whose windows count equally many cells
  (interior, edges, corners), each with the multiplier/rshift of th_in/th_out/count;
- bf16: the kh·kw average, then each block times bf16(kh·kw/count).
`npuc run` equals the vendor simulator and npuc's reference bit for bit; the dequantized output is within a
couple of int8 steps of onnxruntime's float model everywhere, borders included (a single kh·kw divisor put the
borders 30-40 steps off).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.backends.cv18xx.chips import chip_spec
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf, tiu_op_name
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.isa import ENGINE_TIU
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.compiler.interp import run
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.kernels.quantized.int8 import window_cell_counts, window_sums
from npuc.compiler.kernels.registry import FLOAT_KERNELS
from npuc.compiler.targets import BuildRequest
from npuc.models.netbuilder import NetBuilder
from npuc.passes.calibration.calibrate import tensor_table_names
from npuc.passes.calibration.calitable import read_table
from npuc.passes.quantization.quantize import quantize

from .cv18xx_build_util import build, calibrated, float_graph, generated_model, quantized_reference, random_feeds
from .cv18xx_sim import run_vendor

CHIPS = ["cv183x", "cv181x"]
FAMILIES = ["pool_avg_3x3_pad", "pool_avg_ceil", "pool_avg_asym_pad"]
SEED = 5


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _int8_graph(model: Path, table: Path):  # noqa: ANN202 - a quantized Graph
    names = tensor_table_names(onnx.load(str(model), load_external_data=False))
    return quantize(copy.deepcopy(float_graph(model)), read_table(table), "cv18xx_int8", table_names=names)


def _pool_errors(qgraph, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    """(|error| in output steps of the pool's int8 result against the float pool of its dequantized int8
    input, the same with the op's single kh·kw divisor), both (n, c, oh, ow)."""
    (op,) = [op for op in qgraph.ops if op.kind == "pool2d"]
    q = op.attrs.quant
    step_in, step_out = q.inputs[0].threshold / 127, q.output.threshold / 127
    values = run(qgraph, feeds, kernels=QUANT_KERNELS, keep_all=True)
    want = FLOAT_KERNELS["pool2d"](op, [values[op.inputs[0]].astype(np.float32) * np.float32(step_in)])[0]
    after = np.abs(values[op.outputs[0]] * step_out - want) / step_out
    single = copy.copy(q)
    single.position_multiplier = single.position_rshift = None
    op.attrs.quant = single
    before = np.abs(run(qgraph, feeds, kernels=QUANT_KERNELS, keep_all=True)[op.outputs[0]] * step_out - want)
    op.attrs.quant = q
    return after, before / step_out


def _border(shape: tuple[int, ...], counts: np.ndarray) -> np.ndarray:
    full = counts == counts.max()
    return np.broadcast_to(~full, shape)


@pytest.fixture(scope="module")
def int8_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("avgpool")
    return {family: generated_model(family, folder) for family in FAMILIES}


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("family", FAMILIES)
def test_int8_avg_pool_equals_vendor_and_follows_float(family: str, chip: str, int8_models, tmp_path: Path) -> None:
    model, table = int8_models[family]
    feeds = random_feeds(float_graph(model), SEED)
    path = build(model, table, chip, "int8", tmp_path / f"{family}.cvimodel")
    ours = run_cvimodel(read_cvimodel(path), feeds)["output"]
    vendor = run_vendor(path, feeds)["output"].reshape(ours.shape)
    qgraph = _int8_graph(model, table)
    reference = run(qgraph, feeds, kernels=QUANT_KERNELS)["output"].reshape(ours.shape)
    assert _same(ours, vendor) and _same(reference, vendor)

    (op,) = [op for op in qgraph.ops if op.kind == "pool2d"]
    counts = window_cell_counts(op, qgraph.shape(op.inputs[0])[2:], qgraph.shape(op.outputs[0])[2:])
    border = _border(ours.shape, counts)
    assert 0 < np.count_nonzero(border[0, 0]) < counts.size
    step = op.attrs.quant.output.threshold / 127
    exact = ort.InferenceSession(str(model)).run(None, feeds)[0]
    # end to end (the conv's own int8 error included): a couple of steps everywhere, borders too
    assert np.abs(ours - exact).max() <= 2.5 * step
    assert np.abs(ours - exact)[border].max() <= 2.5 * step
    # the pool alone: one rounding and the int8 multiplier's truncation; a single kh·kw divisor is far off
    after, before = _pool_errors(qgraph, feeds)
    assert after.max() <= 2.0 and after[border].max() <= 1.5
    assert before[border].max() >= 20.0 and before[~border].max() == after[~border].max()


def test_int8_pool_ops_per_block(int8_models, tmp_path: Path) -> None:
    """3x3, pad 1, stride 1 on 16x16: nine pool ops (corner, edge, interior rows x columns), each with the
    multiplier of its count; the corners divide by 4, the edges by 6, the interior by 9."""
    model, table = int8_models["pool_avg_3x3_pad"]
    path = build(model, table, "cv181x", "int8", tmp_path / "pool.cvimodel", layer_group=False)
    ins = split_cmdbuf(read_cvimodel(path).sections["subfunc_0"], chip_spec("cv181x"))
    pools = [i.fields for i in ins if i.engine == ENGINE_TIU and tiu_op_name(i.fields) == "avg_pool"]
    got = [(f["res0_h"], f["res0_w"], f["opd0_h"], f["opd0_w"], f["opd1_addr"], f["opt_res_shift"]) for f in pools]
    (op,) = [op for op in _int8_graph(model, table).ops if op.kind == "pool2d"]
    q = op.attrs.quant
    m, r = np.asarray(q.position_multiplier), np.asarray(q.position_rshift)
    rows = [(0, 1, 2), (1, 14, 16), (15, 1, 2)]  # output row block start, rows, input rows read
    want = [(h, w, ih, iw, int(m[r0, c0]), int(r[r0, c0])) for r0, h, ih in rows for c0, w, iw in rows]
    assert got == want
    th = np.float32(q.inputs[0].threshold) / np.float32(q.output.threshold)
    for count, (r0, c0) in ((4, (0, 0)), (6, (0, 5)), (9, (5, 5))):
        assert m[r0, c0] == np.trunc(th / np.float32(count) * 2.0 ** r[r0, c0])
        assert (th / count * 2.0 ** (r[r0, c0] + 1)) >= 127 > (th / count * 2.0 ** r[r0, c0])


# ---- lone pools: row tiles, strides, batches; bf16 with ceil_mode ---------------------------------------

LONE_POOLS = {  # input shape, AveragePool attributes (count_include_pad defaults to 0)
    "5x5_row_tiles": ((1, 8, 160, 160), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    "ceil_s2_batch2": ((2, 8, 15, 18), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "asym_ceil": ((1, 16, 17, 17), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1],
                                    "ceil_mode": 1}),
    "include_pad_ceil": ((1, 8, 16, 16), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                          "ceil_mode": 1, "count_include_pad": 1}),
}  # fmt: skip
# int8 pool ops: blocks x row tiles x images (5x5 on 160 rows: 5 x 5 blocks over two row tiles; the interior
# row block is split between them)
LONE_POOL_OPS = {"5x5_row_tiles": 30, "ceil_s2_batch2": 4, "asym_ceil": 6, "include_pad_ceil": 4}


def _lone_pool(shape: tuple[int, ...], attrs: dict, folder: Path) -> Path:
    vi = [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape),
          helper.make_tensor_value_info("output", TensorProto.FLOAT, None)]  # fmt: skip
    graph = helper.make_graph([helper.make_node("AveragePool", ["input"], ["output"], **attrs)], "pool", vi[:1], vi[1:])
    path = folder / "pool.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.mark.parametrize("case", list(LONE_POOLS))
def test_int8_lone_pool(case: str, tmp_path: Path) -> None:
    shape, attrs = LONE_POOLS[case]
    model = _lone_pool(shape, attrs, tmp_path)
    table = calibrated(model, tmp_path)
    feeds = random_feeds(float_graph(model), SEED)
    path = build(model, table, "cv183x", "int8", tmp_path / "pool.cvimodel")
    ours = run_cvimodel(read_cvimodel(path), feeds)["output"]
    vendor = run_vendor(path, feeds)["output"].reshape(ours.shape)
    qgraph = _int8_graph(model, table)
    assert _same(ours, vendor)
    assert _same(run(qgraph, feeds, kernels=QUANT_KERNELS)["output"].reshape(ours.shape), vendor)
    ins = split_cmdbuf(read_cvimodel(path).sections["subfunc_0"], chip_spec("cv183x"))
    assert sum(i.engine == ENGINE_TIU and tiu_op_name(i.fields) == "avg_pool" for i in ins) == LONE_POOL_OPS[case]
    after, before = _pool_errors(qgraph, feeds)
    assert after.max() <= 2.0 and before.max() >= 5.0


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("case", ["pool_avg_ceil", "ceil_s2_batch2", "asym_ceil", "include_pad_ceil"])
def test_bf16_ceil_mode_pool(case: str, chip: str, tmp_path: Path) -> None:
    if case in LONE_POOLS:
        model = _lone_pool(*LONE_POOLS[case], tmp_path)
    else:
        model, _ = generated_model(case, tmp_path)
    feeds = random_feeds(float_graph(model), SEED)
    path = build(model, None, chip, "bf16", tmp_path / "pool.cvimodel")
    ours = run_cvimodel(read_cvimodel(path), feeds)["output"]
    vendor = run_vendor(path, feeds)["output"].reshape(ours.shape)
    qgraph = quantize(copy.deepcopy(float_graph(model)), None, "cv18xx_bf16")
    assert _same(ours, vendor)
    assert _same(run(qgraph, feeds, kernels=QUANT_KERNELS)["output"].reshape(ours.shape), vendor)
    exact = ort.InferenceSession(str(model)).run(None, feeds)[0]
    # two bf16 roundings of an average (a single kh·kw divisor put the overhang a third or more off)
    scale = np.abs(exact).max()
    assert np.abs(ours - exact).max() <= (2.0**-6 if case.startswith(("ceil", "asym", "include")) else 0.025) * scale


@pytest.mark.parametrize("case", list(LONE_POOLS))
def test_counts_are_onnxruntime_divisors(case: str, tmp_path: Path) -> None:
    """The cells each window divides by are onnxruntime's: its average of a positive input divides the
    zero-padded window sum by exactly that count (padding excluded or counted, ceil_mode overhang never)."""
    shape, attrs = LONE_POOLS[case]
    model = _lone_pool(shape, attrs, tmp_path)
    graph = float_graph(model)
    (op,) = graph.ops
    x = np.random.default_rng(SEED).uniform(1.0, 2.0, shape).astype(np.float32)
    average = ort.InferenceSession(str(model)).run(None, {"input": x})[0].astype(np.float64)
    divisors = window_sums(op, x.astype(np.float64)) / average
    counts = window_cell_counts(op, shape[2:], graph.shape(op.outputs[0])[2:])
    assert counts is not None and counts.min() < counts.max() == np.prod(attrs["kernel_shape"])
    np.testing.assert_allclose(divisors, np.broadcast_to(counts, divisors.shape), rtol=1e-5)


@pytest.mark.parametrize("quant", ["int8", "bf16"])
@pytest.mark.parametrize("chip", CHIPS)
def test_border_pools_in_row_tiled_layer_groups(chip: str, quant: str, tmp_path: Path) -> None:
    """conv -> 3x3/2 average (padding excluded, ceil mode) -> conv in one group of several row tiles: each
    tile splits its border blocks at the right rows, so grouped == ungrouped == vendor (== int8 reference).
    layer_group=longest keeps the three ops together (the default cuts where recomputed rows cost more)."""
    b = NetBuilder("pool_group", np.random.default_rng(SEED))
    pooled = b.op("AveragePool", b.conv("input", 8, 16), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0],
                  ceil_mode=1, count_include_pad=0)  # fmt: skip
    model = tmp_path / "pool_group.onnx"
    onnx.save(b.build({"input": (1, 8, 318, 158)}, {"output": b.conv(pooled, 16, 8)}), model)
    table = calibrated(model, tmp_path) if quant == "int8" else None
    feeds = random_feeds(float_graph(model), SEED)
    outputs = []
    for layer_group in ("longest", False):
        options = {"quant_output": True, "layer_group": layer_group}
        request = BuildRequest(float_graph(model), model, tmp_path / "m.cvimodel", chip=chip, quant=quant,
                               calib_table=table, options=options)  # fmt: skip
        data, summary = compile_cvimodel(request)
        path = tmp_path / f"{layer_group}.cvimodel"
        path.write_bytes(data)
        if layer_group:
            assert summary["grouped_ops"] == 3 and summary["group_tiles"] > 2
        ((name, value),) = run_cvimodel(read_cvimodel(path), feeds).items()
        assert _same(value, run_vendor(path, feeds)[name].reshape(value.shape))
        outputs.append(value)
    assert _same(outputs[0], outputs[1])
    if quant == "int8":
        reference = quantized_reference(model, table, feeds)["output_i8"]
        assert np.array_equal(outputs[0].ravel(), reference.ravel())
