"""Layer groups on the vendor CV18xx simulator: a grouped build, row-tiled with halos, runs bit-exactly like
`npuc run`, gives the very bits of the ungrouped build and of npuc's int8 reference, and moves fewer bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.backends.cv18xx.traffic import lower_bound, tdma_traffic
from npuc.compiler.targets import BuildRequest

from .cv18xx_build_util import float_graph, generated_model, quantized_reference, random_feeds
from .cv18xx_sim import run_vendor

NAME = "resnet_stem_tall"  # 3x192x160: a 7x7/2 stem, a 3x3/2 max pool and two residual blocks


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, dict]:
    folder = tmp_path_factory.mktemp("lg")
    model, table = generated_model(NAME, folder)
    feeds = random_feeds(float_graph(model), 11)
    return model, table, feeds, quantized_reference(model, table, feeds)


def _build(model: Path, table: Path, chip: str, out: Path, layer_group: bool, quant: str = "int8"
           ) -> tuple[Path, dict]:  # fmt: skip
    request = BuildRequest(float_graph(model), model, out, chip=chip, quant=quant, calib_table=table,
                           options={"quant_output": quant == "int8", "layer_group": layer_group})  # fmt: skip
    data, summary = compile_cvimodel(request)
    out.write_bytes(data)
    return out, summary


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
def test_grouped_build_is_bit_exact_and_moves_less(chip: str, case, tmp_path: Path) -> None:
    model, table, feeds, reference = case
    grouped, g_sum = _build(model, table, chip, tmp_path / "lg.cvimodel", True)
    single, s_sum = _build(model, table, chip, tmp_path / "nolg.cvimodel", False)
    assert s_sum["layer_groups"] == 0 and g_sum["layer_groups"] >= 1
    assert g_sum["group_tiles"] > g_sum["layer_groups"]  # at least one group is sliced into row tiles
    outputs = []
    for path in (grouped, single):
        ours = run_cvimodel(read_cvimodel(path), feeds)
        vendor = run_vendor(path, feeds)
        ((name, value),) = ours.items()
        assert value.dtype == np.int8 and value.shape == (1, 32, 24, 20)
        assert np.array_equal(value, vendor[name].reshape(value.shape))
        outputs.append(value)
    assert np.array_equal(outputs[0], outputs[1])
    assert np.array_equal(outputs[0], reference["output_i8"].reshape(outputs[0].shape))
    ddr = [tdma_traffic(read_cvimodel(p))["total"] for p in (grouped, single)]
    print(f"{chip}: DDR {ddr[0]} B grouped vs {ddr[1]} B; shared {g_sum['shared_gmem']} vs {s_sum['shared_gmem']}")
    assert ddr[0] < ddr[1] * 0.6
    assert g_sum["shared_gmem"] < s_sum["shared_gmem"]


@pytest.mark.parametrize("quant", ["int8", "bf16"])
@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
def test_prelu_joins_groups_bit_exactly(chip: str, quant: str, tmp_path: Path) -> None:
    """conv, PReLU, pool, conv, PReLU in one row-tiled group (layer_group=longest: the default would cut it
    where its halo rows cost more than the traffic saved): grouped == ungrouped == vendor (== int8 reference)."""
    model, table = generated_model("prelu_tall", tmp_path)
    feeds = random_feeds(float_graph(model), 5)
    calib = table if quant == "int8" else None
    outputs = []
    for layer_group in ("longest", False):
        options = {"quant_output": True, "layer_group": layer_group}
        request = BuildRequest(float_graph(model), model, tmp_path / "m.cvimodel", chip=chip, quant=quant,
                               calib_table=calib, options=options)  # fmt: skip
        data, summary = compile_cvimodel(request)
        path = tmp_path / f"{layer_group}.cvimodel"
        path.write_bytes(data)
        if layer_group:
            assert summary["layer_groups"] == 1 and summary["grouped_ops"] == 5 and summary["group_tiles"] > 1
        ((name, value),) = run_cvimodel(read_cvimodel(path), feeds).items()
        vendor = run_vendor(path, feeds)[name].reshape(value.shape)
        assert np.array_equal(value.view(np.uint8), np.ascontiguousarray(vendor).view(np.uint8))
        assert len(np.unique(value)) > 50
        outputs.append(value)
    assert np.array_equal(outputs[0].view(np.uint8), outputs[1].view(np.uint8))
    if quant == "int8":
        reference = quantized_reference(model, table, feeds)["output_i8"]
        assert np.array_equal(outputs[0], reference.reshape(outputs[0].shape))


@pytest.mark.parametrize(("chip", "quant"), [("cv183x", "int8"), ("cv183x", "bf16"), ("cv181x", "int8")])
def test_one_tile_group_streams_filters_and_moves_only_the_bound(chip: str, quant: str, tmp_path: Path) -> None:
    """ResNet18's third stage: its 3x3 filters (18 KB a lane on cv183x) cannot all stay resident, so on cv183x the
    whole stage is one tile whose convs stream their filters chunk by chunk, and the stride-2 block's 3x3 and 1x1
    convs read one slot (the 1x1 one ignores the last row): the TDMA moves the lower bound, each weight, the
    input and the output once (bf16, whose bias planes come with each chunk: plus the edge casts). cv181x
    (8 lanes: 4x the activation bytes a lane) fits two smaller groups. All bit-exact, with the ungrouped bits."""
    model, table = generated_model("resnet_deep_stage", tmp_path)
    feeds = random_feeds(float_graph(model), 5)
    grouped, g_sum = _build(model, table, chip, tmp_path / "lg.cvimodel", True, quant)
    single, _ = _build(model, table, chip, tmp_path / "nolg.cvimodel", False, quant)
    outputs = []
    for path in (grouped, single):
        ours = run_cvimodel(read_cvimodel(path), feeds)
        vendor = run_vendor(path, feeds)
        ((name, value),) = ours.items()
        assert np.array_equal(value, vendor[name].reshape(value.shape))
        outputs.append(value)
    assert np.array_equal(outputs[0], outputs[1])
    cvimodel = read_cvimodel(grouped)
    moved, bound = tdma_traffic(cvimodel)["total"], lower_bound(cvimodel)["total"]
    assert moved < tdma_traffic(read_cvimodel(single))["total"]
    if chip == "cv183x":
        assert (g_sum["layer_groups"], g_sum["grouped_ops"], g_sum["group_tiles"]) == (1, 7, 1)
        assert moved == bound or quant == "bf16"  # bf16: the fp32 <-> bf16 casts at the edges are TPU ops too
    else:
        assert g_sum["grouped_ops"] >= 5
