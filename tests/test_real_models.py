"""Real trained models: import, canonicalize, and match onnxruntime on real images; the ONNX zoo topologies
import and run."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npuc.compiler import interp
from npuc.frontends.onnx import import_onnx
from npuc.models.fetch import get_model, light_zoo_models
from npuc.models.images import model_inputs
from npuc.passes.rewrite.canonicalize import canonicalize

REAL = [
    "pplcnet_orientation", "mbv3_textline_cls", "mtcnn_pnet", "mtcnn_rnet", "ppocrv6_det_tiny", "yolov8n_320",
    "ppocrv4_rec", "ddddocr_crnn", "ppocrv6_rec_tiny", "picodet_layout", "minilm_l3",
]  # fmt: skip


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want.astype(np.float64)), 1e-30))


def _ort_outputs(path, feeds) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


@pytest.mark.parametrize("name", REAL)
def test_real_model_matches_onnxruntime(name, real_model):
    path = real_model(name)
    spec = get_model(name)
    graph = import_onnx(path, spec.input_shapes)
    fired = canonicalize(graph)
    samples = model_inputs(name, 2)
    for feeds in samples:
        want = _ort_outputs(path, feeds)
        got = interp.run(graph, feeds)
        assert set(got) == set(want)
        for out, value in want.items():
            err = _rel_l2(got[out], value)
            assert err <= 1e-4, f"{name}:{out} relative L2 {err:.2e}"
    print(f"\n{name}: {len(graph.ops)} IR ops after canonicalize; rewrites {fired}")


def test_canonicalize_rewrites_fire_on_real_models(real_model):
    """The patterns the issue names are found in the models that contain them."""
    expectations = {
        "mbv3_textline_cls": ("recognize_hard_swish_product", "fold_bias_add"),  # x*Clip(x+3,0,6)/6, bias Adds
        "mtcnn_pnet": ("absorb_nhwc_input_transpose",),  # NHWC input with a Transpose
        "pplcnet_orientation": ("fold_batchnorm",),  # unfolded BatchNormalization
        "ppocrv6_det_tiny": ("recognize_gelu",),  # GELU spelled with Erf
    }
    for name, rewrites in expectations.items():
        spec = get_model(name)
        graph = import_onnx(real_model(name), spec.input_shapes)
        fired = canonicalize(graph)
        for rewrite in rewrites:
            assert fired.get(rewrite, 0) > 0, f"{name}: {rewrite} did not fire ({fired})"
        if name == "mtcnn_pnet":
            assert graph.input_layouts[spec.input_name] == "nhwc"


@pytest.mark.parametrize("path", light_zoo_models(), ids=lambda p: p.stem)
def test_light_zoo_model_imports_and_runs(path):
    """Coverage of real topologies. Their weights are dummy constants, which drive some logits to ~1e9: there
    the last ulp of float32 summation order decides a softmax, so softmax outputs are checked for shape and
    normalisation while every other output must match onnxruntime."""
    model = onnx.load(str(path))
    init = {t.name for t in model.graph.initializer}
    graph = import_onnx(path)
    canonicalize(graph)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(graph.shape(n)).astype(graph.tensors[n].dtype) for n in graph.inputs}
    got = interp.run(graph, feeds)
    ort_feeds = {vi.name: feeds[vi.name] for vi in model.graph.input if vi.name not in init and vi.name in feeds}
    want = _ort_outputs(path, ort_feeds)
    producers = graph.producers()
    for out in graph.outputs:
        assert got[out].shape == want[out].shape and np.isfinite(got[out]).all()
        if producers[out].kind == "softmax":
            np.testing.assert_allclose(got[out].sum(axis=producers[out].attrs.axis), 1.0, rtol=1e-5)
        else:
            assert _rel_l2(got[out], want[out]) <= 1e-4, f"{path.stem}:{out}"
