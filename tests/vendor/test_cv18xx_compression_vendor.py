"""VLC-compressed filters on cv18xx: the TDMA decodes them on the way into local memory.

Each build is made twice, with compress_weights on (the default) and off. The compressed file is smaller, its
loads decode in `npuc run` and in the vendor simulator to the same bits, and its outputs equal the build with
raw filters. On cv181x the wide model's filters are loaded, and so compressed, slice by slice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.compiler.targets import BuildRequest

from .cv18xx_build_util import calibrated, float_graph, generated_model, random_feeds
from .cv18xx_sim import run_vendor


def _wide_model(folder: Path) -> Path:
    """conv 3x3 96->192 (166 KB of int8 filters), ReLU, conv 1x1 192->64 on a 12x12 input."""
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((192, 96, 3, 3)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((64, 192, 1, 1)) * 0.08).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["output"]),
    ]
    b1 = (rng.standard_normal(192) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))]
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 96, 12, 12])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 64, 12, 12])
    graph = helper.make_graph(nodes, "wide", [x], [y], inits)
    path = folder / "wide.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("vlc")
    wide = _wide_model(folder)
    return {"resnet_stem_tall": generated_model("resnet_stem_tall", folder), "wide": (wide, calibrated(wide, folder))}


def _build(model: Path, table: Path | None, chip: str, quant: str, out: Path, compress: bool) -> tuple[Path, dict]:
    request = BuildRequest(float_graph(model), model, out, chip=chip, quant=quant, calib_table=table,
                           options={"compress_weights": compress})  # fmt: skip
    data, summary = compile_cvimodel(request)
    out.write_bytes(data)
    return out, summary


# int8 filters gain only where their codes average under 7.5 bits (the k-map costs half a bit per value):
# resnet_stem_tall's small int8 filters stay raw, so it is checked in bf16, where the exponents code well.
CASES = [("resnet_stem_tall", "bf16"), ("wide", "int8"), ("wide", "bf16")]


@pytest.mark.parametrize("chip", ["cv181x", "cv183x"])
@pytest.mark.parametrize(("name", "quant"), CASES)
def test_compressed_filters_run_bit_exactly(models, name: str, quant: str, chip: str, tmp_path: Path) -> None:
    model, table = models[name]
    calib = table if quant == "int8" else None
    packed, p_sum = _build(model, calib, chip, quant, tmp_path / "vlc.cvimodel", compress=True)
    plain, r_sum = _build(model, calib, chip, quant, tmp_path / "raw.cvimodel", compress=False)
    sliced = (name, chip) == ("wide", "cv181x")  # 166 KB of filters against 256 KB of local memory
    assert p_sum["tdma_decompressing"] >= (2 if sliced else 1)
    assert r_sum["tdma_decompressing"] == 0
    assert p_sum["weight_bytes"] < r_sum["weight_bytes"]
    assert packed.stat().st_size < plain.stat().st_size
    feeds = random_feeds(float_graph(model), 7)
    ours = run_cvimodel(read_cvimodel(packed), feeds)
    raw = run_cvimodel(read_cvimodel(plain), feeds)
    vendor = run_vendor(packed, feeds)
    for out, value in ours.items():
        assert np.array_equal(value, raw[out])
        assert np.array_equal(
            value.view(np.uint8), np.ascontiguousarray(vendor[out]).reshape(value.shape).view(np.uint8)
        )
        assert len(np.unique(value)) > 50  # a real result


@pytest.mark.parametrize("chip", ["cv181x", "cv183x"])
def test_resnet18_bench_model_runs_bit_exactly(chip: str, tmp_path: Path) -> None:
    """bench/cv18xx.py's resnet18_224 (11.7 MB of filters, streamed and compressed in slices, the quantized
    input in the shared region): `npuc run` equals the vendor simulator."""
    model, table = generated_model("resnet18_224", tmp_path)
    packed, summary = _build(model, table, chip, "int8", tmp_path / "r.cvimodel", compress=True)
    assert summary["tdma_decompressing"] > 30 and summary["private_gmem"] == 0
    feeds = random_feeds(float_graph(model), 11)
    ours = run_cvimodel(read_cvimodel(packed), feeds)["output"]
    vendor = run_vendor(packed, feeds)["output"].reshape(ours.shape)
    assert np.array_equal(ours, vendor)
    assert len(np.unique(ours)) > 100
