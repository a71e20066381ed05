"""int8 lookup-table activations on cv18xx: npuc's cvimodels on the vendor simulator, bit for bit.

Generated act_* models, calibrated by npuc on random inputs, built for cv183x (tens_lookup bit) and cv181x
(eu 12 alone): the vendor simulator's output equals `run_cvimodel`'s, and with --quant-output the int8
result equals the quantized interpreter's (the tensor before the output dequant). One larger, batched
shape exercises the tiling around the once-loaded table.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.backends.cv18xx.chips import chip_spec
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf, tiu_op_name
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.emit import TIU_DEFAULTS
from npuc.backends.cv18xx.isa import ENGINE_TDMA, ENGINE_TIU
from npuc.backends.cv18xx.kernels.lut import lookup, replicated_table
from npuc.backends.cv18xx.lmem import LTensor, local_strides
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.backends.cv18xx.sim_mem import LocalMemory
from npuc.backends.cv18xx.sim_tiu import TIU_KERNELS, TiuContext
from npuc.compiler.interp import run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.targets import BuildRequest
from npuc.frontends.onnx import import_onnx
from npuc.models.make_models import make_model
from npuc.passes.calibration.calibrate import calibrate
from npuc.passes.calibration.calitable import CalibrationTable, read_table, write_table
from npuc.passes.quantization.quantize import quantize
from npuc.passes.rewrite.canonicalize import canonicalize

from .cv18xx_sim import run_vendor

MODELS = ["act_sigmoid", "act_tanh", "act_hardswish", "act_hardsigmoid", "act_leakyrelu"]
CHIPS = ["cv183x", "cv181x"]
SHAPE = (1, 8, 16, 16)
BIG_SHAPE = (2, 8, 96, 200)  # 19200 bytes per lane per channel group: two rows of tiles per image


def _samples(folder: Path, shape: tuple[int, ...], count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    folder.mkdir()
    feeds = [{"input": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]
    for i, feed in enumerate(feeds):
        np.savez(folder / f"{i}.npz", **feed)
    return feeds


def _up_to_activation(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model cut before its last node, so the conv output is a graph output of its own."""
    cut = copy.deepcopy(model)
    last = cut.graph.node[-1]
    cut.graph.node.remove(last)
    cut.graph.output[0].name = last.input[0]
    return cut


