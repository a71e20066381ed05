"""`npuc inspect MODEL --target T|all`: every op a target cannot run, all at once, before any calibration; each
listed reason is the error the real build stops with, and a model reported clean really builds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from samples import random_samples

import npuc
from npuc.compiler.errors import UserError
from npuc.compiler.targets import all_targets
from npuc.models.make_models import make_model


def _npuc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npuc", *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conv -> ReduceMin over channels (no cv18xx kernel) -> Exp -> Add back onto the conv (broadcast)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMin", ["c"], ["r"], name="low", axes=[1], keepdims=1),
        helper.make_node("Exp", ["r"], ["e"], name="exp"),
        helper.make_node("Add", ["e", "c"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "mixed", [x], [y], [w])
    path = tmp_path_factory.mktemp("check") / "mixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.fixture(scope="module")
def tinycnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("check") / "tinycnn.onnx"
    path.write_bytes(make_model("tinycnn").SerializeToString())
    return path


def _names(gaps) -> list[str]:  # noqa: ANN001
    return [g.op for g in gaps if g.judged]


def test_cv18xx_lists_every_op_per_format(mixed: Path) -> None:
    found = npuc.check(mixed, "cv18xx")
    assert set(found) == {("cv18xx", "int8"), ("cv18xx", "bf16")}
    assert _names(found["cv18xx", "int8"]) == ["low"]  # int8 exp is a table lookup
    assert _names(found["cv18xx", "bf16"]) == ["low", "exp"]  # both, although exp comes after the failed min
    exp = found["cv18xx", "bf16"][1]
    assert exp.kind == "activation" and "bf16 exp has no cv18xx kernel" in exp.reason and exp.after == ("low",)


@pytest.mark.parametrize("target, quant", [("cv18xx", "int8"), ("cv18xx", "bf16"), ("bm1880", "int8"),
                                           ("dmp", "fp16")])  # fmt: skip
def test_first_listed_op_is_where_the_build_stops(mixed: Path, tmp_path: Path, target: str, quant: str) -> None:
    gaps = npuc.check(mixed, target, quant=quant)[target, quant]
    assert gaps
    table = tmp_path / "t.txt"
    args = ["build", str(mixed), "--target", target, "--quant", quant, "-o", str(tmp_path / "out")]
    if target in ("cv18xx", "bm1880") and quant == "int8":
        data = random_samples(tmp_path / "data", (1, 8, 8, 8), 4)
        assert _npuc("calibrate", str(mixed), "--data", str(data), "-o", str(table)).returncode == 0
        args += ["--calib", str(table)]
    run = _npuc(*args)
    assert run.returncode == 2, run.stderr
    assert f"'{gaps[0].op}'" in run.stderr and gaps[0].reason.split(";")[0] in run.stderr, (run.stderr, gaps[0])


def test_a_model_reported_clean_builds(tinycnn: Path, tmp_path: Path) -> None:
    found = npuc.check(tinycnn, "all")
    buildable = {t.name for t in all_targets() if t.build is not None}
    assert {t for t, _ in found} == buildable
    assert found["cv18xx", "bf16"] == [] and found["lyngor", "fp16"] == []
    assert ("lyngor", "float16") not in found  # an alias of fp16 is not checked twice
    run = _npuc("build", str(tinycnn), "--target", "cv18xx", "--quant", "bf16", "-o", str(tmp_path / "m.cvimodel"))
    assert run.returncode == 0 and (tmp_path / "m.cvimodel").is_file(), run.stderr


def test_stand_ins_keep_later_ops_judged_on_their_own(mixed: Path) -> None:
    """DMP: after the failed ReduceMin, exp is judged on a stand-in input; the Add's own reason (a broadcast
    DV700 cannot do) is still reported."""
    gaps = npuc.check(mixed, "dmp", quant="fp16")["dmp", "fp16"]
    by_op = {g.op: g for g in gaps}
    assert "no DV700 lowering" in by_op["low"].reason and by_op["low"].after == ()
    assert "eltwise add" in by_op["add"].reason and by_op["add"].judged


def test_cli_report(mixed: Path) -> None:
    run = _npuc("inspect", str(mixed), "--target", "all")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "npuc IR after canonicalization: 4 ops" in out  # the usual description comes first
    assert "cv18xx (int8): 1 of 4 ops will not run" in out and "cv18xx (bf16): 2 of 4 ops will not run" in out
    assert "  low (reduce): reduce min has no cv18xx kernel" in out
    assert "lyngor (fp16): every op runs" in out
    for target in (t.name for t in all_targets() if t.build is not None):
        assert f"\n{target} (" in out


def test_cli_json_lists_the_same_gaps(mixed: Path) -> None:
    import json

    run = _npuc("inspect", str(mixed), "--target", "cv18xx", "--json")
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    found = npuc.check(mixed, "cv18xx")
    assert record["ops"] == found.op_count == 4
    assert [(c["target"], c["quant"]) for c in record["checks"]] == [("cv18xx", "int8"), ("cv18xx", "bf16")]
    for check, gaps in zip(record["checks"], found.values(), strict=True):
        assert check["runs"] == (not gaps) and [g["op"] for g in check["gaps"]] == [g.op for g in gaps]
    assert {"op": "low", "kind": "reduce"}.items() <= record["checks"][0]["gaps"][0].items()


def test_json_without_a_target_describes_the_file(tinycnn: Path, tmp_path: Path) -> None:
    """`npuc inspect PATH --json`: the kind, the inputs as the runtime is fed (a DMP build with --input-dtype
    uint8 takes uint8 pixels), and the text description line by line."""
    import json

    model = json.loads(_npuc("inspect", str(tinycnn), "--json").stdout)
    assert model["kind"] == "onnx" and model["runs"] is True
    assert model["inputs"] == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    out = tmp_path / "dmp"
    assert _npuc("build", str(tinycnn), "--target", "dmp", "--input-dtype", "uint8", "-o", str(out)).returncode == 0
    run = _npuc("inspect", str(out), "--json")
    record = json.loads(run.stdout)
    assert (record["kind"], record["inputs"][0]["dtype"]) == ("dmp", "uint8")
    assert record["description"] == _npuc("inspect", str(out)).stdout.rstrip("\n").splitlines()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--quant", "bf16"], "--quant and --chip go with --target T"),
        (["--target", "nosuch"], "nosuch"),
        (["--target", "cv18xx", "--quant", "fp16"], "--quant fp16 is not a number format of target 'cv18xx'"),
        (["--target", "dmp", "--chip", "cv181x"], "--chip cv181x is not a chip of target 'dmp'"),
        (["--target", "all", "--quant", "int4"], "no target has int4"),
    ],
)
def test_cli_refuses_bad_requests(mixed: Path, args: list[str], message: str) -> None:
    run = _npuc("inspect", str(mixed), *args)
    assert run.returncode == 2 and message in run.stderr and run.stderr.count("\n") == 1, run.stderr


def test_all_narrows_to_the_targets_with_the_format(mixed: Path) -> None:
    assert set(npuc.check(mixed, "all", quant="bf16")) == {("cv18xx", "bf16")}
    assert {t for t, _ in npuc.check(mixed, "all", chip="cv183x")} == {"cv18xx"}


def test_check_needs_an_onnx_model(tmp_path: Path) -> None:
    proto = tmp_path / "net.prototxt"
    proto.write_text('name: "n"\n')
    with pytest.raises(UserError, match="checks an ONNX model"):
        npuc.check(proto, "bm1880")


def test_real_recogniser_gaps(real_model) -> None:  # noqa: ANN001
    """PP-OCRv6 tiny rec runs whole on cv18xx (its spatial ReduceMeans are global pools, its unfolded BNs fold
    through the Squeeze into the convs, its GELUs are tables) and on bm1880 (transposes that move the last axis
    as byte copies, the rank-3 MatMuls as FCs over the positions with their bias adds folded in,
    tests/test_bm1880_ocr.py)."""
    path = real_model("ppocrv6_rec_tiny")
    found = npuc.check(path, "all", input_shapes=["x:1,3,48,320"])
    assert found["cv18xx", "int8"] == [] and found["cv18xx", "bf16"] == []
    assert found["bm1880", "int8"] == []


def test_bm1880_gaps_name_the_cut_that_works(real_model, tmp_path) -> None:  # noqa: ANN001
    """An op with no BM1880 form says why and names --output-names; ending the bmodel before it builds and runs
    (ddddocr's CRNN cut at its LSTM's input: the CNN on the TPU, the LSTM left to the host)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from metrics import cosine

    from npuc.models.images import model_inputs

    path, shapes = real_model("ddddocr_crnn"), ["input1:1,1,64,160"]
    (gap,) = npuc.check(path, "bm1880", input_shapes=shapes)["bm1880", "int8"]
    assert gap.kind == "recurrent" and "no BM1880 form" in gap.reason and "--output-names" in gap.reason
    cut = gap.reason.split("its input '")[1].split("'")[0]
    feeds = model_inputs("ddddocr_crnn", 3)
    (tmp_path / "data").mkdir()
    for i, feed in enumerate(feeds[:2]):
        np.savez(tmp_path / "data" / f"{i}.npz", **feed)
    npuc.calibrate(path, [tmp_path / "data"], tmp_path / "t.txt", input_shapes=shapes, method="kl")
    npuc.build(path, "bm1880", tmp_path / "c.bmodel", calib=tmp_path / "t.txt", input_shapes=shapes,
               output_names=[cut])  # fmt: skip
    out = npuc.run(tmp_path / "c.bmodel", {"input": feeds[2]["input1"]})
    proto = onnx.load(str(path))
    proto.graph.output.extend([onnx.helper.make_empty_tensor_value_info(cut)])
    (want,) = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run([cut], feeds[2])
    # measured 0.971 with this KL table of two pictures
    assert list(out) == [cut] and cosine(out[cut].reshape(want.shape), want) >= 0.95
