"""The int8 refinement passes: the batched scheme simulator (passes/quantization/qsim.py), the global threshold search
(passes/calibration/threshold_search.py), bias correction and weight reconstruction (passes/calibration/refine.py),
rounding-aware placement on the int8 grid (passes/calibration/gptq.py), extra calibration views
(passes/calibration/augment.py) and the refinement side file (passes/calibration/refinement.py), on small generated
models."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from npuc.compiler.errors import UserError
from npuc.compiler.interp import run
from npuc.compiler.kernels import FLOAT_KERNELS
from npuc.frontends.onnx import import_model
from npuc.models.make_models import make_model
from npuc.passes.calibration.augment import VIEWS, View, augment_feeds, resample, tone
from npuc.passes.calibration.calibrate import max_abs_thresholds
from npuc.passes.calibration.gptq import quadratic_cost, round_refit
from npuc.passes.calibration.refine import linear, reconstruct, refine_weights
from npuc.passes.calibration.refinement import (
    Refinement,
    apply_refinement,
    encode_refinement,
    load_refinement,
    save_refinement,
)
from npuc.passes.calibration.threshold_search import candidate_thresholds, search_thresholds
from npuc.passes.quantization.qsim import (
    Simulator,
    activation_peaks,
    fake_quant,
    output_cosines,
    stack_feeds,
    weight_grid,
)
from npuc.passes.rewrite.canonicalize import canonicalize


def _graph(name: str):  # noqa: ANN202
    graph = import_model(make_model(name))
    canonicalize(graph)
    return graph


def _feeds(graph, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:  # noqa: ANN001
    rng = np.random.default_rng(seed)
    name = graph.inputs[0]
    return [{name: rng.standard_normal(graph.shape(name)).astype(np.float32)} for _ in range(count)]


def test_fake_quant_grid() -> None:
    x = np.array([-2.0, -1.0, -0.003, 0.004, 0.5, 1.0, 3.0], np.float32)
    got = fake_quant(x, 1.0)
    np.testing.assert_array_equal(np.rint(got * 127), [-128, -127, 0, 1, 64, 127, 127])
    per_channel = fake_quant(np.ones((1, 2, 1, 1), np.float32), np.array([2.0, 4.0]).reshape(1, 2, 1, 1))
    np.testing.assert_allclose(per_channel.ravel(), [64 * 2 / 127, 32 * 4 / 127], rtol=1e-6)


def test_depthwise_matches_float_kernel() -> None:
    graph = _graph("conv_depthwise")
    op = next(op for op in graph.ops if op.kind == "conv2d")
    x = _feeds(graph, 3)[0][graph.inputs[0]].repeat(3, axis=0)
    w = graph.const(op.inputs[1])
    want = FLOAT_KERNELS["conv2d"](op, [x, w, graph.const(op.inputs[2])])[0]
    got = linear(op, x, w, graph.const(op.inputs[2]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.shape == (3, 8, 16, 16)


def test_simulator_float_mode_is_the_float_interpreter() -> None:
    graph = _graph("tinycnn")
    feeds = _feeds(graph, 4)
    want = np.concatenate([run(graph, f)[graph.outputs[0]] for f in feeds])
    got = Simulator(graph, {}).outputs(stack_feeds(feeds), quantized=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # quantized: every activation on its grid, so the output is a multiple of its threshold / 127
    thresholds = max_abs_thresholds(graph, feeds)
    q = Simulator(graph, thresholds).outputs(stack_feeds(feeds))
    codes = q / np.float32(thresholds[graph.outputs[0]] / 127)
    np.testing.assert_allclose(codes, np.rint(codes), atol=1e-3)
    assert 0.99 < output_cosines(want, q).min() < 1.0


@pytest.mark.parametrize("model", ["conv_depthwise", "conv_basic", "matmul_dense"])
def test_reconstruct_recovers_a_linear_map(model: str) -> None:
    """With exact float data and no ridge, least squares returns the layer's own weights and bias."""
    graph = _graph(model)
    op = next(op for op in graph.ops if op.kind in ("conv2d", "matmul", "gemm"))
    x = np.concatenate([run(graph, f, keep_all=True)[op.inputs[0]] for f in _feeds(graph, 300)])
    w = graph.const(op.inputs[1])
    b = graph.const(op.inputs[2]) if len(op.inputs) > 2 else np.zeros(w.shape[-1], np.float32)
    y = linear(op, x, w, b)
    new_w, new_b = reconstruct(op, x, y, w * 0.5, b * 0 + 1.0, ridge=0.0)
    np.testing.assert_allclose(new_w, w, atol=2e-3)
    np.testing.assert_allclose(new_b, b, atol=2e-3)


