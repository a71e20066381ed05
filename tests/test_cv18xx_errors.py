"""cv18xx build errors a user can act on: an op the chip cannot run, a layer no tiling fits. Each is one
line naming the op, exit code 2, and no artifact left behind."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
from golden import GOLDEN_ROOT
from test_cli import assert_user_error, npuc

from npuc.backends.cv18xx.codegen import no_kernel
from npuc.frontends.onnx import import_onnx
from npuc.models.netbuilder import NetBuilder
from npuc.passes.calibration.calitable import read_table
from npuc.passes.quantization.quantize import quantize
from npuc.passes.rewrite.canonicalize import canonicalize

GOLDEN = GOLDEN_ROOT / "cv18xx"


def test_an_op_without_a_kernel_names_the_node_and_the_way_out(tmp_path: Path) -> None:
    b = NetBuilder("lrn", np.random.default_rng(0))
    model = tmp_path / "lrn.onnx"
    onnx.save(b.build({"input": (1, 8, 16, 16)}, {"output": b.op("LRN", b.conv("input", 8, 8), size=3)}), model)
    out = tmp_path / "lrn.cvimodel"
    result = npuc("build", model, "--target", "cv18xx", "--quant", "bf16", "-o", out)
    line = assert_user_error(result, "op 'lrn_", "(lrn)", "no cv18xx kernel", "another target")
    assert "npuc targets" in line
    assert list(tmp_path.iterdir()) == [model]


def test_an_int8_op_without_a_kernel_is_offered_bf16() -> None:
    graph = import_onnx(GOLDEN / "smallcnn.onnx", None, [])
    canonicalize(graph)
    qgraph = quantize(copy.deepcopy(graph), read_table(GOLDEN / "smallcnn_cali_table.txt"), "cv18xx_int8")
    conv = next(op for op in qgraph.ops if op.kind == "conv2d")
    message = str(no_kernel(conv, "a test form"))
    assert message.startswith(f"op '{conv.name}' (conv2d): a test form has no cv18xx kernel")
    assert f"--float-layers {conv.name}" in message and "another target" in message


def test_a_layer_that_fits_no_tiling_says_so(tmp_path: Path) -> None:
    b = NetBuilder("wide", np.random.default_rng(0))
    model = tmp_path / "wide.onnx"
    onnx.save(b.build({"input": (1, 64, 4, 8192)}, {"output": b.conv("input", 64, 64)}), model)
    out = tmp_path / "wide.cvimodel"
    assert_user_error(npuc("build", model, "--target", "cv18xx", "--quant", "bf16", "-o", out),
                      "does not fit in the cv181x's local memory", "however it is tiled", "another target")  # fmt: skip
    assert not out.exists()
