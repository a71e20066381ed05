"""PP-OCRv6 tiny text recogniser and the PicoDet layout detector on CV18xx, built from the real trained models,
run on the vendor simulator with the same bits as `npuc run`, compared with onnxruntime on pictures the
calibration never saw.

PP-OCRv6 rec builds because canonicalization turns its squeeze-excite ReduceMeans into global pools and folds
the BatchNormalizations that follow a Squeeze into their convs; in bf16 its GELUs are table lookups times x
and its attention-free head is two bf16 matmuls and the runtime's CPU softmax (whose expf the simulator
models bit for bit). PicoDet builds whole in both formats. PP-OCRv4 rec adds an SVTR neck: layer norms
(spelled in primitives) and attention MatMuls of two activations, both bf16 TIU kernels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from metrics import cosine

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel
from npuc.models.images import model_inputs
from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate
from npuc.passes.calibration.calitable import write_table

from .cv18xx_build_util import build, real_model_shapes
from .cv18xx_sim import run_vendor

CALIBRATION_PICTURES = 12


def _table(name: str, model: Path, folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A KL table from the first pictures of the model's set, and the next picture (held out) as the test feed."""
    feeds = model_inputs(name, CALIBRATION_PICTURES + 1)
    paths = []
    for i, feed in enumerate(feeds[:CALIBRATION_PICTURES]):
        paths.append(folder / f"{i}.npz")
        np.savez(paths[-1], **feed)
    result = calibrate(model, paths, options=CalibrationOptions(method="kl"), input_shapes=real_model_shapes(name))
    write_table(result.table, folder / "cali_table.txt")
    return folder / "cali_table.txt", feeds[-1]