def _dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with symbolic input and output dims, so a test may pin another shape."""
    for vi in [*model.graph.input, *model.graph.output]:
        for i, dim in enumerate(vi.type.tensor_type.shape.dim):
            dim.dim_param = f"d{i}"
    return model


def _table(path: Path, samples: Path, shape: tuple[int, ...]) -> CalibrationTable:
    """npuc's table for the model; plus the pre-activation row of an activation canonicalize fuses into the
    conv (leaky relu), which calibration does not observe but int8 needs (from the same calibration)."""
    shapes = {"input": shape}
    table = calibrate(path, [samples], input_shapes=shapes).table
    model = onnx.load(path)
    if model.graph.node[-1].op_type == "LeakyRelu":
        cut_path = path.with_name(path.stem + "_cut.onnx")
        cut_path.write_bytes(_up_to_activation(model).SerializeToString())
        cut = calibrate(cut_path, [samples], input_shapes=shapes).table
        table.entries.update({k: v for k, v in cut.entries.items() if k not in table.entries})
    return table


class Case:
    def __init__(self, name: str, root: Path, shape: tuple[int, ...] = SHAPE) -> None:
        root.mkdir(parents=True)
        self.path = root / f"{name}.onnx"
        model = make_model(name)
        self.path.write_bytes((model if shape == SHAPE else _dynamic(model)).SerializeToString())
        feeds = _samples(root / "samples", shape, 5, seed=len(name))
        self.feeds = feeds[0]
        self.table_path = root / "cali_table.txt"
        write_table(_table(self.path, root / "samples", shape), self.table_path)
        self.graph = import_onnx(self.path, {"input": shape}, [])
        canonicalize(self.graph)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.qgraph = quantize(copy.deepcopy(self.graph), read_table(self.table_path), "cv18xx_int8")
        self.reference = run(self.qgraph, self.feeds, kernels=QUANT_KERNELS, keep_all=True)
        self.root = root

    def build(self, chip: str, **options: object) -> Path:
        request = BuildRequest(self.graph, self.path, self.root / "m.cvimodel", chip=chip, quant="int8",
                               calib_table=self.table_path, options=dict(options))  # fmt: skip
        data, _ = compile_cvimodel(request)
        out = self.root / f"{chip}_{'i8' if options else 'f32'}.cvimodel"
        out.write_bytes(data)
        return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("lut")
    return {name: Case(name, root / name) for name in MODELS}


def _lut_op(g: Graph):  # noqa: ANN202
    (op,) = [op for op in g.ops if op.kind == "activation"]
    return op


@pytest.mark.parametrize("name", MODELS)
def test_activation_is_an_int8_table(name: str, cases: dict[str, Case]) -> None:
    g = cases[name].qgraph
    op = _lut_op(g)
    assert g.tensors[op.inputs[0]].dtype == g.tensors[op.outputs[0]].dtype == "int8"
    lut = np.asarray(op.attrs.quant.lut)
    assert lut.shape == (256,) and lut.dtype == np.int8
    # a real non-linearity: more than a handful of distinct codes, and not the identity
    assert len(np.unique(lut)) > 40
    assert not np.array_equal(lut.view(np.uint8), np.arange(256, dtype=np.uint8))


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("name", MODELS)
def test_lut_model_runs_bit_exactly_on_the_vendor_simulator(name: str, chip: str, cases: dict[str, Case]) -> None:
    case = cases[name]
    # float output (TPU dequant): vendor == npuc bit for bit
    path = case.build(chip)
    ours = run_cvimodel(read_cvimodel(path), case.feeds)["output"]
    vendor = run_vendor(path, case.feeds)["output"]
    assert ours.shape == vendor.shape == SHAPE and ours.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), vendor.view(np.uint32))
    # int8 output: vendor == npuc == the quantized interpreter on the tensor before the dequant
    path = case.build(chip, quant_output=True)
    ours = run_cvimodel(read_cvimodel(path), case.feeds)["output_i8"]
    vendor = run_vendor(path, case.feeds)["output_i8"]
    ref = case.reference["output_i8"]
    assert ours.dtype == np.int8
    assert np.array_equal(ours.ravel(), vendor.ravel())
    assert np.array_equal(ours.ravel(), ref.ravel())
    pre = case.reference[_lut_op(case.qgraph).inputs[0]]
    assert np.count_nonzero(ref != pre) > ref.size // 4  # the lookup changed most codes
    assert len(np.unique(ref)) > 20


@pytest.mark.parametrize("chip", CHIPS)
def test_cmdbuf_and_weights(chip: str, cases: dict[str, Case]) -> None:
    case = cases["act_sigmoid"]
    spec = chip_spec(chip)
    # the stand-alone lookup kernel's layout (in a layer group the lookup reads a slot of the group's plan)
    model = read_cvimodel(case.build(chip, quant_output=True, layer_group=False))
    ins = split_cmdbuf(model.sections["subfunc_0"], spec)
    lookups = [i.fields for i in ins if i.engine == ENGINE_TIU and tiu_op_name(i.fields) == "lookup"]
    assert len(lookups) == 1
    f = lookups[0]
    assert (f["tsk_typ"], f["tsk_eu_typ"]) == ((3, 0) if chip == "cv183x" else (3, 12))
    assert f.get("tens_lookup", 1) == 1
    assert (f["opd1_n"], f["opd1_c"], f["opd1_h"], f["opd1_w"]) == (1, spec.lanes, 16, 16)
    table = f["opd1_addr"]  # the unit may sit anywhere in local memory (reorder.place_unit)
    assert (f["res0_addr"], f["opd0_addr"]) == (table + 256, table + 256)  # in place after the table
    assert (f["opt_res0_sign"], f["opt_opd0_sign"], f["opt_opd1_sign"]) == (0, 0, 0)
    layer = [i.fields for i in ins if i.engine == ENGINE_TDMA and i.fields["layer_ID"] == f["layer_info"]]
    assert [t["trans_dir"] for t in layer] == [0, 0, 1]  # the table, the tile in, the tile out
    assert layer[0]["src_base_reg_sel"] == 1  # the table comes from the weight region
    (entry,) = [w for w in model.body.weight_map if w.name.endswith("_lut")]
    lut = np.asarray(_lut_op(case.qgraph).attrs.quant.lut, np.int8)
    weights = model.sections["weight"]
    start = entry.offset & ((1 << 40) - 1)
    assert entry.size == spec.lanes * 256
    expect = np.tile(lut.view(np.uint8), spec.lanes).tobytes()
    assert weights[start : start + entry.size] == expect


@pytest.mark.parametrize("chip", CHIPS)
def test_tiled_batched_lookup_matches(chip: str, tmp_path: Path) -> None:
    case = Case("act_tanh", tmp_path / "big", BIG_SHAPE)
    path = case.build(chip, quant_output=True)
    model = read_cvimodel(path)
    ins = split_cmdbuf(model.sections["subfunc_0"], chip_spec(chip))
    # 2 images x at least 2 row tiles (shorter double-buffered ones where they cost less: group_plan.tile_height)
    assert sum(i.engine == ENGINE_TIU and tiu_op_name(i.fields) == "lookup" for i in ins) >= 4
    ours = run_cvimodel(model, case.feeds)["output_i8"]
    vendor = run_vendor(path, case.feeds)["output_i8"]
    assert ours.size == int(np.prod(BIG_SHAPE))
    assert np.array_equal(ours.ravel(), vendor.ravel())
    assert np.array_equal(ours.ravel(), case.reference["output_i8"].ravel())


def test_simulated_lookup_uses_each_lanes_own_table() -> None:
    """An operand starting in lane 3 reads lane (3 + c) % lanes's table; tables differ per lane here."""
    spec = chip_spec("cv181x")
    lmem = LocalMemory.create(spec.lanes, spec.lmem_size)
    tables = np.stack([(np.arange(256) * (lane + 1)) % 256 for lane in range(spec.lanes)]).astype(np.uint8)
    lmem.data[:, :256] = tables
    shape = (1, 10, 3, 5)
    x = np.arange(150, dtype=np.int64).reshape(shape) * 7 % 256
    addr = 3 * spec.lmem_size + 512
    t = LTensor(addr, shape, "i8", local_strides(spec, shape, "i8"))
    lmem.write(addr, shape, t.strides, "u8", x)
    table = LTensor(0, (1, spec.lanes, 16, 16), "i8", local_strides(spec, (1, spec.lanes, 16, 16), "i8"))
    f = {**TIU_DEFAULTS, **lookup(spec, t, t, table)}
    TIU_KERNELS[tiu_op_name(f)](TiuContext(f, lmem, spec))
    lanes = (3 + np.arange(10)) % spec.lanes
    expect = tables[lanes[None, :, None, None], x]
    assert np.array_equal(lmem.read(addr, shape, t.strides, "u8"), expect)


def test_replicated_table_layout() -> None:
    lut = np.arange(-128, 128, dtype=np.int8)[::-1]
    rep = replicated_table(chip_spec("cv183x"), lut)
    assert rep.shape == (1, 32, 16, 16) and rep.dtype == np.int8
    assert np.array_equal(rep.reshape(32, 256), np.tile(lut, (32, 1)))