def test_bias_correction_zeroes_the_mean_error() -> None:
    graph = _graph("conv_basic")
    feeds = _feeds(graph, 8)
    thresholds = {n: t * 0.5 for n, t in max_abs_thresholds(graph, feeds).items()}  # clipping: a biased error
    result = refine_weights(graph, thresholds, feeds, "bias")
    op = graph.ops[0]
    assert set(result.constants) == {op.inputs[2]}
    refined = result.apply(graph)
    batch = stack_feeds(feeds)
    x_q = fake_quant(batch[graph.inputs[0]], thresholds[graph.inputs[0]])
    sim = Simulator(refined, thresholds)
    w_q = sim.constant(refined.ops[0], 1, True)
    want = linear(op, batch[graph.inputs[0]], graph.const(op.inputs[1]), graph.const(op.inputs[2]))
    err = linear(op, x_q, w_q, refined.const(op.inputs[2])) - want
    np.testing.assert_allclose(err.mean(axis=(0, 2, 3)), 0.0, atol=1e-4)
    assert result.layers == [op.name]


@pytest.mark.parametrize("method", ["bias", "weights"])
def test_refinement_improves_the_calibration_output(method: str) -> None:
    graph = _graph("tinycnn")
    feeds = _feeds(graph, 8)
    # a coarse grid (4x the range: 1/4 of the codes used) and no clipping: the error is rounding alone
    thresholds = {n: t * 4 for n, t in max_abs_thresholds(graph, feeds).items()}
    before = copy.deepcopy(graph)
    result = refine_weights(graph, thresholds, feeds, method)
    assert result.cosine_after > result.cosine_before  # measured 1 - cosine: 2.39e-4 -> 2.03e-4 / 2.33e-4
    assert len(result.layers) == 3  # two convs and the FC
    for name, tensor in before.tensors.items():  # the input graph is left as it was
        if tensor.is_const:
            np.testing.assert_array_equal(graph.tensors[name].data, tensor.data)
    with pytest.raises(UserError, match="not one of"):
        refine_weights(graph, thresholds, feeds, "magic")


def test_threshold_search_only_raises_towards_absmax_and_never_loses() -> None:
    np.testing.assert_allclose(candidate_thresholds(1.0, 16.0, 5), [1, 2, 4, 8, 16])
    np.testing.assert_allclose(candidate_thresholds(1.0, 1.01, 5), [1.0])
    graph = _graph("tinycnn")
    feeds = _feeds(graph, 6)
    peaks = activation_peaks(graph, stack_feeds(feeds))
    thresholds = {n: t * 0.3 for n, t in peaks.items()}
    result = search_thresholds(graph, thresholds, feeds, candidates=3)
    assert result.cosine_after >= result.cosine_before
    assert result.changed
    for name, th in result.thresholds.items():
        assert thresholds[name] <= th <= peaks[name] * 1.0001
    assert result.thresholds[graph.inputs[0]] == thresholds[graph.inputs[0]]


