"""`npuc build deploy.prototxt --weights net.caffemodel --target bm1880 --calib <BMNet table>` end to end on the
golden LeNet: the final ELU (a CPU layer for BMNet) is left to the host, an ELU inside the net is named in a
clear error; the Caffe model runs in `npuc run` to the reference class and equals the ONNX build byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from golden import GOLDEN_ROOT

from npuc.backends.bm1880.container import load_bmodel
from npuc.cli.app import main

GOLDEN = GOLDEN_ROOT / "bm1880"
CALIB = GOLDEN / "bmnet_lenet_calibration.prototxt"
WEIGHTS = GOLDEN / "lenet_float.caffemodel"


def _cli(*args: object) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code or 0


def _build(model: Path, out: Path, *extra: object) -> int:
    return _cli("build", model, "--weights", WEIGHTS, "--target", "bm1880", "--calib", CALIB, *extra, "-o", out)


def _lenet_input() -> np.ndarray:
    return np.fromfile(GOLDEN / "lenet_input_1_1_28_28.bin", np.float32).reshape(1, 1, 28, 28)


def test_deploy_prototxt_names_what_stops_it(tmp_path, capsys):
    out = tmp_path / "lenet.bmodel"
    # the Data layer carries no shape: the error says how to give one
    assert _build(GOLDEN / "lenet_deploy.prototxt", out) == 2
    assert "Caffe input 'data' has no complete shape; give it with --input-shape" in capsys.readouterr().err
    # the float deploy file has two more ELUs after conv2, inside the net: npuc runs them as lookups, but the
    # vendor's table (BMNet ran ELU on the CPU) has no threshold for their outputs, and the error names it
    assert _build(GOLDEN / "lenet_deploy_float.prototxt", out) == 2
    assert "no threshold for tensor 'elu1'" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def caffe_bmodel(tmp_path_factory) -> Path:
    """lenet_deploy.prototxt built from Caffe with the BMNet text table; its final ELU stays on the host."""
    out = tmp_path_factory.mktemp("caffe") / "lenet.bmodel"
    assert _build(GOLDEN / "lenet_deploy.prototxt", out, "--input-shape", "data:1,1,28,28") == 0
    return out


def test_caffe_lenet_runs_to_the_reference_class(caffe_bmodel, tmp_path):
    np.savez(tmp_path / "in.npz", data=_lenet_input())
    assert _cli("run", caffe_bmodel, "--input", tmp_path / "in.npz", "-o", tmp_path / "out.npz") == 0
    got = np.load(tmp_path / "out.npz")
    assert list(got) == ["ip2"] and got["ip2"].shape == (1, 10)
    ref = np.fromfile(GOLDEN / "lenet_output_ref.bin", np.float32)
    assert int(np.argmax(got["ip2"])) == int(np.argmax(ref)) == 5
    threshold = load_bmodel(caffe_bmodel).commands[0].outputs[0].threshold
    assert threshold == np.float32(13.757675)  # the table's ip2 threshold
    q = np.round(got["ip2"] * 128 / np.float32(threshold)).astype(np.int64)
    assert q.tolist() == [[-19, -16, -7, 27, -3, 49, -29, 28, -6, 0]]


def test_caffe_and_onnx_builds_share_weights_and_outputs(caffe_bmodel, tmp_path):
    out = tmp_path / "onnx.bmodel"
    assert _cli("build", GOLDEN / "lenet_float.onnx", "--target", "bm1880", "--calib", CALIB, "-o", out) == 0
    ours, theirs = load_bmodel(caffe_bmodel), load_bmodel(out)
    assert ours.weights == theirs.weights and len(ours.weights[0]) == 431_660
    (a,), (b,) = ours.commands, theirs.commands
    assert a.cmdbuf == b.cmdbuf and a.neuron_size == b.neuron_size == 794

    def io(c):  # noqa: ANN001, ANN202
        return [(t.shape, t.offset, t.threshold) for t in (*c.inputs, *c.outputs)]

    assert io(a) == io(b)
