"""Damaged inputs found by bench/fuzz.py, kept as seeded regression cases: an ONNX graph reading names nothing
defines, and DV700 layer tables whose JSON values have the wrong type or range. Each is one UserError."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from fuzzing import mutate_json  # the fuzzers' mutation, so the test replays what bench/fuzz.py found
from samples import random_samples

import npuc
from npuc.compiler.errors import UserError
from npuc.models.make_models import make_model

ROUNDS = 1000


def _tinycnn(folder: Path) -> Path:
    path = folder / "tinycnn.onnx"
    path.write_bytes(make_model("tinycnn").SerializeToString())
    return path


@pytest.mark.parametrize("where", ["node input", "graph output"])
def test_onnx_names_nothing_defines(tmp_path: Path, where: str) -> None:
    model = onnx.load(_tinycnn(tmp_path))
    if where == "node input":
        model.graph.node[3].input[0] = "nowhere"
        message = r"reads 'nowhere', which no input, initializer or earlier node defines"
    else:
        model.graph.output[0].name = "nowhere"
        message = "graph output 'nowhere' is made by no node"
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(UserError, match=message):
        npuc.inspect(tmp_path / "bad.onnx")


def test_dmp_layer_table_values_of_any_type(tmp_path: Path) -> None:
    out = tmp_path / "dmp"
    npuc.build(_tinycnn(tmp_path), "dmp", out)
    (table,) = out.glob("*_layers.json")
    good = json.loads(table.read_text())
    feed = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    rng = random.Random(0)
    outcomes = {"ok": 0, "user": 0}
    for _ in range(ROUNDS):
        table.write_text(json.dumps(mutate_json(good, rng)))
        try:
            npuc.run(out, feed)
            outcomes["ok"] += 1
        except UserError:
            outcomes["user"] += 1
    assert outcomes["user"] > ROUNDS // 4  # most damage is caught, and nothing else escapes


@pytest.mark.parametrize("perm", [[], [0] * 10, list(range(1, 11)), list(range(9))])
def test_dmp_output_perm_must_be_a_permutation(tmp_path: Path, perm: list[int]) -> None:
    """bench/fuzz.py --seed 12 case 9900: an output binding's `perm` emptied by damage indexed past the buffer."""
    out = tmp_path / "dmp"
    npuc.build(_tinycnn(tmp_path), "dmp", out)
    (table,) = out.glob("*_layers.json")
    data = json.loads(table.read_text())
    data["outputs"][0].update(view="flat", perm=perm)
    table.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"binding 'output' perm is not a permutation of its 10-element flat buffer"):
        npuc.run(out, {"input": np.zeros((1, 3, 32, 32), np.float32)})
    data["outputs"][0]["perm"] = list(range(10))[::-1]  # a true permutation is read and applied
    table.write_text(json.dumps(data))
    reversed_ = npuc.run(out, {"input": np.ones((1, 3, 32, 32), np.float32)})["output"]
    data["outputs"][0]["perm"] = None
    table.write_text(json.dumps(data))
    plain = npuc.run(out, {"input": np.ones((1, 3, 32, 32), np.float32)})["output"]
    np.testing.assert_array_equal(reversed_.reshape(-1), plain.reshape(-1)[::-1])


def test_onnx_initializer_and_attribute_damage(tmp_path: Path) -> None:
    model = onnx.load(_tinycnn(tmp_path))
    model.graph.initializer[0].dims[0] += 1  # dims that disagree with the stored data
    onnx.save(model, tmp_path / "dims.onnx")
    with pytest.raises(UserError, match=r"initializer '.*': its data does not decode"):
        npuc.inspect(tmp_path / "dims.onnx")
    model = onnx.load(_tinycnn(tmp_path))
    node = model.graph.node[0]
    node.attribute.add().CopyFrom(onnx.helper.make_attribute("auto_pad", b"\xef\xbf"))
    onnx.save(model, tmp_path / "attr.onnx")
    with pytest.raises(UserError, match="attribute 'auto_pad' is not UTF-8 text"):
        npuc.inspect(tmp_path / "attr.onnx")


def test_cvimodel_input_of_another_size(tmp_path: Path) -> None:
    out = tmp_path / "m.cvimodel"
    npuc.build(_tinycnn(tmp_path), "cv18xx", out, quant="bf16")
    with pytest.raises(UserError, match="input 'input' has 768 elements; the model's tensor 1x3x32x32 holds 3072"):
        npuc.run(out, {"input": np.zeros((1, 3, 16, 16), np.float32)})


def _node(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == op_type)


def _flatten_gemm_weight(model: onnx.ModelProto) -> None:
    weight = next(t for t in model.graph.initializer if t.name == _node(model, "Gemm").input[1])
    size = int(np.prod(weight.dims))
    del weight.dims[:]
    weight.dims.append(size)