def test_refinement_file_round_trip_and_checks(tmp_path) -> None:  # noqa: ANN001
    graph = _graph("conv_1x1_nobias")
    feeds = _feeds(graph, 4)
    result = refine_weights(graph, max_abs_thresholds(graph, feeds), feeds, "weights")
    op = graph.ops[0]
    assert sorted(result.constants) == sorted([op.inputs[1], f"{op.name}_refined_bias"])
    data = encode_refinement(Refinement(result.constants))
    assert data == encode_refinement(Refinement(dict(reversed(list(result.constants.items())))))  # deterministic
    path = tmp_path / "model.cali.refine.npz"
    save_refinement(path, Refinement(result.constants))
    assert path.read_bytes() == data
    loaded = load_refinement(path)
    assert loaded.groupings == {}
    refined = apply_refinement(graph, loaded)
    assert refined.ops[0].inputs[2] == f"{op.name}_refined_bias"
    np.testing.assert_array_equal(refined.const(op.inputs[1]), result.constants[op.inputs[1]])
    with pytest.raises(UserError, match="another model"):
        apply_refinement(_graph("conv_basic"), loaded)
    with pytest.raises(UserError, match="another model"):  # a bias of the wrong length
        bad_bias = {**loaded.constants, f"{op.name}_refined_bias": np.zeros(3, np.float32)}
        apply_refinement(graph, Refinement(bad_bias))
    (tmp_path / "bad.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="not a readable refinement file"):
        load_refinement(tmp_path / "bad.npz")
    with pytest.raises(UserError, match="not found"):
        load_refinement(tmp_path / "missing.npz")


def test_calibrate_refine_option(tmp_path) -> None:  # noqa: ANN001
    """`calibrate(..., CalibrationOptions(refine="weights"))`: the table as without it, plus the refinement of
    the canonicalized model, which the side file carries to a build."""
    from npuc.models.make_models import make_all
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate

    model = make_all(tmp_path, ["tinycnn"])["tinycnn"]
    graph = _graph("tinycnn")
    samples = tmp_path / "samples"
    samples.mkdir()
    for i, feed in enumerate(_feeds(graph, 6)):
        np.savez(samples / f"{i:02d}.npz", **feed)
    plain = calibrate(model, [samples])
    result = calibrate(model, [samples], options=CalibrationOptions(refine="weights", refine_samples=4))
    assert plain.refinement is None and result.table.entries == plain.table.entries
    assert result.refinement.layers == ["conv_3", "conv_13", "gemm_20"]
    assert sorted(result.refinement.constants) == sorted(
        ["conv_3_weight_bn", "conv_3_bias_bn", "w_11", "b_12", "fc_w_18", "fc_b_19"]
    )
    refined = apply_refinement(graph, Refinement(result.refinement.constants))
    assert not np.array_equal(refined.const("w_11"), graph.const("w_11"))
    with pytest.raises(UserError, match="--refine 'adaround' is not one of"):
        CalibrationOptions(refine="adaround")


def test_cli_refine_writes_a_side_file_that_build_applies(tmp_path) -> None:  # noqa: ANN001
    """`npuc calibrate --refine weights -o T` writes T and T.refine.npz; `npuc build --calib T` builds the
    refined constants (other int8 weights than the plain table gives), and without -o --refine exits 2."""
    from npuc.cli.app import main as cli_main
    from npuc.models.make_models import make_all
    from npuc.passes.calibration.refinement import side_file

    def main(argv: list[str]) -> int:
        try:
            cli_main(argv)
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0

    model = make_all(tmp_path, ["tinycnn"])["tinycnn"]
    samples = tmp_path / "samples"
    samples.mkdir()
    for i, feed in enumerate(_feeds(_graph("tinycnn"), 6)):
        np.savez(samples / f"{i:02d}.npz", **feed)
    plain, refined = tmp_path / "plain.txt", tmp_path / "refined.txt"
    assert main(["calibrate", str(model), "--data", str(samples), "-o", str(plain), "--method", "kl"]) == 0
    assert main(["calibrate", str(model), "--data", str(samples), "-o", str(refined), "--refine", "weights"]) == 0
    assert not side_file(plain).exists() and side_file(refined).is_file()
    assert plain.read_bytes() == refined.read_bytes()  # the table itself does not change
    built = {}
    for table in (plain, refined):
        out = tmp_path / f"{table.stem}.cvimodel"
        assert main(["build", str(model), "--target", "cv18xx", "--calib", str(table), "-o", str(out)]) == 0
        built[table.stem] = out.read_bytes()
    assert built["plain"] != built["refined"]
    assert (
        main(
            [
                "calibrate",
                str(model),
                "--data",
                str(samples),
                "--refine",
                "weights",
                "--save-stats",
                str(tmp_path / "s"),
            ]
        )
        == 2
    )


def _correlated_system(seed: int, systems: int, n: int, outputs: int):  # noqa: ANN202
    """H = AᵀA + ridge of correlated inputs plus a ones column, and a target θ* (systems, n, outputs)."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((systems, n - 1, n - 1))
    a = rng.standard_normal((systems, 500, n - 1)) @ mix
    a = np.concatenate([a, np.ones((systems, 500, 1))], axis=2)
    h = np.swapaxes(a, 1, 2) @ a
    h += 0.1 * np.trace(h, axis1=1, axis2=2)[:, None, None] / n * np.eye(n)
    return h, rng.standard_normal((systems, n, outputs))


@pytest.mark.parametrize(("per_tensor", "shape"), [(False, (1, 33, 16)), (True, (1, 33, 4)), (False, (20, 10, 1))])
def test_gptq_places_weights_on_the_grid_quantize_derives(per_tensor: bool, shape: tuple[int, int, int]) -> None:
    h, theta = _correlated_system(1, *shape)
    placed = round_refit(h, theta, per_tensor)
    w = placed[:, :-1]
    axes = (1, 2) if per_tensor else 1
    peak = np.abs(w).max(axis=axes, keepdims=True)
    codes = w / peak * 127  # what weight_grid / cv18xx_quantize_conv compute from the saved float weights
    np.testing.assert_allclose(codes, np.rint(codes), atol=1e-9)
    # rounding to nearest at the refit's own scale, bias left as refitted: the baseline it must beat
    nearest = theta.copy()
    ref_peak = np.abs(theta[:, :-1]).max(axis=axes, keepdims=True)
    nearest[:, :-1] = np.rint(theta[:, :-1] / ref_peak * 127) * ref_peak / 127
    cost, baseline = quadratic_cost(h, placed, theta).sum(), quadratic_cost(h, nearest, theta).sum()
    assert cost < 0.7 * baseline


@pytest.mark.parametrize("method", ["gptq", "gptq+views"])
def test_gptq_refinement_keeps_its_grid_through_quantize(method: str) -> None:
    """The rounding-aware refit's weights are already int8 codes at the scale quantize derives from them."""
    graph = _graph("tinycnn")
    feeds = _feeds(graph, 8)
    thresholds = {n: t * 4 for n, t in max_abs_thresholds(graph, feeds).items()}
    result = refine_weights(graph, thresholds, feeds, method)
    assert len(result.layers) == 3
    refined = result.apply(graph)
    weights = [op for op in refined.ops if op.name in result.layers]
    for op in weights:
        w = refined.const(op.inputs[1])
        np.testing.assert_allclose(weight_grid(op.kind, w), w, rtol=0, atol=1e-6 * np.abs(w).max())
        assert not np.array_equal(w, graph.const(op.inputs[1]))
    # measured 1 - cosine on the calibration samples: 2.39e-4 before, 2.57e-4 (gptq) after: no better here
    assert abs(result.cosine_after - result.cosine_before) < 1e-4


def test_views_resample_and_tone() -> None:
    x = np.arange(2 * 1 * 8 * 8, dtype=np.float32).reshape(2, 1, 8, 8)
    np.testing.assert_allclose(resample(x, View(0.0, 0.0, 1.0)), x, atol=1e-5)  # the whole picture: itself
    half = resample(x, View(0.0, 0.0, 0.5))[0, 0]  # the top-left quarter, twice as large
    np.testing.assert_allclose(half[1, :4], [2.0, 2.25, 2.75, 3.25], atol=1e-5)  # rows 0.25, cols 0..1.25
    toned = tone(x, View(0, 0, 1, contrast=0.5, brightness=1.0))
    np.testing.assert_allclose(toned.mean(axis=(2, 3)), x.mean(axis=(2, 3)) + x.std(axis=(2, 3)), rtol=1e-5)
    np.testing.assert_allclose(toned.std(axis=(2, 3)), 0.5 * x.std(axis=(2, 3)), rtol=1e-5)
    feeds = augment_feeds([{"x": x[:1], "n": np.array([3])}])
    assert len(feeds) == 1 + len(VIEWS)
    assert all(f["n"].tolist() == [3] and f["x"].shape == (1, 1, 8, 8) for f in feeds)


def test_refine_and_split_on_a_model_fed_nhwc(real_model, tmp_path) -> None:
    """MTCNN O-Net takes NHWC pictures (its input transpose is absorbed): the batched refinement and channel
    split runs see the samples in the graph's NCHW layout, as single runs do, and its PReLU runs split."""
    from npuc.models.images import model_inputs
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate

    model = real_model("mtcnn_onet")
    paths = []
    for i, feed in enumerate(model_inputs("mtcnn_onet", 6)):
        paths.append(tmp_path / f"{i}.npz")
        np.savez(paths[-1], **feed)
    refined = calibrate(model, paths, options=CalibrationOptions(refine="weights", refine_samples=6))
    assert refined.refinement is not None and refined.refinement.constants
    split = calibrate(model, paths, options=CalibrationOptions(split_channels=3, refine_samples=6))
    # the three conv -> PReLU -> max pool -> conv runs split; the tensors they replace give way to their groups'
    assert sorted(split.groupings) == ["conv2d_10", "conv2d_8", "conv2d_9"]
    rows, unsplit = set(split.table.thresholds()), set(refined.table.thresholds())
    replaced = {f"convolution_output{i}_Conv" for i in (1, 2, 3)}
    replaced |= {f"p_re_lu_{i}/add:0_{kind}" for i in (7, 8, 9) for kind in ("PRelu", "pooling0_MaxPool")}
    assert unsplit - rows == replaced
    assert {f"p_re_lu_7/add:0.g{j}" for j in range(3)} <= rows
    assert unsplit - replaced <= rows  # every other tensor keeps its row


def test_refine_on_a_sequence_first_rnn_refuses_up_front_with_a_fix_that_works(real_model, tmp_path) -> None:
    """The CRNN's LSTM runs time-first: samples cannot be stacked on axis 0. --refine with its default batch is
    refused before any pass, naming --refine-samples 1, and that fix runs (one sample, the graph's own shapes)."""
    import npuc
    from npuc.compiler.errors import UserError
    from npuc.frontends.onnx import import_onnx
    from npuc.models.images import model_inputs
    from npuc.passes.calibration.refinement import load_refinement, side_file
    from npuc.passes.quantization.qsim import batch_first
    from npuc.passes.rewrite.canonicalize import canonicalize

    model, shape = real_model("ddddocr_crnn"), ["input1:1,1,64,160"]
    data = tmp_path / "data"
    data.mkdir()
    for i, feed in enumerate(model_inputs("ddddocr_crnn", 3)):
        np.savez(data / f"{i}.npz", **feed)
    graph = import_onnx(model, {"input1": [1, 1, 64, 160]}, [])
    canonicalize(graph)
    assert not batch_first(graph)
    with pytest.raises(UserError, match="add --refine-samples 1"):
        npuc.calibrate(model, [data], tmp_path / "t.txt", method="kl", refine="weights", input_shapes=shape)
    assert not (tmp_path / "t.txt").exists()
    npuc.calibrate(model, [data], tmp_path / "t.txt", method="kl", refine="weights", refine_samples=1,
                   input_shapes=shape)  # fmt: skip
    assert load_refinement(side_file(tmp_path / "t.txt")).constants


def test_batched_simulator_keeps_every_output_of_a_split_and_broadcasts_constant_parts() -> None:
    """A Split feeds both of its outputs on (YOLOv8's C2f blocks), and a concat part made of constants alone (a
    decode grid) stays one sample's worth: the batched float run equals the interpreter run per sample."""
    from npuc.models.netbuilder import NetBuilder

    b = NetBuilder("split_concat", np.random.default_rng(0))
    y = b.conv("x", 4, 8, 3)
    left, right = b.node("Split", [y, b.const("parts", np.array([3, 5], np.int64))], n_out=2, axis=1)
    grid = b.op("Add", b.const("zeros", np.zeros((1, 2, 6, 6), np.float32)),
                b.const("ones", np.ones((1, 2, 6, 6), np.float32)))  # fmt: skip
    out = b.op("Concat", b.op("Relu", right), left, grid, axis=1)
    graph = import_model(b.build({"x": (1, 4, 6, 6)}, {"out": out}))
    canonicalize(graph)
    feeds = _feeds(graph, 3)
    want = np.concatenate([run(graph, f)[graph.outputs[0]] for f in feeds])
    got = Simulator(graph, {}).outputs(stack_feeds(feeds), quantized=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
