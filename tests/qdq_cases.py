"""What the QDQ export tests share: the smallcnn and PP-LCNet graphs and tables, onnxruntime sessions, the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from onnx import TensorProto, helper

from npuc.cli.app import main
from npuc.compiler.interp import run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.frontends.onnx import import_onnx
from npuc.models.images import model_inputs
from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate
from npuc.passes.calibration.calitable import read_table
from npuc.passes.quantization.quantize import quantize
from npuc.passes.rewrite.canonicalize import canonicalize

GOLDEN = GOLDEN_ROOT / "cv18xx"


def cli(args: list[str]) -> None:
    """`npuc ARGS` in-process; success may end in SystemExit(0)."""
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code in (0, None), exc.code


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def smallcnn() -> Graph:
    graph = import_onnx(GOLDEN / "smallcnn.onnx")
    canonicalize(graph)
    return graph


@pytest.fixture(scope="module")
def smallcnn_int8(smallcnn):
    return quantize(smallcnn, read_table(GOLDEN / "smallcnn_cali_table.txt"), "cv18xx_int8")


def smallcnn_feeds() -> list[dict[str, np.ndarray]]:
    feeds = [{"input": np.load(GOLDEN / "smallcnn_in.npz")["input"]}]
    for path in sorted((GOLDEN / "smallcnn_cali_samples").glob("*.npz"))[:8]:
        with np.load(path) as data:
            feeds.append({"input": data["input"].astype(np.float32)})
    return feeds


@pytest.fixture(scope="module")
def pplcnet(real_model, tmp_path_factory):
    path = real_model("pplcnet_orientation")
    graph = import_onnx(path, {"x": (1, 3, 224, 224)})
    canonicalize(graph)
    samples = tmp_path_factory.mktemp("pplcnet_cal")
    feeds = model_inputs("pplcnet_orientation", 8)
    for i, feed in enumerate(feeds):
        np.save(samples / f"{i}.npy", feed["x"])
    table = calibrate(path, [samples], options=CalibrationOptions(method="kl")).table
    return path, graph, table, feeds


def import_and_canon(path: Path) -> Graph:
    graph = import_onnx(path)
    canonicalize(graph)
    return graph


def int8_tensor_mismatches(qgraph: Graph, model: onnx.ModelProto, feeds) -> tuple[int, dict[str, int]]:
    """How many int8 activations the exact model exposes, and per tensor the codes differing from npuc's."""
    names = [n for n, t in qgraph.tensors.items() if t.dtype == "int8" and not t.is_const]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.INT8, None) for n in names)
    sess = session(probe)
    bad: dict[str, int] = {}
    for feed in feeds:
        ref = run(qgraph, feed, kernels=QUANT_KERNELS, keep_all=True)
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
        for n in names:
            if (diff := int((ref[n] != got[n]).sum())) > 0:
                bad[n] = bad.get(n, 0) + diff
    return len(names), bad
