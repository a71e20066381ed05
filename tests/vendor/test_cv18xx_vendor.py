"""The vendor CV18xx simulator (tpu-mlir 1.30.2's libcviruntime) on the golden cvimodels, and npuc's against it.

The first test run fetches the simulator (a 312 MB wheel, about 10 s on a fast link) into $NPUC_CACHE; a
failed fetch fails these tests with the reason, it never skips them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from golden import GOLDEN_ROOT

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel

from .cv18xx_sim import LIBRARIES, VendorSimError, cache_dir, run_vendor, simulator_dir

GOLDEN = GOLDEN_ROOT / "cv18xx"
STEMS = [
    "smallcnn_cv183x_int8",
    "smallcnn_cv182x_int8",
    "smallcnn_cv181x_int8",
    "smallcnn_cv180x_int8",
    "smallcnn_cv183x_bf16",
    "smallcnn_cv181x_bf16",
]
OUTPUT = "output_Gemm_f32"
# real networks built by tpu-mlir 1.30.2 (no recorded outputs: both simulators get the same seeded input)
TPU_MLIR_BUILDS = ["onet_tpumlir_cv183x_bf16", "onet_tpumlir_cv183x_int8", "pplcnet_tpumlir_cv183x_int8"]


@pytest.fixture(scope="module")
def feeds() -> dict[str, np.ndarray]:
    with np.load(GOLDEN / "smallcnn_in.npz") as d:
        return {"input": d["input"]}


@pytest.fixture(scope="module")
def golden_outputs() -> dict[str, np.ndarray]:
    with np.load(GOLDEN / "smallcnn_vendor_sim_outputs.npz") as d:
        return {k: d[k] for k in d.files}


@pytest.fixture(scope="module")
def vendor_outputs(feeds: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Each golden cvimodel run once on the vendor simulator (one child process per model)."""
    return {stem: run_vendor(GOLDEN / f"{stem}.cvimodel", feeds) for stem in STEMS}


def test_every_golden_cvimodel_is_covered(golden_outputs: dict[str, np.ndarray]) -> None:
    assert sorted(golden_outputs) == sorted(STEMS)
    assert sorted(p.stem for p in GOLDEN.glob("*.cvimodel")) == sorted(STEMS + TPU_MLIR_BUILDS)


@pytest.mark.parametrize("stem", STEMS)
def test_vendor_simulator_reproduces_golden_outputs(
    stem: str, vendor_outputs: dict[str, dict[str, np.ndarray]], golden_outputs: dict[str, np.ndarray]
) -> None:
    out = vendor_outputs[stem]
    assert list(out) == [OUTPUT]
    assert out[OUTPUT].shape == (1, 10, 1, 1) and out[OUTPUT].dtype == np.float32
    assert np.array_equal(out[OUTPUT].view(np.uint32), golden_outputs[stem].view(np.uint32))


@pytest.mark.parametrize("stem", STEMS)
def test_npuc_simulator_matches_vendor_bit_for_bit(
    stem: str, vendor_outputs: dict[str, dict[str, np.ndarray]], feeds: dict[str, np.ndarray]
) -> None:
    ours = run_cvimodel(read_cvimodel(GOLDEN / f"{stem}.cvimodel"), feeds)
    theirs = vendor_outputs[stem]
    assert list(ours) == list(theirs) == [OUTPUT]
    assert ours[OUTPUT].shape == theirs[OUTPUT].shape and ours[OUTPUT].dtype == theirs[OUTPUT].dtype
    assert np.array_equal(ours[OUTPUT].view(np.uint32), theirs[OUTPUT].view(np.uint32))


def _seeded_feeds(model) -> dict[str, np.ndarray]:
    prog = model.body.programs[0]
    shapes = {t.name: tuple(t.shape.dim[:4]) for t in prog.tensor_map}
    rng = np.random.default_rng(7)
    return {name: rng.uniform(-1.0, 1.0, size=shapes[name]).astype(np.float32) for name in prog.input_tensors}


@pytest.mark.parametrize("stem", TPU_MLIR_BUILDS)
def test_npuc_simulator_matches_vendor_on_tpu_mlir_builds(stem: str) -> None:
    path = GOLDEN / f"{stem}.cvimodel"
    model = read_cvimodel(path)
    feeds = _seeded_feeds(model)
    theirs = run_vendor(path, feeds)
    ours = run_cvimodel(model, feeds)
    assert list(ours) == list(theirs) and theirs
    for name, value in theirs.items():
        assert ours[name].shape == value.shape and ours[name].dtype == value.dtype, name
        assert np.array_equal(ours[name].view(np.uint8), value.view(np.uint8)), name


def test_bf16_and_int8_builds_differ_as_expected(vendor_outputs: dict[str, dict[str, np.ndarray]]) -> None:
    """The bf16 logits are bf16 values; the int8 ones are int8 multiples of the 3/256 output scale."""
    bf16 = vendor_outputs["smallcnn_cv183x_bf16"][OUTPUT].ravel()
    int8 = vendor_outputs["smallcnn_cv183x_int8"][OUTPUT].ravel()
    assert np.all(bf16.view(np.uint32) & 0xFFFF == 0)
    assert (int8 * 256 / 3).round().astype(int).tolist() == [78, -29, -12, 14, 46, -48, 59, 69, -122, 39]
    assert bf16.tolist()[:3] == [0.921875, -0.33984375, -0.142578125]
    assert int(np.argmax(bf16)) == int(np.argmax(int8)) == 0


def test_simulator_cache_holds_exactly_the_three_libraries(vendor_outputs: dict) -> None:
    assert sorted(p.name for p in simulator_dir().iterdir()) == sorted(Path(m).name for m in LIBRARIES)
    assert not list(cache_dir().rglob("tpu_mlir-*.whl"))


def test_crash_is_reported_with_the_model_path(tmp_path: Path, feeds: dict[str, np.ndarray]) -> None:
    bad = tmp_path / "not_a_model.cvimodel"
    bad.write_bytes(bytes(range(256)) * 16)  # the runtime asserts on the unknown chip and aborts the process
    with pytest.raises(VendorSimError, match=r"killed by signal 6 on .*not_a_model\.cvimodel"):
        run_vendor(bad, feeds)


def test_feeds_must_name_the_model_inputs(feeds: dict[str, np.ndarray]) -> None:
    with pytest.raises(VendorSimError, match=r"feeds \['image'\] do not match the model inputs \['input'\]"):
        run_vendor(GOLDEN / "smallcnn_cv183x_int8.cvimodel", {"image": feeds["input"]})