def _run_both(out: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """npuc's simulator and the vendor's on the same file: equal bits, returned once."""
    ours = run_cvimodel(read_cvimodel(out), feed)
    theirs = run_vendor(out, feed)
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        got = np.asarray(ours[name]).reshape(value.shape)
        assert np.array_equal(got.view(np.uint8), value.view(np.uint8)), name
    return theirs


@pytest.fixture(scope="module")
def recogniser(real_model, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    model = real_model("ppocrv6_rec_tiny")
    table, feed = _table("ppocrv6_rec_tiny", model, tmp_path_factory.mktemp("ppocr"))
    return model, table, feed


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
def test_ppocrv6_rec_int8_bit_exact(recogniser, tmp_path: Path, chip: str) -> None:
    model, table, feed = recogniser
    out = build(model, table, chip, "int8", tmp_path / "rec.cvimodel", real_model_shapes("ppocrv6_rec_tiny"))
    got = _run_both(out, feed)["fetch_name_0"]
    want = ort.InferenceSession(str(model)).run(None, feed)[0]
    # A plain KL table (no per-tensor choice, no bf16 layers): measured on the held-out text line cosine
    # 0.93-0.95, per-position argmax agreement 0.75-0.92 over four lines; the default is the next test's.
    assert cosine(got.reshape(want.shape), want) >= 0.9
    assert (got.reshape(want.shape).argmax(-1) == want.argmax(-1)).mean() >= 0.7


REC_LINES = 24


def test_ppocrv6_rec_int8_default_on_unseen_text_lines(real_model, tmp_path: Path) -> None:
    """Issue 16's int8 cosine >= 0.98 for the text recogniser: `npuc calibrate` with no option on 24 text lines,
    `npuc build` for cv183x int8 (the table's qtable applied), the vendor simulator on 24 other lines."""
    import npuc

    name = "ppocrv6_rec_tiny"
    model, shapes = real_model(name), real_model_shapes(name)
    feeds = model_inputs(name, 2 * REC_LINES)
    (tmp_path / "data").mkdir()
    for i, feed in enumerate(feeds[:REC_LINES]):
        np.savez(tmp_path / "data" / f"{i:02d}.npz", **feed)
    npuc.calibrate(model, [tmp_path / "data"], tmp_path / "table.txt", input_shapes=shapes)
    out = tmp_path / "rec.cvimodel"
    npuc.build(model, "cv18xx", out, chip="cv183x", calib=tmp_path / "table.txt", input_shapes=shapes)
    session = ort.InferenceSession(str(model))
    _run_both(out, feeds[REC_LINES])
    cosines, agreements = [], []
    for feed in feeds[REC_LINES:]:
        want, got = session.run(None, feed)[0], run_vendor(out, feed)["fetch_name_0"]
        got = got.reshape(want.shape)
        cosines.append(cosine(got, want))
        agreements.append((got.argmax(-1) == want.argmax(-1)).mean())
    # measured on an AVX-512 machine: 0.9816 mean (its 4 pools in bf16, the greedy's picks dropped on the wider
    # samples: passes/calibration/compare.py), 0.9763 before with 8 greedy picks; on AVX2 0.9816 / 0.9337 before
    # (onnxruntime's and OpenBLAS's kernels round differently, and the calibration's fit follows them), not
    # measured since. What held on both before:
    assert np.mean(cosines) >= 0.97 and min(cosines) >= 0.90, cosines
    assert np.mean(agreements) >= 0.9


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
def test_ppocrv6_rec_bf16_bit_exact_and_accurate(recogniser, tmp_path: Path, chip: str) -> None:
    model, _, feed = recogniser
    out = build(model, None, chip, "bf16", tmp_path / "rec.cvimodel", real_model_shapes("ppocrv6_rec_tiny"))
    got = _run_both(out, feed)["fetch_name_0"]
    want = ort.InferenceSession(str(model)).run(None, feed)[0]
    assert cosine(got.reshape(want.shape), want) >= 0.999  # measured 0.9998-1.0 on four text lines
    assert (got.reshape(want.shape).argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
def test_ppocrv6_det_bf16_bit_exact(real_model, tmp_path: Path, chip: str) -> None:
    """The text detector's squeeze-excite global pools average 48x96 windows: the bf16 sum of x * 1/4608, in
    the TIU's order and rounding, is what makes it bit-exact."""
    model = real_model("ppocrv6_det_tiny")
    page, photo = (model_inputs("ppocrv6_det_tiny", 33)[i] for i in (0, 32))  # a document; a mirrored photo
    out = build(model, None, chip, "bf16", tmp_path / "det.cvimodel", real_model_shapes("ppocrv6_det_tiny"))
    session = ort.InferenceSession(str(model))
    for feed, floor in ((page, 0.999), (photo, 0.995)):
        got = _run_both(out, feed)["fetch_name_0"]
        want = session.run(None, feed)[0]
        # measured: the page 0.99992 (documents 0.9992-0.9999); photos with little text 0.9960-0.9976, where
        # the probability map is almost all near 0 and bf16's error on it weighs more
        assert cosine(got.reshape(want.shape), want) >= floor


@pytest.fixture(scope="module")
def text_detector_default(real_model, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """`npuc calibrate` with no option on the detector's ten text pictures, then `npuc build` for cv183x int8
    (the table's qtable applied), and the pictures after them: 8 photos, then the ten text pictures mirrored."""
    import npuc

    name = "ppocrv6_det_tiny"
    model, folder, shapes = real_model(name), tmp_path_factory.mktemp("det_default"), real_model_shapes(name)
    feeds = model_inputs(name, 28)
    (folder / "data").mkdir()
    for i, feed in enumerate(feeds[:10]):
        np.savez(folder / "data" / f"{i:02d}.npz", **feed)
    npuc.calibrate(model, [folder / "data"], folder / "table.txt", input_shapes=shapes)
    out = folder / "det.cvimodel"
    npuc.build(model, "cv18xx", out, chip="cv183x", calib=folder / "table.txt", input_shapes=shapes)
    return model, out, feeds[10:18], feeds[18:]


def test_ppocrv6_det_int8_default_on_mirrored_text_pictures(text_detector_default) -> None:
    """Issue 16's int8 cosine >= 0.98 on the pictures a text detector is for: the default build, on the vendor
    simulator, on the mirror images of its ten calibration pictures (the only real text at hand is two scans;
    a calibration on one scan judged on the other: bench/vs_tpumlir.py). On a photo without text the float map
    is ~0 everywhere and the cosine measures noise (0.42 - 0.81 on 6 of these photos, max |error| <= 0.06):
    there the check is that int8 finds no text the float model does not."""
    model, out, photos, text = text_detector_default
    session = ort.InferenceSession(str(model))
    _run_both(out, text[1])
    cosines = []
    for feed in text:
        want, got = session.run(None, feed)[0], run_vendor(out, feed)["fetch_name_0"]
        got = got.reshape(want.shape)
        cosines.append(cosine(got, want))
        found, wanted = got > 0.3, want > 0.3  # DB post-processing's binarisation threshold
        # measured 0.870 - 0.977 (0.894 - 0.979 with 2048 histogram bins over the absmax: the power-of-two bins
        # of passes/calibration/histogram.py move the calibration's choices a little, here down, PP-LCNet's up)
        assert (found & wanted).sum() / (found | wanted).sum() >= 0.86
    assert np.mean(cosines) >= 0.98 and min(cosines) >= 0.965  # measured 0.9857 / 0.9688 (before 0.9896 / 0.9739)
    for feed in photos:
        want, got = session.run(None, feed)[0], run_vendor(out, feed)["fetch_name_0"]
        if want.max() < 0.3:  # no text in float
            assert np.abs(got.reshape(want.shape) - want).max() < 0.1  # measured <= 0.059


@pytest.fixture(scope="module")
def layout(real_model, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    model = real_model("picodet_layout")
    table, feed = _table("picodet_layout", model, tmp_path_factory.mktemp("picodet"))
    return model, table, feed


@pytest.mark.parametrize("chip", ["cv181x", "cv183x"])
def test_picodet_bf16_bit_exact_and_accurate(layout, tmp_path: Path, chip: str) -> None:
    model, _, feed = layout
    out = build(model, None, chip, "bf16", tmp_path / "layout.cvimodel", real_model_shapes("picodet_layout"))
    got = _run_both(out, feed)
    session = ort.InferenceSession(str(model))
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True))
    for name, value in want.items():  # 4 class-score and 4 box heads; measured 0.9993 .. 0.99999
        assert cosine(got[name].reshape(value.shape), value) >= 0.999, name


@pytest.mark.parametrize("chip", ["cv181x", "cv183x"])
def test_picodet_int8_bit_exact(layout, tmp_path: Path, chip: str) -> None:
    """Bits only: with this plain KL table the class-score heads (sigmoid outputs mostly near 0) measure cosine
    0.3-0.6, the box heads 0.87-0.98; the default calibration keeps the score sigmoids in bf16 (worst output
    0.81 on held-out documents, passes/calibration/float_patterns.py)."""
    model, table, feed = layout
    out = build(model, table, chip, "int8", tmp_path / "layout.cvimodel", real_model_shapes("picodet_layout"))
    _run_both(out, feed)


@pytest.fixture(scope="module")
def svtr_recogniser(real_model, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    model = real_model("ppocrv4_rec")
    table, feed = _table("ppocrv4_rec", model, tmp_path_factory.mktemp("ppocrv4"))
    return model, table, feed


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_ppocrv4_rec_bit_exact(svtr_recogniser, tmp_path: Path, quant: str) -> None:
    """PP-OCRv4's SVTR neck: LayerNorm spelled in primitives (one layer_norm op after canonicalization, a TIU
    kernel), attention as MatMuls of two activations and the runtime's CPU softmax; int8 builds keep those
    in bf16 (their int8 rules do not apply) and say so."""
    model, table, feed = svtr_recogniser
    out = build(model, table if quant == "int8" else None, "cv181x", quant, tmp_path / "rec.cvimodel",
                real_model_shapes("ppocrv4_rec"))  # fmt: skip
    got = _run_both(out, feed)["softmax_11.tmp_0"]
    want = ort.InferenceSession(str(model)).run(None, feed)[0]
    got = got.reshape(want.shape)
    agreement, cos = (got.argmax(-1) == want.argmax(-1)).mean(), cosine(got, want)
    if quant == "bf16":  # measured on the held-out line: cosine 0.99976, 39 of 40 positions agree
        assert cos >= 0.999 and agreement >= 0.95
    else:  # measured: cosine 0.711, agreement 0.70 with this 12-picture KL table (issue 18); held, not a goal
        assert cos >= 0.65 and agreement >= 0.6


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_crnn_with_a_bidirectional_lstm_bit_exact(real_model, tmp_path: Path, quant: str) -> None:
    """ddddocr's CRNN: its bidirectional LSTM (20 steps, hidden 512) is unrolled into matrix products,
    sigmoid/tanh tables and elementwise ops (passes/rewrite/recurrent_unroll.py), in bf16 also in an int8 build (as
    tpu-mlir runs LSTMs on these chips), with the same bits as the vendor simulator."""
    model = real_model("ddddocr_crnn")
    feeds = model_inputs("ddddocr_crnn", 6)
    table = None
    if quant == "int8":
        paths = []
        for i, feed in enumerate(feeds[1:]):
            paths.append(tmp_path / f"{i}.npz")
            np.savez(paths[-1], **feed)
        result = calibrate(model, paths, options=CalibrationOptions(method="kl"),
                           input_shapes=real_model_shapes("ddddocr_crnn"))  # fmt: skip
        table = tmp_path / "table.txt"
        write_table(result.table, table)
    out = build(model, table, "cv181x", quant, tmp_path / "crnn.cvimodel", real_model_shapes("ddddocr_crnn"))
    (name, got), = _run_both(out, feeds[0]).items()  # fmt: skip
    want = ort.InferenceSession(str(model)).run(None, feeds[0])[0]
    got = got.reshape(want.shape)
    agreement = (got.argmax(-1) == want.argmax(-1)).mean()
    if quant == "bf16":  # measured: cosine 0.99998, every position's class equal
        assert cosine(got, want) >= 0.999 and agreement == 1.0
    else:  # measured: cosine 0.985, agreement 0.75-0.8 (the CNN's int8; issue 18); held, not a goal
        assert cosine(got, want) >= 0.97 and agreement >= 0.6