@pytest.mark.parametrize(
    "damage, message",
    [  # found by bench/fuzz.py --seed 11 (onnx cases 1451, 4511, 6099)
        (lambda m: setattr(_node(m, "Gemm"), "op_type", "Gemm*\r"), r"\(Gemm\*\\r\)"),
        (lambda m: _node(m, "Add").output.append("extra"), "is given 2 outputs but makes 1"),
        (_flatten_gemm_weight, r"Gemm takes two matrices, got shapes \[1, 16\] and \[160\]"),
    ],
    ids=["control character in an op type", "extra output", "gemm vector"],
)
def test_onnx_node_damage_is_one_line(tmp_path: Path, damage, message: str) -> None:  # noqa: ANN001
    model = onnx.load(_tinycnn(tmp_path))
    damage(model)
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(UserError, match=message) as info:
        npuc.inspect(tmp_path / "bad.onnx")
    assert "\n" not in str(info.value) and "\r" not in str(info.value)


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda m: m.graph.node[0].attribute.append(onnx.helper.make_attribute("pads", [1, 1])),
            r"pads \[1, 1\] must be 4",
        ),
        (
            lambda m: m.graph.node[0].attribute.append(onnx.helper.make_attribute("strides", [0, 1])),
            r"strides \[0, 1\] must be 2 positive",
        ),
        (lambda m: m.graph.input[0].type.tensor_type.__setattr__("elem_type", 77), "unknown element type 77"),
    ],
    ids=["pads", "strides", "dtype"],
)
def test_onnx_attribute_values(tmp_path: Path, damage, message: str) -> None:  # noqa: ANN001
    model = onnx.load(_tinycnn(tmp_path))
    for attr in list(model.graph.node[0].attribute):
        if attr.name in ("pads", "strides"):
            model.graph.node[0].attribute.remove(attr)
    damage(model)
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(UserError, match=message):
        npuc.inspect(tmp_path / "bad.onnx")


def test_cvimodel_gmem_beyond_any_board(tmp_path: Path) -> None:
    """An io tensor 2^38 bytes into its region (one flipped bit in the tensor map) fails before allocating."""
    from npuc.backends.cv18xx.container import read_cvimodel, write_cvimodel

    out = tmp_path / "m.cvimodel"
    npuc.build(_tinycnn(tmp_path), "cv18xx", out, quant="bf16")
    model = read_cvimodel(out.read_bytes())
    io = next(t for t in model.body.programs[0].tensor_map if t.offset >> 40 >= 3)
    io.offset |= 1 << 38
    with pytest.raises(UserError, match=rf"gmem region {io.offset >> 40} of \d+ bytes is beyond any CV18xx board"):
        read_cvimodel(write_cvimodel(model))  # refused when read, before the simulator allocates


def test_cvimodel_tensor_size_not_whole_elements(tmp_path: Path) -> None:
    """An output tensor one byte larger than its float32 elements (bench/fuzz.py --seed 11, cvimodel case
    1055): refused when the file is read, one line naming it, not numpy's view error."""
    from npuc.backends.cv18xx.container import read_cvimodel, write_cvimodel

    out = tmp_path / "m.cvimodel"
    npuc.build(_tinycnn(tmp_path), "cv18xx", out, quant="bf16")
    model = read_cvimodel(out.read_bytes())
    tensor = next(t for t in model.body.programs[0].tensor_map if t.name == "output")
    tensor.size += 1
    (tmp_path / "bad.cvimodel").write_bytes(write_cvimodel(model))
    with pytest.raises(UserError, match=r"tensor 'output' is 41 bytes, not a whole number of its 4-byte elements"):
        npuc.run(tmp_path / "bad.cvimodel", {"input": np.zeros((1, 3, 32, 32), np.float32)})


def test_cvimodel_cpu_routine_without_outputs(tmp_path: Path) -> None:
    from npuc.backends.cv18xx.container import read_cvimodel, write_cvimodel
    from npuc.backends.cv18xx.sim import run_cvimodel

    model_path, data = _tinycnn(tmp_path), random_samples(tmp_path / "data", (1, 3, 32, 32), 1)
    npuc.calibrate(model_path, [data], tmp_path / "t.txt")
    out = tmp_path / "m.cvimodel"
    npuc.build(model_path, "cv18xx", out, calib=tmp_path / "t.txt")  # starts with a CPU quant routine
    model = read_cvimodel(out.read_bytes())
    model.body.programs[0].routines[0].out_tensors = []
    with pytest.raises(UserError, match=r"routine 0: CPU function 'quant' has 1 input and 0 output tensors"):
        run_cvimodel(read_cvimodel(write_cvimodel(model)), {"input": np.zeros((1, 3, 32, 32), np.float32)})


def test_local_memory_access_with_an_empty_dimension_is_bounded() -> None:
    """(1024, 2570, 16384, 0): zero bytes in total, but 321 GiB of index arithmetic on the way."""
    from npuc.backends.cv18xx.chips import chip_spec
    from npuc.backends.cv18xx.sim_mem import LocalMemory

    chip = chip_spec("cv181x")
    memory = LocalMemory.create(chip.lanes, chip.lmem_size)
    with pytest.raises(UserError, match="larger than any memory"):
        memory.read(0, (1024, 2570, 16384, 0), (1, 1, 1, 1), "bf16")
