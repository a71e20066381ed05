"""The TIU's conv and matmul accumulators are 32 bits and wrap: npuc's simulator and int8 reference wrap them
the same way.

A conv or fully connected layer whose input threshold is tpu-mlir's all-zero floor (1e-5, a tensor that was
zero on every calibration sample) gets an int32 bias saturated at its limit beside products that are not small
in those units; the sums plus the bias then leave int32. The vendor simulator wraps them (found on PP-OCRv6
rec's channel split, whose dead groups had that threshold: npuc's simulator kept int64 sums and differed by up
to 0.998 per output). An eltwise multiply's product of two int8 codes cannot leave int32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from accumulator_cases import saturating_bias_model, wrap_feeds

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel

from .cv18xx_build_util import build, calibrated, quantized_reference
from .cv18xx_sim import run_vendor


@pytest.fixture(scope="module", params=["conv", "gemm"])
def wrapping(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[dict[str, np.ndarray]]]:  # noqa: ANN001
    """(model, table, feeds) of tests/accumulator_cases.py's model, its ReLU's row at the all-zero threshold."""
    folder = tmp_path_factory.mktemp("accumulator")
    model, dead = saturating_bias_model(request.param)
    path = folder / "wrap.onnx"
    path.write_bytes(model.SerializeToString())
    table = calibrated(path, folder)  # then the ReLU's row as an all-zero tensor's
    rows = [line.split() for line in table.read_text().splitlines()]
    assert any(row and row[0].startswith(dead) for row in rows)
    table.write_text("".join(" ".join([row[0], "0.0000100", "-0.0000000", "0.0000000"] if row and
                                      row[0].startswith(dead) else row) + "\n" for row in rows))  # fmt: skip
    return path, table, wrap_feeds()


def test_wrapped_accumulator_runs_as_on_the_vendor_simulator(wrapping, tmp_path: Path) -> None:  # noqa: ANN001
    model, table, feeds = wrapping
    path = build(model, table, "cv183x", "int8", tmp_path / "wrap.cvimodel")
    cvimodel = read_cvimodel(path)
    wrapped = False
    for feed in feeds:
        (vendor,) = run_vendor(path, feed).values()
        (ours,) = run_cvimodel(cvimodel, feed).values()
        reference = quantized_reference(model, table, feed)
        np.testing.assert_array_equal(ours, vendor)
        np.testing.assert_array_equal(np.asarray(reference["output"]).reshape(vendor.shape), vendor)
        wrapped |= bool((np.asarray(vendor) < 0).any())  # int64 sums would saturate every output at the top
    assert wrapped
