"""npuc's DV700 output against the DMP convertor's (DigitalMediaProfessionals/tool, convertor.py at d7f1efc) on
the same Caffe network (models/caffe_nets.py): the weights file byte for byte for fp16 and 8-bit weights, with
transpose_weight 0 and 1, and an io buffer no larger than the convertor's.

The digests and sizes were produced by running the convertor on that network (with OpenCV 4.10 and 5.0, which
cluster identically): `python bench/dmp_convertor.py --tool PATH` reruns it and prints the same table.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

import npuc
from npuc.backends.dmp.artifact import load_network
from npuc.compiler.interp import run
from npuc.frontends.caffe import import_caffe
from npuc.models.caffe_nets import write_dmp_testnet

# (quantization, transpose_weight) -> sha256 of the convertor's dmpnet_weights.bin
CONVERTOR_WEIGHTS = {
    ("fp16", False): "67b009418341d3520abf578f1de10fd682c80d159dd59f4640c9d1c501f2b2a9",
    ("fp16", True): "126e06ccb47ab32d8cedae741345f3abbfa959f62502b4003b6d1440fe393f25",
    ("8bit", False): "00175dee0aa3124687ea26a2c470c9188467f105adfc2eb42d0e2d9913b5243b",
    ("8bit", True): "4d1c2c9b4f1ab128aa5611e477d514d4b33f0f09bbe3edc2dd2305de4defda52",
}
CONVERTOR_IO_SIZE = 61600  # ReserveMemory(..., io) in every one of the four generated sources
CONVERTOR_LAYERS = ["p3", "c1", "c1b", "res", "c5", "dw", "c7", "cd", "gp", "fc", "side", "dmp_conv_flat_0"]


@pytest.fixture(scope="module")
def testnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_dmp_testnet(tmp_path_factory.mktemp("dmpnet"))


@pytest.mark.parametrize("transposed", [False, True], ids=["transpose0", "transpose1"])
@pytest.mark.parametrize("quant", ["fp16", "8bit"])
def test_weights_are_the_convertors_bytes(testnet, tmp_path: Path, quant: str, transposed: bool) -> None:
    prototxt, caffemodel = testnet
    out = tmp_path / "dmpnet"
    options = {"transpose_weight": transposed}
    npuc.build(prototxt, "dmp", out, weights=caffemodel, quant=quant, options=options)
    blob = (out / "dmpnet_weights.bin").read_bytes()
    assert hashlib.sha256(blob).hexdigest() == CONVERTOR_WEIGHTS[quant, transposed]
    cpp = (out / "dmpnet_gen.cpp").read_text()
    assert ("is_weight_transposed = true;" in cpp) == transposed
    assert cpp.count("conf.input_circular_offset = 0x8000;") == (11 if transposed else 0)  # every conv command
    net, _ = load_network(out)
    assert net.io_size <= CONVERTOR_IO_SIZE
    assert [layer.name.split(", ")[-1] for layer in net.layers] == CONVERTOR_LAYERS
    assert net.layers[-1].type == "LT_FLATTEN" and net.layers[-1].output_dim == [7 * 5 * 12]


def test_both_layouts_compute_the_caffe_network(testnet, tmp_path: Path) -> None:
    prototxt, caffemodel = testnet
    x = np.random.default_rng(3).normal(0, 1, (1, 3, 20, 28)).astype(np.float32)
    want = run(import_caffe(prototxt, caffemodel), {"x": x})
    for transposed in (False, True):
        out = tmp_path / f"t{int(transposed)}"
        npuc.build(prototxt, "dmp", out, weights=caffemodel, options={"transpose_weight": transposed})
        got = npuc.run(out, {"x": x})
        assert sorted(got) == sorted(want)
        for name, value in want.items():
            a, b = got[name].ravel(), value.ravel()
            assert got[name].shape == value.shape
            assert float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) > 0.9999
