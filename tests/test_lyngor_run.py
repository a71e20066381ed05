"""`npuc run` on Lyngor trees: npuc's fp16 program, decoded from the files, vs onnxruntime float on real images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from metrics import cosine

from npuc.backends.lyngor.manifest import read_tree
from npuc.backends.lyngor.sim import FP16_KERNELS, load_resolution
from npuc.cli.app import main
from npuc.compiler import interp
from npuc.compiler.artifacts import ArtifactOptions, detect
from npuc.compiler.targets import BuildRequest, get_target
from npuc.frontends.onnx import import_onnx
from npuc.models.fetch import get_model
from npuc.models.images import model_inputs
from npuc.passes.rewrite.canonicalize import canonicalize

GOLDEN = GOLDEN_ROOT


def build(model: Path, out: Path, options: dict | None = None, shapes: dict | None = None) -> Path:
    graph = import_onnx(model, shapes)
    canonicalize(graph)
    result = get_target("lyngor").build(BuildRequest(graph=graph, model_path=model, output=out, options=options or {}))
    assert result.artifacts == [out]
    return out


@pytest.mark.parametrize("name", ["pplcnet_orientation", "mtcnn_pnet"])
def test_real_models_fp16_vs_onnxruntime(tmp_path: Path, real_model, name: str) -> None:
    model = real_model(name)
    spec = get_model(name)
    out = build(model, tmp_path / name, shapes={spec.input_name: spec.input_shape})
    kind = detect(out)
    assert kind.name == "lyngor"
    specs = kind.inputs(out, ArtifactOptions())
    session = ort.InferenceSession(str(model))
    out_names = [o.name for o in session.get_outputs()]
    for feeds in model_inputs(name, 3):
        assert [(s.name, s.shape, s.dtype) for s in specs] == [(k, v.shape, "float32") for k, v in feeds.items()]
        got = kind.run(out, feeds, ArtifactOptions())
        ref = dict(zip(out_names, session.run(None, feeds)))
        assert sorted(got) == sorted(ref)
        for key in ref:
            assert got[key].dtype == np.float16 and got[key].shape == ref[key].shape
            assert cosine(got[key], ref[key]) >= 0.999, (name, key)
        if name == "pplcnet_orientation":  # the predicted orientation agrees
            assert int(np.argmax(got[out_names[0]])) == int(np.argmax(ref[out_names[0]]))


def test_simulation_is_fp16_after_every_op(tmp_path: Path) -> None:
    model = GOLDEN / "cv18xx" / "smallcnn.onnx"
    out = build(model, tmp_path / "out")
    tree = read_tree(out)
    graph = load_resolution(tree, 0)  # decoded from npuc_prog.bin + npuc_weight.bin
    x = np.load(GOLDEN / "cv18xx" / "smallcnn_in.npz")["input"]
    everything = interp.run(graph, {"input": x.astype(np.float16).astype(np.float32)}, keep_all=True,
                            kernels=FP16_KERNELS)  # fmt: skip
    assert len(everything) == len(graph.ops) + 1
    for name, value in everything.items():  # every intermediate holds exact fp16 values
        assert np.array_equal(value, value.astype(np.float16).astype(np.float32)), name
    weights = [t.data for t in graph.tensors.values() if t.data is not None and t.data.dtype == np.float32]
    assert weights and all(np.array_equal(w, w.astype(np.float16).astype(np.float32)) for w in weights)


def cli(args: list[str]) -> None:
    """`npuc ARGS` in-process; success may end in SystemExit(0)."""
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code in (0, None), exc.code


def test_cli_run_and_inspect_smallcnn(tmp_path: Path, capsys) -> None:
    model = GOLDEN / "cv18xx" / "smallcnn.onnx"
    out = build(model, tmp_path / "out")
    cli(["run", str(out), "--input", str(GOLDEN / "cv18xx" / "smallcnn_in.npz"), "-o", str(tmp_path / "y.npz")])
    got = np.load(tmp_path / "y.npz")["output"]
    x = np.load(GOLDEN / "cv18xx" / "smallcnn_in.npz")["input"]
    ref = ort.InferenceSession(str(model)).run(None, {"input": x})[0]
    assert got.dtype == np.float16 and got.shape == (1, 10) and cosine(got, ref) >= 0.999
    assert int(np.argmax(got)) == int(np.argmax(ref))
    capsys.readouterr()
    cli(["inspect", str(out)])
    text = capsys.readouterr().out
    assert "build_mode abc" in text and "input                    float32  1x3x64x64" in text
    assert "apu_0:0 (output)" in text and "resolutions   1 (default res0)" in text
