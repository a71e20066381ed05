"""Channel-group splitting (passes/calibration/channel_split.py): run detection, float equivalence, int8 execution."""

from __future__ import annotations

import numpy as np
import pytest

from npuc.compiler.errors import UserError
from npuc.compiler.interp import run
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.frontends.onnx import import_model
from npuc.models.netbuilder import NetBuilder
from npuc.passes.calibration.channel_split import (
    channel_grouping,
    channel_peaks,
    find_runs,
    group_thresholds,
    kl_thresholds,
    run_grouping,
    split_channel_groups,
    split_runs,
)
from npuc.passes.quantization.quantize import ThresholdMap, quantize
from npuc.passes.rewrite.canonicalize import canonicalize

C = 8


def _tiny_graph():  # noqa: ANN202
    """conv -> hardswish -> depthwise -> hardswish -> conv (twice), then a global pool; the first conv's
    channels scaled 1x .. 100x apart, as in PP-LCNet's stem."""
    b = NetBuilder("split", np.random.default_rng(7))
    x = "input"
    convs = []
    for cin in (3, C):
        convs.append(b.conv(x, cin, C, k=3))
        x = b.op("HardSwish", convs[-1])
        x = b.op("HardSwish", b.conv(x, C, C, k=3, group=C))
    out = b.op("GlobalAveragePool", b.conv(x, C, 4, k=1))
    graph = import_model(b.build({"input": (1, 3, 12, 12)}, {"output": out}, opset=14))
    canonicalize(graph)
    first = next(op for op in graph.ops if op.kind == "conv2d")
    w = graph.tensors[first.inputs[1]]
    w.data = w.data * np.logspace(0, 2, C, dtype=np.float32).reshape(-1, 1, 1, 1)
    return graph


