"""bm1880 layer groups on passes/lowering/layer_group.py: residual blocks and eltwise join a group, the three --opt
levels give identical bytes out, batch 2 via --input-shape, H tiling with halos, and the output-channel split of a
conv whose weights do not fit a lane."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from metrics import cosine

from npuc.backends.bm1880 import isa
from npuc.backends.bm1880.build import compile_bmodel
from npuc.backends.bm1880.calibration import new_calibration, save_calibration
from npuc.backends.bm1880.cmdbuf import decode_cmdbuf
from npuc.backends.bm1880.container import load_bmodel, read_bmodel, write_bmodel
from npuc.backends.bm1880.groups import form_units
from npuc.backends.bm1880.quantize import lower
from npuc.backends.bm1880.sim import quantize, run_bmodel
from npuc.cli.app import main
from npuc.compiler.numformats.bm1880_int8 import bm1880_quantize_layer, bm1880_shift_requantize
from npuc.frontends.onnx import import_onnx
from npuc.models.netbuilder import NetBuilder
from npuc.passes.calibration.calibrate import max_abs_thresholds
from npuc.passes.rewrite.canonicalize import canonicalize

OPTS = ("none", "layer-group", "layer-group-weight")


def _cli(*args: object) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code or 0


def _resnet_body(b: NetBuilder) -> str:
    """Stem, an identity residual block (relu after the add), a downsampling block (3x3 s2 and 1x1 s2
    branches), PReLU and a max pool: every joinable kind, and tensors read by two layers."""
    x = b.op("Relu", b.conv("input", 3, 16))
    y = b.op("Relu", b.op("Add", x, b.conv(b.op("Relu", b.conv(x, 16, 16)), 16, 16)))
    main_branch = b.conv(b.op("Relu", b.conv(y, 16, 24, stride=2)), 24, 24)
    z = b.op("Add", main_branch, b.conv(y, 16, 24, k=1, stride=2))
    z = b.op("PRelu", z, b.const("slope", b.normal((24, 1, 1), 0.1, 0.2)))
    return b.op("MaxPool", z, kernel_shape=[2, 2], strides=[2, 2])


def _model(path: Path, body, shape: tuple[int, ...]) -> Path:  # noqa: ANN001
    """The model with a dynamic batch dim (so --input-shape may set it)."""
    b = NetBuilder("net", np.random.default_rng(5))
    model = b.build({"input": shape}, {"output": body(b)})
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]
    onnx.save(model, path)
    return path


def _graph(path: Path, shape: tuple[int, ...]):  # noqa: ANN202
    graph = import_onnx(path, {"input": shape})
    canonicalize(graph)
    return graph


def _write_table(table: dict[str, float], path: Path) -> Path:
    msg = new_calibration("net")
    for name, threshold in table.items():
        layer = msg.layer.add(name=name)
        layer.threshold_y.append(threshold)
    save_calibration(msg, path)
    return path


@pytest.fixture(scope="module")
def resnet(tmp_path_factory) -> tuple[Path, dict[str, float], np.ndarray]:
    """A small residual net at 1x3x40x32 (fits whole) and its max-abs table over three noise inputs."""
    tmp = tmp_path_factory.mktemp("resnet")
    path = _model(tmp / "res.onnx", _resnet_body, (1, 3, 40, 32))
    graph = _graph(path, (1, 3, 40, 32))
    rng = np.random.default_rng(1)
    feeds = [{"input": rng.standard_normal((1, 3, 40, 32)).astype(np.float32)} for _ in range(3)]
    return path, max_abs_thresholds(graph, feeds), feeds[0]["input"]


def test_residual_blocks_join_one_group(resnet):
    path, table, x = resnet
    graph = _graph(path, x.shape)
    units = {opt: form_units(lower(copy.deepcopy(graph), table), opt) for opt in OPTS}
    assert len(units["none"]) == 10  # every layer alone (ReLUs fused into the convs and the first add)
    (group,) = units["layer-group-weight"]
    kinds = [layer.kind for layer in group.layers]
    assert kinds.count("eltwise") == 2 and kinds.count("conv") == 6 and kinds[-2:] == ["act", "pool"]
    # the stem output (read by a conv and the add) and the first block's output (read by a 3x3 s2 and a 1x1 s2
    # conv: the 1x1 gets a copy of its rows) stay inside the group
    assert len(group.group.internal) == 9 and group.group.inputs == ["input"]
    assert sum(slot.source is not None for slot in group.slots) == 1
    outs, stats = {}, {}
    for opt in OPTS:
        model, (st,), _, _ = compile_bmodel([graph], table, None, opt, "res")
        outs[opt] = run_bmodel(read_bmodel(write_bmodel(model)), {"input": x})["output"]
        stats[opt] = st
    for opt in OPTS:
        np.testing.assert_array_equal(outs[opt], outs["none"])
    assert (stats["none"].groups, stats["layer-group"].groups, stats["layer-group-weight"].groups) == (10, 1, 1)
    assert stats["layer-group-weight"].ddr_bytes < stats["none"].ddr_bytes // 3
    assert stats["layer-group-weight"].neuron_size == 3 * 40 * 32 + 24 * 10 * 8  # only the input and the output
    ref = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    assert cosine(outs["none"], ref) >= 0.999  # measured 0.9997
    again = [write_bmodel(compile_bmodel([_graph(path, x.shape)], table, None, "layer-group", "res")[0]) for _ in "ab"]
    assert again[0] == again[1]  # deterministic bytes


@pytest.fixture(scope="module")
def tall(tmp_path_factory) -> tuple[Path, dict[str, float], np.ndarray]:
    """The residual net at 2x3x200x96: batch 2, and tiles of a few rows with halos at every layer."""
    tmp = tmp_path_factory.mktemp("tall")
    path = _model(tmp / "tall.onnx", _resnet_body, (1, 3, 200, 96))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 200, 96)).astype(np.float32)
    graph = _graph(path, (2, 3, 200, 96))
    return path, max_abs_thresholds(graph, [{"input": x}]), x


def test_batch_two_with_row_tiles_from_the_cli(tall, tmp_path):
    path, table, x = tall
    calib = _write_table(table, tmp_path / "t.pb2")
    out = tmp_path / "tall.bmodel"
    assert _cli("build", path, "--target", "bm1880", "--calib", calib, "--input-shape", "input:2,3,200,96",
                "--input-shape", "input:1,3,200,96", "--opt", "layer-group-weight", "-o", out) == 0  # fmt: skip
    model = load_bmodel(out)
    assert [c.inputs[0].shape for c in model.commands] == [(2, 3, 200, 96), (1, 3, 200, 96)]
    np.savez(tmp_path / "in.npz", input=x)
    assert _cli("run", out, "--input", tmp_path / "in.npz", "--shape", "2,3,200,96", "-o", tmp_path / "o.npz") == 0
    got = np.load(tmp_path / "o.npz")["output"]
    assert got.shape == (2, 24, 50, 24)
    for i in range(2):  # each item of the batch-2 command equals the batch-1 command on that item, exactly
        np.testing.assert_array_equal(got[i : i + 1], run_bmodel(model, {"input": x[i : i + 1]})["output"])
    ref = ort.InferenceSession(str(path)).run(None, {"input": x[:1]})[0]
    assert cosine(got[:1], ref) >= 0.999  # measured 0.9996
    # the group is computed in row tiles: loads of a few input rows, one item at a time
    loads = [i.fields for i in decode_cmdbuf(model.commands[0].cmdbuf) if i.engine == isa.ENGINE_GDMA]
    rows = {f["src_h"] for f in loads if f["direction"] == 0 and f["src_c"] == 3}
    assert max(rows) < 200 and {f["src_n"] for f in loads if f["src_c"] == 3} == {1}


def test_tall_opt_levels_agree_bit_for_bit(tall):
    path, table, x = tall
    graph = _graph(path, (2, 3, 200, 96))
    outs, stats = {}, {}
    for opt in OPTS:
        model, (st,), _, _ = compile_bmodel([graph], table, None, opt, "tall")
        outs[opt], stats[opt] = run_bmodel(model, {"input": x})["output"], st
    for opt in OPTS:
        np.testing.assert_array_equal(outs[opt], outs["none"])
    assert stats["layer-group-weight"].ddr_bytes < stats["none"].ddr_bytes
    units = form_units(lower(copy.deepcopy(graph), table), "layer-group-weight")
    assert all(unit.group.batch_step == 1 for unit in units) and max(len(u.tiles) for u in units) > 2


def test_whole_items_share_a_tile(resnet, tmp_path):
    """Batch 2 at the small shape: both items fit at once, so each load moves n=2."""
    path, table, x = resnet
    graph = _graph(path, (2, 3, 40, 32))
    xx = np.concatenate([x, x[:, :, ::-1]])
    model, (st,), _, _ = compile_bmodel([graph], table, None, "layer-group-weight", "res")
    got = run_bmodel(model, {"input": xx})["output"]
    one = compile_bmodel([_graph(path, x.shape)], table, None, "layer-group-weight", "res").model
    for i in range(2):
        np.testing.assert_array_equal(got[i : i + 1], run_bmodel(one, {"input": xx[i : i + 1]})["output"])
    loads = [i.fields for i in decode_cmdbuf(model.commands[0].cmdbuf) if i.engine == isa.ENGINE_GDMA]
    assert {f["src_n"] for f in loads if f["src_c"] == 3} == {2} and st.groups == 1


# ---- a conv whose weights do not fit one lane: split by output channels -------------------------------------


def test_output_channel_split_is_bit_exact(tmp_path):
    ic, oc = 512, 512  # 3x3: 16 lane blocks x 9 x 512 = 73728 B of weights per lane > 64 KiB
    path = _model(tmp_path / "wide.onnx", lambda b: b.conv("input", ic, oc), (2, ic, 4, 6))
    graph = _graph(path, (2, ic, 4, 6))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, ic, 4, 6)).astype(np.float32)
    table = max_abs_thresholds(graph, [{"input": x}])
    model, (st,), _, _ = compile_bmodel([graph], table, None, "layer-group-weight", "wide")
    got = run_bmodel(model, {"input": x})["output"]
    # the exact integer expectation, from the BM1880 rules of specs/bm1880.md §3.2
    w, b = graph.const(graph.ops[0].inputs[1]), graph.const(graph.ops[0].inputs[2])
    tx, ty = table["input"], table["output"]
    q = bm1880_quantize_layer(w, b, tx, ty)
    xq = np.pad(quantize(x, tx).astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = sum(np.einsum("nchw,oc->nohw", xq[:, :, ky : ky + 4, kx : kx + 6], q.weight[:, :, ky, kx].astype(np.int64))
              for ky in range(3) for kx in range(3))  # fmt: skip
    expect = bm1880_shift_requantize(acc + q.bias.astype(np.int64).reshape(1, -1, 1, 1), q.rshift)
    np.testing.assert_array_equal(np.round(got * 128 / np.float32(ty)).astype(np.int64), expect)
    convs = [i.fields for i in decode_cmdbuf(model.commands[0].cmdbuf) if i.engine == isa.ENGINE_BD]
    chunks = [f["res0_c"] for f in convs if f["tsk_typ"] == 0]
    assert max(chunks) < oc and all(c % isa.NPU_NUM == 0 for c in chunks)
    weight_loads = [i.fields for i in decode_cmdbuf(model.commands[0].cmdbuf)
                    if i.engine == isa.ENGINE_GDMA and i.flags == isa.FLAG_WEIGHT]  # fmt: skip
    assert sum(f["src_c"] for f in weight_loads[::2]) == oc  # each chunk's weights once (then its bias)
    assert st.groups == len(weight_loads) // 2 > 1
