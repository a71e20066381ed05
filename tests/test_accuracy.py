"""Int8 accuracy of the real PP-LCNet orientation classifier (cv18xx int8 scheme, npuc KL table) against fp32.

A smaller picture set than bench/accuracy.py (page() and three photos, four rotations each; calibration on
the same pictures mirrored), same code path: KL, KL + tune, where the error comes from, and the best honest
refinement the bench found (weight reconstruction, passes/calibration/refine.py), also through its side file, and the
path that reaches the issue's 0.99: `npuc calibrate --split-channels 3 --tune 5 --refine weights`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "accuracy.py"


@pytest.fixture(scope="module")
def accuracy():  # noqa: ANN201 - the bench module
    spec = importlib.util.spec_from_file_location("npuc_bench_accuracy", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(accuracy, real_model, tmp_path_factory):  # noqa: ANN001, ANN201
    model = real_model(accuracy.MODEL)
    pics = accuracy.pictures(photos=3)
    feeds, calib = accuracy.feeds_of(pics), accuracy.feeds_of(pics, mirror=True)
    table = accuracy.npuc_table(model, calib, tmp_path_factory.mktemp("calib"))
    return model, pics, feeds, calib, table, accuracy.fp32_outputs(model, feeds)


@pytest.fixture(scope="module")
def measured(accuracy, data):  # noqa: ANN001, ANN201
    model, pics, feeds, _, table, ref = data
    return pics, ref, accuracy.npuc_int8_outputs(model, table, feeds)


@pytest.fixture(scope="module")
def tuned(accuracy, real_model, tmp_path_factory):  # noqa: ANN001, ANN201
    model = real_model(accuracy.MODEL)
    pics = accuracy.pictures(photos=3)
    feeds, calib = accuracy.feeds_of(pics), accuracy.feeds_of(pics, mirror=True)
    table = accuracy.npuc_table(model, calib, tmp_path_factory.mktemp("tuned"), tune=accuracy.TUNE_SAMPLES)
    ref = accuracy.fp32_outputs(model, feeds)
    return model, table, calib, feeds, ref, accuracy.npuc_int8_outputs(model, table, feeds)


def test_picture_set(accuracy, measured):
    pics, ref, _ = measured
    assert [(n, d) for n, d, _ in pics[:4]] == [("page", 0), ("page", 90), ("page", 180), ("page", 270)]
    assert len(pics) == 16 and ref.shape == (16, 4)
    assert len(accuracy.photo_names()) >= 15  # the bench's full set: >= 15 photos x 4 rotations
    # fp32 reads the page's orientation right at every angle (class k = k*90 degrees clockwise)
    np.testing.assert_array_equal(ref[:4].argmax(axis=1), [0, 1, 2, 3])
    assert (ref[:4].max(axis=1) > 0.9).all()


def test_int8_top1_agreement_and_cosine(accuracy, measured):
    _, ref, got = measured
    result = accuracy.score("npuc int8", ref, got, 0.0)
    assert result.confident >= 8  # page x4, astronaut x4 and more are confident in fp32
    assert result.top1_agreement >= 0.98  # the goal
    # the cosine goal is a mean >= 0.99; the plain KL table measures ~0.96 on this model, tuned ~0.98
    # (see the bench, which also prints onnxruntime's own int8 alongside, and the test below for the cause).
    # Hold what is reached so it cannot regress.
    assert result.mean_cosine >= 0.95  # measured 0.9582 (16 pictures, 10 confident; 0.9509 on 2048 bins over absmax)
    assert (accuracy._cosines(ref, got)[:4] > 0.999).all()  # the confident page pictures barely move


def test_tuned_int8_and_where_the_error_comes_from(accuracy, tuned, measured):
    model, table, calib, feeds, ref, got = tuned
    assert table.tune_number == 5
    plain, result = accuracy.score("kl", ref, measured[2], 0.0), accuracy.score("kl+tune", ref, got, 0.0)
    assert result.top1_agreement >= 0.98
    assert result.mean_cosine > plain.mean_cosine  # measured 0.9582 -> 0.9831
    assert result.mean_cosine == pytest.approx(TUNED_COSINE, abs=2e-3)
    # the scheme simulated in float (per-tensor activation thresholds) loses as much as the integer
    # reference: the arithmetic is not the cause. Per-channel activation thresholds (which cv18xx int8
    # cannot express) reach the goal: the cause is channels whose range is far below their
    # tensor's threshold (the stem's hardswish.0 channels 7/12/13), which the next depthwise conv amplifies.
    per_tensor, per_channel, *_grouped = accuracy.diagnose(model, table, calib, feeds, ref)
    assert per_tensor.mean_cosine == pytest.approx(result.mean_cosine, abs=0.01)
    assert per_channel.mean_cosine >= 0.99


def test_weight_reconstruction_and_its_side_file(accuracy, data, measured, tmp_path):  # noqa: ANN001
    """Method 3 of the bench (the best honest one): conv / FC weights refitted to the quantized activations of
    the calibration pictures; same integer format, evaluated by the int8 reference interpreter."""
    from npuc.passes.calibration.refine import refine_weights
    from npuc.passes.calibration.refinement import Refinement, apply_refinement, load_refinement, save_refinement

    model, _, feeds, calib, table, ref = data
    graph, thresholds = accuracy.float_ir(model, table)
    result = refine_weights(graph, thresholds.thresholds, calib, "weights")
    assert len(result.layers) == 33  # every conv and the FC (its bias is the Add after the MatMul)
    got = accuracy.graph_int8_outputs(result.apply(graph), thresholds, feeds)
    plain, refit = accuracy.score("kl", ref, measured[2], 0.0), accuracy.score("refit", ref, got, 0.0)
    assert refit.top1_agreement >= 0.98
    # near the 0.99 here only because the 16 calibration pictures are these pictures mirrored; the
    # bench measures 0.981 on its 76 and 0.956 (KL 0.938) on photos the fit never saw (2048 bins over absmax)
    assert refit.mean_cosine >= REFIT_COSINE_FLOOR, (refit, plain)
    assert refit.mean_cosine > plain.mean_cosine + 0.015  # +0.0264 and +0.0200 on the two kernels
    # the side file a build would read gives the same integer network, bit for bit
    save_refinement(tmp_path / "pplcnet.cali.refine.npz", Refinement(result.constants))
    again = apply_refinement(graph, load_refinement(tmp_path / "pplcnet.cali.refine.npz"))
    np.testing.assert_array_equal(accuracy.graph_int8_outputs(again, thresholds, feeds), got)


# 16 pictures, 10 confident, on the power-of-two global histogram (on 2048 bins over absmax: 0.9626 and 0.9898)
TUNED_COSINE = 0.9831
# KL 0.9582 -> weight reconstruction: 0.9846 with OpenBLAS's Haswell kernels, 0.9782 with its SkylakeX (AVX-512)
# ones on the same machine (OPENBLAS_CORETYPE): the refit's float32 products round differently, and each layer's
# int8 rounding carries the difference into the next layer's fit. A floor, not a pin.
REFIT_COSINE_FLOOR = 0.975


def test_split_channels_cli_path(accuracy, data, tmp_path):  # noqa: ANN001
    """What `npuc calibrate --split-channels 3 --tune 5 --refine weights` gives, as `npuc build` quantizes it:
    the issue's 0.99 on the bench's 76 pictures (0.9907; cross-photo 0.990)."""
    model, _, feeds, calib, _, ref = data
    graph, thresholds = accuracy.calibrate_cli_path(model, calib, tmp_path)
    assert sum(op.kind == "conv2d" for op in graph.ops) > 100  # 32 before the split
    got = accuracy.score("split", ref, accuracy.graph_int8_outputs(graph, thresholds, feeds), 0.0)
    assert got.top1_agreement >= 0.98
    # the exact figure moves with the installed onnxruntime/numpy and the CPU's BLAS kernels (0.9947 and 0.9917
    # on two machines, 0.9888 on an AVX-512 one, 0.99+ there with OPENBLAS_CORETYPE=Haswell): the 0.99
    # is not held on every machine; what holds on all is this floor
    assert got.mean_cosine >= 0.985


def test_default_calibration_beats_plain_kl(accuracy, data, measured, tmp_path):  # noqa: ANN001
    """What `npuc calibrate` gives with no option (--method auto: per-tensor search, then the split / tune / refit
    candidate judged on samples it never saw; --target-cos 0.99 on the samples it sets apart) as `npuc build`
    reads it (table, side file, qtable) against the plain KL table, on the same pictures. Measured (16
    pictures): mean / worst cosine 0.9992 / 0.994 against KL's 0.9582 / 0.778, top-1 1.0 (0.9977 / 0.984 on 2048
    histogram bins over the absmax, 0.9162 / 0.673 there with onnxruntime 1.32, whose activations led the fit's
    judges to the tune step alone; 0.9952 / 0.952 when the bench's int8 outputs applied the side file's split but
    not its refitted constants; 0.9946 / 0.944 with the method chosen on 3 set-apart samples and the fit judged on
    2, 0.9697 / 0.883 before the fit was a candidate, 0.9899 / 0.951 before the choices judged the softmax's
    logits)."""
    model, _, feeds, calib, _, ref = data
    table, layers, refinement = accuracy.default_table(model, calib, tmp_path)
    assert table.method.startswith("auto (") and "refit" in table.method and refinement is not None
    got = accuracy.npuc_int8_outputs(model, table, feeds, layers, refinement)
    default, kl = accuracy.score("defaults", ref, got, 0.0), accuracy.score("kl", ref, measured[2], 0.0)
    assert default.top1_agreement >= 0.98
    assert default.mean_cosine > kl.mean_cosine + 0.03 and default.min_cosine > kl.min_cosine + 0.2
    assert default.mean_cosine >= 0.99  # the goal


def test_default_calibration_of_the_mobilenetv3_text_classifier(real_model, tmp_path) -> None:  # noqa: ANN001
    """MobileNetV3 text-line classifier, defaults only: calibrated on 16 text-line pictures, measured on 16
    others (cv18xx int8 reference with the table's qtable and side file, against onnxruntime). Its softmax
    output saturates on confident lines, so the automatic choices judge its logits (a plain output cosine
    measured 1.00000 for every method there and left the held-out report at 0.979). Measured: mean
    per-picture cosine 0.99998, worst 0.9996, top-1 1.0."""
    import npuc
    from npuc.models.images import model_inputs
    from npuc.passes.calibration.calitable import read_table
    from npuc.passes.calibration.compare import Comparison
    from npuc.passes.calibration.qtable import beside, read_qtable
    from npuc.passes.calibration.refinement import load_refinement, side_file

    model, shape = real_model("mbv3_textline_cls"), {"x": [1, 3, 48, 192]}
    feeds = model_inputs("mbv3_textline_cls", 32)
    data = tmp_path / "data"
    data.mkdir()
    for i, feed in enumerate(feeds[:16]):
        np.savez(data / f"{i:02d}.npz", **feed)
    table = tmp_path / "t.txt"
    npuc.calibrate(model, [data], table, input_shapes=shape)
    layers = list(read_qtable(beside(table))) if beside(table).is_file() else []
    refinement = load_refinement(side_file(table)) if side_file(table).is_file() else None
    report = Comparison(model, read_table(table), feeds[16:], "cv18xx_int8", shape, refinement=refinement)
    (out,) = report.evaluate(layers).outputs
    assert np.mean(out.sample_cosines) >= 0.99 and out.top1_agreement >= 0.97  # the goal
    assert min(out.sample_cosines) >= 0.99  # hold what is reached: worst 0.9996, 0.9910 on an AVX-512 machine
