"""`--output-names` (tpu-mlir's --output_names): the ONNX graph ends at the named tensors for build, run and
inspect alike; what only the old outputs needed is left out, and a name that matches nothing is an error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from metrics import cosine

import npuc
from npuc.models.make_models import make_model

ENDS = ["add_15", "relu_9"]  # the residual sum, and a tensor other ops still read


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cut") / "tinycnn.onnx"
    path.write_bytes(make_model("tinycnn").SerializeToString())
    return path


def _onnxruntime_at(model: Path, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's values of the tensors `names` (added as outputs of the whole model)."""
    proto = onnx.load(str(model))
    proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feed), strict=True))


def _feed() -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)}


def test_run_ends_at_the_named_tensors(model: Path) -> None:
    got = npuc.run(model, _feed(), output_names=ENDS)
    want = _onnxruntime_at(model, ENDS, _feed())
    assert list(got) == ENDS
    for name in ENDS:
        np.testing.assert_allclose(got[name].reshape(want[name].shape), want[name], rtol=1e-4, atol=1e-5)


def test_build_ends_at_the_named_tensors(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "cut.cvimodel"
    result = npuc.build(model, "cv18xx", out, quant="bf16", output_names=ENDS)
    assert any(n.startswith("the graph ends at add_15, relu_9 (--output-names): 3 of 10 nodes") for n in result.notes)
    got, want = npuc.run(out, _feed()), _onnxruntime_at(model, ENDS, _feed())
    assert sorted(got) == sorted(ENDS)
    for name in ENDS:
        assert cosine(got[name].reshape(want[name].shape), want[name]) >= 0.999
    whole = tmp_path / "whole.cvimodel"
    npuc.build(model, "cv18xx", whole, quant="bf16")
    assert list(npuc.run(whole, _feed())) == ["output"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npuc", *args], capture_output=True, text=True, check=False)


def test_inspect_shows_the_cut_graph(model: Path) -> None:
    run = _cli("inspect", str(model), "--output-names", "add_15")
    assert run.returncode == 0, run.stderr
    assert "note      the graph ends at add_15 (--output-names): 3 of 10 nodes left out" in run.stdout
    outputs = run.stdout.split("outputs\n", 1)[1].split("\n\n", 1)[0].split()
    assert outputs[0] == "add_15" and "output" not in outputs


@pytest.mark.parametrize(
    "args, message",
    [
        (["build", "--target", "cv18xx", "--quant", "bf16", "--output-names", "nosuch"],
         "--output-names 'nosuch' is made by no node of the model"),
        (["build", "--target", "cv18xx", "--quant", "bf16", "--output-names", "add_15,add_15"],
         "--output-names names a tensor twice"),
        (["build", "--target", "cv18xx", "--quant", "bf16", "--output-names", "w_1"],
         "--output-names 'w_1' is made by no node of the model"),  # an initializer
        (["build", "--target", "lyngor", "--delegate", "--output-names", "add_15"],
         "--output-names cuts an ONNX model npuc compiles"),
        (["run", "--random-input", "--output-names", "nosuch"], "--output-names 'nosuch' is made by no node"),
    ],
    ids=["unknown", "twice", "initializer", "delegate", "run"],
)  # fmt: skip
def test_bad_names_are_one_line_errors(model: Path, tmp_path: Path, args: list[str], message: str) -> None:
    command, *rest = args
    out = ["-o", str(tmp_path / "out")] if command == "build" else []
    run = _cli(command, str(model), *rest, *out)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_an_artifact_refuses_output_names(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.cvimodel"
    npuc.build(model, "cv18xx", out, quant="bf16")
    run = _cli("run", str(out), "--random-input", "--output-names", "add_15")
    assert run.returncode == 2 and "--output-names cuts an ONNX model;" in run.stderr, run.stderr
