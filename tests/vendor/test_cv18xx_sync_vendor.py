"""Parallel sync ids on the vendor simulator: builds whose TDMA transfers overlap TIU work (double-buffered
row tiles, streamed filter sets, double-buffered layer groups) give the vendor's bits, the bits of the
fully ordered (serial) build, and have no race: every pair of descriptors of the two engines that touch the
same local byte is ordered by the ids (races.py, checked on the simulator's real accesses)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.races import find_races
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.backends.cv18xx.timing import schedule_model
from npuc.compiler.targets import BuildRequest
from npuc.models.netbuilder import NetBuilder

from .cv18xx_build_util import calibrated, float_graph, generated_model, random_feeds
from .cv18xx_sim import run_vendor


def _deep_convs(folder: Path) -> Path:
    """Two 3x3 convs of 128 -> 256 -> 256 channels on 14x14: their filters (295 KB + 590 KB) stream through
    local memory in output-channel tiles while the input stays resident."""
    b = NetBuilder("deep_convs", np.random.default_rng(5))
    x = b.op("Relu", b.conv("input", 128, 256))
    model = b.build({"input": (1, 128, 14, 14)}, {"output": b.conv(x, 256, 256)})
    path = folder / "deep_convs.onnx"
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def _batch_of_two(folder: Path) -> Path:
    """conv-relu, max pool, conv-relu on two 8x16x16 items: one layer group, one tile per item."""
    b = NetBuilder("batch_of_two", np.random.default_rng(6))
    x = b.op("MaxPool", b.op("Relu", b.conv("input", 8, 16)), kernel_shape=[2, 2], strides=[2, 2])
    model = b.build({"input": (2, 8, 16, 16)}, {"output": b.op("Relu", b.conv(x, 16, 16))})
    path = folder / "batch_of_two.onnx"
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


MADE_HERE = {"deep_convs": _deep_convs, "batch_of_two": _batch_of_two}


def _build(model: Path, table: Path, chip: str, out: Path, **options: object) -> Path:
    request = BuildRequest(float_graph(model), model, out, chip=chip, quant="int8", calib_table=table,
                           options={"quant_output": True, **options})  # fmt: skip
    data, _ = compile_cvimodel(request)
    out.write_bytes(data)
    return out


CASES = [
    ("resnet_stem_tall", {}),  # layer groups, each laid out away from the one before
    ("resnet_stem_tall", {"layer_group": False}),  # double-buffered row tiles
    ("deep_convs", {}),  # streamed filter sets
    ("batch_of_two", {}),  # a double-buffered group prefetches the next item
]


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
@pytest.mark.parametrize(("name", "options"), CASES)
def test_parallel_sync_is_race_free_and_bit_exact(name: str, options: dict, chip: str, tmp_path: Path) -> None:
    if name in MADE_HERE:
        model = MADE_HERE[name](tmp_path)
        table = calibrated(model, tmp_path)
    else:
        model, table = generated_model(name, tmp_path)
    feeds = random_feeds(float_graph(model), 3)
    parallel = _build(model, table, chip, tmp_path / "parallel.cvimodel", **options)
    serial = _build(model, table, chip, tmp_path / "serial.cvimodel", sync="serial", **options)
    cvi = read_cvimodel(parallel)
    assert find_races(cvi, feeds) == []
    timing = schedule_model(cvi)
    assert timing.scheduled < schedule_model(read_cvimodel(serial)).scheduled  # transfers really overlap
    ours = run_cvimodel(cvi, feeds)
    vendor = run_vendor(parallel, feeds)
    expected = run_cvimodel(read_cvimodel(serial), feeds)
    for out, value in ours.items():
        assert value.dtype == np.int8 and len(np.unique(value)) > 2
        assert np.array_equal(value, vendor[out].reshape(value.shape))
        assert np.array_equal(value, expected[out])