def _feeds(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [{"input": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(n)]


def _geometric_peaks(graph) -> dict[str, np.ndarray]:  # noqa: ANN001
    """Peaks 1 .. 100 over the channels of every 8-channel tensor, so the grouping is known exactly."""
    return {n: np.logspace(0, 2, C) for n, t in graph.tensors.items() if len(t.shape) == 4 and t.shape[1] == C}


def test_find_runs_takes_both_chains_and_names_the_skipped_one() -> None:
    graph = _tiny_graph()
    plan = find_runs(graph)
    convs = [op.name for op in graph.ops if op.kind == "conv2d" and op.attrs.group == 1]
    assert [(r.start.name, r.consumer.name) for r in plan.runs] == [(convs[0], convs[1]), (convs[1], convs[2])]
    assert [[m.kind for m in r.members] for r in plan.runs] == [["activation", "conv2d", "activation"]] * 2
    assert len(plan.skipped) == 1 and plan.skipped[0][0] == convs[2]
    assert "global_pool" in plan.skipped[0][1]


def test_channel_grouping_cuts_geometrically() -> None:
    peaks = np.array([1.5, 100.0, 3.0, 20.0, 9.0, 50.0, 0.0, 4.0])
    # k=2: cut at sqrt(0.1 * 100) = 3.16 (the zero channel floored to 1e-3 of the largest)
    assert [g.tolist() for g in channel_grouping(peaks, 2)] == [[0, 2, 6], [1, 3, 4, 5, 7]]
    # k=3: cuts at 0.1 * 1000^(1/3) = 1 and 0.1 * 1000^(2/3) = 10
    assert [g.tolist() for g in channel_grouping(peaks, 3)] == [[6], [0, 2, 4, 7], [1, 3, 5]]
    assert [g.tolist() for g in channel_grouping(np.ones(4), 3)] == [[0, 1, 2, 3]]  # one group: nothing to split


@pytest.mark.parametrize("k", [2, 3, 4])
def test_split_keeps_float_semantics(k: int) -> None:
    graph = _tiny_graph()
    feeds = _feeds(3)
    before = [run(graph, f)["output"] for f in feeds]
    split = split_channel_groups(graph, _geometric_peaks(graph), k)
    after = [run(split, f)["output"] for f in feeds]
    for ref, got in zip(before, after, strict=True):
        assert ref.shape == got.shape == (1, 4, 1, 1)
        assert np.abs(ref - got).max() <= 1e-5 * np.abs(ref).max()
    # geometric peaks 1..100 over 8 channels: k groups of 8/k channels (k=3: 3, 3, 2)
    g = k
    counts = split.summary()
    # per run: g sliced start convs (the first) or g*g partial convs (the middle), g depthwise; last conv: g partials
    assert counts["conv2d"] == g + g + g * g + g + g
    assert counts["eltwise"] == g + 1  # the middle conv's g sums, the last conv's one
    assert counts["activation"] == 4 * g
    assert graph.summary() == {"conv2d": 5, "activation": 4, "global_pool": 1}  # the input graph is untouched


def test_split_weights_are_channel_slices() -> None:
    graph = _tiny_graph()
    split = split_channel_groups(graph, _geometric_peaks(graph), 2)
    first = next(op for op in graph.ops if op.kind == "conv2d")
    w = graph.const(first.inputs[1])
    parts = [op for op in split.ops if op.name.startswith(f"{first.name}.g")]
    assert [op.name for op in parts] == [f"{first.name}.g0.p0", f"{first.name}.g1.p0"]
    np.testing.assert_array_equal(split.const(parts[0].inputs[1]), w[:4])
    np.testing.assert_array_equal(split.const(parts[1].inputs[1]), w[4:])
    assert split.shape(parts[1].outputs[0]) == (1, 4, 12, 12)


def test_run_grouping_takes_the_least_noisy_candidate() -> None:
    graph = _tiny_graph()
    run = find_runs(graph).runs[0]
    flat = {t: np.ones(C) for t in run.tensors}
    # one tensor spread 1..100, the others flat: the flat ones offer one group (noise 8 each, but 1..100 in
    # one group costs sum((100/p)^2) ~ 1.3e4), so the spread tensor's two groups win
    peaks = {**flat, run.tensors[2]: np.logspace(0, 2, C)}
    assert [g.tolist() for g in run_grouping(run, peaks, 2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [g.tolist() for g in run_grouping(run, flat, 2)] == [list(range(C))]


def test_split_runs_names_groups_and_partials() -> None:
    graph = _tiny_graph()
    calib = _feeds(4)
    split = split_runs(graph, _geometric_peaks(graph), 2)
    plan = find_runs(graph)
    assert sorted(split.groups) == sorted(t for r in plan.runs for t in r.tensors)
    assert all(len(v) == 2 for v in split.groups.values())
    middle, last = (r.consumer.outputs[0] for r in plan.runs)
    assert sorted(split.partials) == sorted([*split.groups[middle], last])
    assert all(len(v) == 2 for v in split.partials.values())
    peaks, split_peaks = channel_peaks(graph, calib), channel_peaks(split.graph, calib)
    first = plan.runs[0].start.outputs[0]
    th = group_thresholds(split, {first: 50.0}, split_peaks)
    assert sorted(th) == split.groups[first]
    # groups of channels 0-3 and 4-7: min(50, the group's largest channel peak in the unsplit graph)
    want = [min(50.0, float(peaks[first][:4].max())), min(50.0, float(peaks[first][4:].max()))]
    np.testing.assert_allclose([th[n] for n in split.groups[first]], want, rtol=1e-5)
    assert want[0] < 50.0 < float(peaks[first][4:].max())  # one group below the threshold, one clipped to it


def test_k1_and_missing_peaks() -> None:
    graph = _tiny_graph()
    assert split_channel_groups(graph, {}, 1) is graph
    with pytest.raises(UserError, match="no channel peaks"):
        split_channel_groups(graph, {}, 2)
    run = find_runs(graph).runs[0]
    with pytest.raises(UserError, match="differ in length"):
        split_channel_groups(graph, {run.tensors[1]: np.ones(C + 1)}, 2)
    with pytest.raises(UserError, match="not finite"):
        split_channel_groups(graph, {run.tensors[1]: np.full(C, np.nan)}, 2)
    with pytest.raises(UserError, match="k >= 1"):
        split_channel_groups(graph, {}, 0)


def test_quantized_split_graph_runs_in_int8() -> None:
    graph = _tiny_graph()
    calib, feeds = _feeds(8), _feeds(4)
    peaks = channel_peaks(graph, calib)
    assert peaks["input"].shape == (3,)
    split = split_channel_groups(graph, peaks, 2)
    names = [out for op in split.ops for out in op.outputs]
    thresholds = {"input": float(max(np.abs(f["input"]).max() for f in calib)), **kl_thresholds(split, calib, names)}
    qgraph = quantize(split, ThresholdMap(thresholds), "cv18xx_int8")
    int8_ops = [op for op in qgraph.ops if op.kind in ("conv2d", "eltwise", "activation")]
    assert len(int8_ops) == sum(c for kind, c in split.summary().items() if kind != "global_pool")
    assert all(qgraph.tensors[op.outputs[0]].quant.scheme == "int8_sym" for op in int8_ops)
    for feed in feeds:
        ref = run(graph, feed)["output"].ravel()
        got = run(qgraph, feed, kernels=QUANT_KERNELS)["output"].ravel()
        assert float(ref @ got / (np.linalg.norm(ref) * np.linalg.norm(got))) > 0.99


def test_each_group_chain_is_contiguous() -> None:
    """Group 0's conv parts and members, then group 1's: a layer group (contiguous ops, one output) can take
    a chain whole."""
    graph = _tiny_graph()
    split = split_runs(graph, _geometric_peaks(graph), 2)
    run = find_runs(graph).runs[0]
    names = [op.name for op in split.graph.ops]
    chain = [n for n in names if n.split(".g")[0] in {run.start.name, *(m.name for m in run.members)}]
    first = names.index(chain[0])
    assert names[first : first + len(chain)] == chain  # nothing else inside the run
    groups = [int(n.split(".g")[1].split(".")[0]) for n in chain]
    assert groups == sorted(groups) and groups[0] == 0 and groups[-1] == 1
    assert [n for n in chain if not n.startswith(run.start.name)] == [
        f"{m.name}.g{j}" for j in (0, 1) for m in run.members
    ]


def _prelu_graph(slope_shape: tuple[int, ...]):  # noqa: ANN202
    """conv -> PReLU(slope of `slope_shape`) -> max pool -> conv, as in MTCNN; channels 1x .. 100x apart."""
    b = NetBuilder("prelu_split", np.random.default_rng(5))
    slope = np.linspace(0.05, 0.8, int(np.prod(slope_shape)), dtype=np.float32).reshape(slope_shape)
    x = b.op("PRelu", b.conv("input", 3, C, k=3), b.const("slope", slope))
    x = b.op("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2])
    graph = import_model(b.build({"input": (1, 3, 12, 12)}, {"output": b.conv(x, C, 4, k=1)}, opset=14))
    canonicalize(graph)
    first = next(op for op in graph.ops if op.kind == "conv2d")
    w = graph.tensors[first.inputs[1]]
    w.data = w.data * np.logspace(0, 2, C, dtype=np.float32).reshape(-1, 1, 1, 1)
    return graph


@pytest.mark.parametrize("slope_shape", [(C, 1, 1), (1, C, 1, 1), (1,)])
def test_prelu_joins_a_run_with_its_slopes_sliced(slope_shape: tuple[int, ...]) -> None:
    """A PReLU is per-channel (MTCNN's conv -> PReLU -> pool -> conv): it joins the run and each group's copy
    gets its channels' slopes; the split graph computes what the original does."""
    graph = _prelu_graph(slope_shape)
    plan = find_runs(graph)
    assert [[m.kind for m in r.members] for r in plan.runs] == [["prelu", "pool2d"]]
    split = split_channel_groups(graph, _geometric_peaks(graph), 2)
    prelus = [op for op in split.ops if op.kind == "prelu"]
    assert len(prelus) == 2
    (original,) = (op for op in graph.ops if op.kind == "prelu")
    slopes = np.broadcast_to(graph.const(original.inputs[1]).reshape(-1), (C,))
    np.testing.assert_array_equal(split.const(prelus[0].inputs[1]).ravel(), slopes[:4])
    np.testing.assert_array_equal(split.const(prelus[1].inputs[1]).ravel(), slopes[4:])
    assert split.const(prelus[0].inputs[1]).shape == (1, 4, 1, 1)
    for feed in _feeds(3):
        ref, got = run(graph, feed)["output"], run(split, feed)["output"]
        assert np.abs(ref - got).max() <= 1e-5 * np.abs(ref).max()


def test_prelu_with_a_slope_along_another_axis_ends_the_run() -> None:
    graph = _prelu_graph((1, 1, 1, 12))  # one slope per column: not a per-channel op
    plan = find_runs(graph)
    assert plan.runs == []
    assert "prelu" in plan.skipped[0][1]


@pytest.mark.parametrize(
    ("family", "why"),
    [("gemm", "no conv that mixes channels"), ("conv_bn_relu", "no conv starts a channel run (conv_")],
)
def test_split_channels_says_when_it_split_nothing(family: str, why: str, tmp_path) -> None:  # noqa: ANN001
    """`--split-channels K` on a model without a run to split writes the plain table and says why."""
    import onnx

    import npuc
    from npuc.frontends.onnx import import_onnx
    from npuc.models.make_models import make_model
    from npuc.passes.calibration.refinement import side_file

    model = tmp_path / f"{family}.onnx"
    onnx.save(make_model(family), model)
    graph = import_onnx(model, None, [])
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.savez(data / f"{i}.npz", **{n: rng.standard_normal(graph.shape(n)).astype(np.float32) for n in graph.inputs})
    table = tmp_path / "t.txt"
    done = npuc.calibrate(model, [data], table, method="kl", split_channels=3)
    assert table.is_file() and not side_file(table).exists()
    (note,) = [n for n in done.notes if n.startswith("--split-channels 3 split nothing")]
    assert why in note  # (tests/test_onet_refine_cli.py: no such note where runs split)


def test_a_group_dead_on_every_sample_keeps_the_tensors_threshold() -> None:
    """A group whose channels are zero on every sample (PP-OCRv6 rec's first ReLUs) takes its tensor's
    threshold, not the all-zero floor of 1e-5: with 1e-5 the convs around it requantized outside the range the
    vendor simulator and npuc's agree on (rec's vendor output cosine 0.80 against npuc's 0.98); any threshold
    keeps its zeros. Live groups keep min(tensor threshold, their peak)."""
    from npuc.compiler.ir import Graph
    from npuc.passes.calibration.channel_split import ChannelSplit, group_thresholds

    split = ChannelSplit(Graph(), groups={"relu": ["relu.g0", "relu.g1"], "other": ["other.g0"]})
    peaks = {"relu.g0": np.zeros(4, np.float32), "relu.g1": np.array([0.5, 3.0]), "other.g0": np.array([0.25])}
    made = group_thresholds(split, {"relu": 2.0, "other": 1.0}, peaks)
    assert made == {"relu.g0": 2.0, "relu.g1": 2.0, "other.g0": 0.25}
