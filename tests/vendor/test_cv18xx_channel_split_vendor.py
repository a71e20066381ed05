"""`npuc calibrate --split-channels K` end to end on cv18xx: the split travels in the side file, the build
replays it, and the cvimodel runs on the vendor simulator bit for bit like `npuc run` and npuc's int8 reference
of the split graph."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.cli.app import main as cli_main
from npuc.compiler.interp import run
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.models.netbuilder import NetBuilder
from npuc.passes.calibration.calitable import read_table
from npuc.passes.calibration.refinement import apply_refinement, load_refinement, side_file
from npuc.passes.quantization.quantize import quantize

from .cv18xx_build_util import float_graph
from .cv18xx_sim import run_vendor

C = 16


def _main(argv: list[str]) -> int:
    try:
        cli_main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _model(path: Path) -> Path:
    """conv -> hardswish -> depthwise -> hardswish -> conv, twice; the first conv's output channels scaled
    1x .. 100x apart (PP-LCNet's stem spans ~40x), so one threshold per tensor serves them badly."""
    b = NetBuilder("split", np.random.default_rng(7))
    x = "input"
    for cin in (3, C):
        x = b.op("HardSwish", b.conv(x, cin, C, k=3))
        x = b.op("HardSwish", b.conv(x, C, C, k=3, group=C))
    model = b.build({"input": (1, 3, 24, 24)}, {"output": b.conv(x, C, 8, k=1)}, opset=14)
    first = next(n for n in model.graph.node if n.op_type == "Conv")
    init = next(i for i in model.graph.initializer if i.name == first.input[1])
    w = numpy_helper.to_array(init) * np.logspace(0, 2, C, dtype=np.float32).reshape(-1, 1, 1, 1)
    init.CopyFrom(numpy_helper.from_array(w.astype(np.float32), init.name))
    onnx.save(model, path)
    return path


def test_split_channels_calibrate_build_run(tmp_path: Path) -> None:
    model = _model(tmp_path / "split.onnx")
    rng = np.random.default_rng(1)
    (tmp_path / "samples").mkdir()
    for i in range(8):
        np.savez(tmp_path / "samples" / f"{i}.npz", input=rng.standard_normal((1, 3, 24, 24)).astype(np.float32))
    table = tmp_path / "split.cali"
    argv = ["calibrate", str(model), "--data", str(tmp_path / "samples"), "-o", str(table)]
    assert _main([*argv, "--split-channels", "3", "--tune", "2", "--refine", "weights"]) == 0
    refinement = load_refinement(side_file(table))
    assert sorted(refinement.groupings) == ["conv_11", "conv_3"]  # both runs, each from its first conv
    assert all(len(groups) == 3 for groups in refinement.groupings.values())
    assert refinement.constants

    out = tmp_path / "split.cvimodel"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every tensor of the split graph has its row in the table
        assert _main(["build", str(model), "--target", "cv18xx", "--chip", "cv181x", "--calib", str(table),
                      "--quant-output", "-o", str(out)]) == 0  # fmt: skip

    graph = apply_refinement(float_graph(model), refinement)
    assert sum(op.kind == "conv2d" for op in graph.ops) > 6  # the split convs (6 before)
    qgraph = quantize(copy.deepcopy(graph), read_table(table), "cv18xx_int8")
    for seed in (11, 12):
        feeds = {"input": np.random.default_rng(seed).standard_normal((1, 3, 24, 24)).astype(np.float32)}
        ((name, ours),) = run_cvimodel(read_cvimodel(out), feeds).items()
        assert ours.dtype == np.int8 and len(np.unique(ours)) > 50
        assert np.array_equal(ours, run_vendor(out, feeds)[name].reshape(ours.shape))
        reference = run(qgraph, feeds, keep_all=True, kernels=QUANT_KERNELS)[name]
        assert np.array_equal(ours.ravel(), reference.ravel())

    # a side file from another model is refused with the file named, exit 2
    other = tmp_path / "other.onnx"
    b = NetBuilder("other", np.random.default_rng(2))
    onnx.save(b.build({"input": (1, 3, 24, 24)}, {"output": b.conv("input", 3, 8)}), other)
    assert _main(["build", str(other), "--target", "cv18xx", "--calib", str(table), "-o", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_onet_prelu_runs_split_and_run_bit_exactly(real_model, tmp_path: Path) -> None:  # noqa: ANN001
    """MTCNN O-Net's conv -> PReLU -> max pool -> conv runs split (each group's PReLU with its channels' slopes):
    the int8 cvimodel equals the vendor simulator and npuc's int8 reference of the split graph."""
    from npuc.models.images import face_crops, model_inputs, preprocess

    model = real_model("mtcnn_onet")
    (tmp_path / "samples").mkdir()
    for i, feed in enumerate(model_inputs("mtcnn_onet", 8)):
        np.savez(tmp_path / "samples" / f"{i}.npz", **feed)
    table = tmp_path / "onet.cali"
    assert _main(["calibrate", str(model), "--data", str(tmp_path / "samples"), "--method", "kl",
                  "--split-channels", "3", "-o", str(table)]) == 0  # fmt: skip
    refinement = load_refinement(side_file(table))
    assert sorted(refinement.groupings) == ["conv2d_10", "conv2d_8", "conv2d_9"]
    out = tmp_path / "onet.cvimodel"
    assert _main(["build", str(model), "--target", "cv18xx", "--chip", "cv183x", "--calib", str(table),
                  "--quant-output", "-o", str(out)]) == 0  # fmt: skip
    graph = apply_refinement(float_graph(model), refinement)
    assert sum(op.kind == "prelu" for op in graph.ops) > 5  # 5 before the split
    qgraph = quantize(copy.deepcopy(graph), read_table(table), "cv18xx_int8")
    cvimodel = read_cvimodel(out)
    for crop in face_crops()[16:18]:
        feeds = {"input_3": preprocess(crop, "mtcnn_onet")}
        ours, vendor = run_cvimodel(cvimodel, feeds), run_vendor(out, feeds)
        reference = run(qgraph, feeds, keep_all=True, kernels=QUANT_KERNELS)
        for name, value in ours.items():
            assert np.array_equal(value.view(np.uint8), vendor[name].reshape(value.shape).view(np.uint8)), name
            if value.dtype == np.int8:
                assert np.array_equal(value.ravel(), reference[name].ravel()), name
