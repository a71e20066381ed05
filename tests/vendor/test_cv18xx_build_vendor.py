"""npuc's own cvimodels on the vendor CV18xx simulator: every build must run there bit-exactly like `npuc run`.

smallcnn with tpu-mlir's calibration table: int8 on all four chips and bf16 on cv183x/cv181x, with and without
layer groups. The vendor
simulator's output is also compared with tpu-mlir's own cvimodel outputs and with onnxruntime float.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from metrics import cosine

from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.compiler.targets import BuildRequest
from npuc.frontends.onnx import import_onnx
from npuc.passes.rewrite.canonicalize import canonicalize

from .cv18xx_sim import run_vendor

GOLDEN = GOLDEN_ROOT / "cv18xx"
MODEL = GOLDEN / "smallcnn.onnx"
TABLE = GOLDEN / "smallcnn_cali_table.txt"
BUILDS = [(c, "int8") for c in ("cv183x", "cv182x", "cv181x", "cv180x")] + [("cv183x", "bf16"), ("cv181x", "bf16")]


BUILD_SUMMARIES: dict[Path, dict] = {}  # path -> the summary its build returned


def build_smallcnn(chip: str, quant: str, tmp: Path, **options: object) -> Path:
    graph = import_onnx(MODEL, None, [])
    canonicalize(graph)
    request = BuildRequest(graph, MODEL, tmp / "m.cvimodel", chip=chip, quant=quant,
                           calib_table=TABLE if quant == "int8" else None, options=dict(options))  # fmt: skip
    data, summary = compile_cvimodel(request)
    path = tmp / f"smallcnn_{chip}_{quant}.cvimodel"
    path.write_bytes(data)
    BUILD_SUMMARIES[path] = summary
    return path


@pytest.fixture(scope="module")
def feeds() -> dict[str, np.ndarray]:
    with np.load(GOLDEN / "smallcnn_in.npz") as d:
        return {"input": d["input"]}


@pytest.fixture(scope="module")
def tpu_mlir_outputs() -> dict[str, np.ndarray]:
    with np.load(GOLDEN / "smallcnn_vendor_sim_outputs.npz") as d:
        return {k: d[k] for k in d.files}


@pytest.mark.parametrize("layer_group", [True, False], ids=["lg", "nolg"])
@pytest.mark.parametrize("chip,quant", BUILDS)
def test_npuc_build_runs_bit_exactly_on_the_vendor_simulator(
    chip: str, quant: str, layer_group: bool, tmp_path: Path, feeds: dict[str, np.ndarray],
    tpu_mlir_outputs: dict[str, np.ndarray]
) -> None:  # fmt: skip
    path = build_smallcnn(chip, quant, tmp_path, layer_group=layer_group)
    assert (BUILD_SUMMARIES[path]["layer_groups"] > 0) == layer_group
    ours = run_cvimodel(read_cvimodel(path), feeds)["output"]
    vendor = run_vendor(path, feeds)["output"]
    assert vendor.shape == ours.shape == (1, 10, 1, 1)
    assert np.array_equal(vendor.view(np.uint32), ours.view(np.uint32))
    reference = tpu_mlir_outputs[f"smallcnn_{chip}_{quant}"]
    assert cosine(vendor, reference) >= 0.9999
    if quant == "bf16":  # same arithmetic as tpu-mlir's bf16 build: identical outputs
        assert np.array_equal(vendor, reference.reshape(vendor.shape))


def test_int8_accuracy_against_onnxruntime_is_at_least_tpu_mlirs(
    tmp_path: Path, feeds: dict[str, np.ndarray], tpu_mlir_outputs: dict[str, np.ndarray]
) -> None:
    path = build_smallcnn("cv181x", "int8", tmp_path)
    vendor = run_vendor(path, feeds)["output"]
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    (fp32,) = session.run(None, feeds)
    ours, theirs = cosine(vendor, fp32), cosine(tpu_mlir_outputs["smallcnn_cv181x_int8"], fp32)
    print(f"cosine to onnxruntime float: npuc {ours:.6f}, tpu-mlir {theirs:.6f}")
    assert theirs == pytest.approx(0.999974, abs=5e-6)
    assert ours >= theirs


def test_quantized_edges_run_bit_exactly(tmp_path: Path, feeds: dict[str, np.ndarray]) -> None:
    """--quant-input / --quant-output: int8 in, int8 out, no CPU routine; vendor == npuc."""
    path = build_smallcnn("cv183x", "int8", tmp_path, quant_input=True, quant_output=True)
    model = read_cvimodel(path)
    prog = model.body.programs[0]
    assert len(prog.routines) == 1
    dtypes = {t.name: t.dtype for t in prog.tensor_map}
    assert dtypes[prog.input_tensors[0]] == dtypes[prog.output_tensors[0]] == 6  # INT8
    q = {"input": np.clip(np.round(feeds["input"] * 26.879637), -128, 127).astype(np.int8)}
    ours = run_cvimodel(model, q)
    vendor = run_vendor(path, q)
    (name,) = ours
    assert ours[name].dtype == np.int8
    assert np.array_equal(ours[name].ravel(), vendor[name].ravel())
