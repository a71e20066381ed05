"""Channel-group splitting: per-tensor int8 thresholds that behave closer to per-channel ones.

cv18xx int8 gives every activation tensor one threshold, yet a network's channels can differ in range by
~40x inside one tensor. The graph is ours, so a tensor's channels can be split into k groups, each its own
tensor (and own threshold). A *run* is a chain of per-channel ops: it starts at a conv's output (the conv's
output channels are sliced: weights and bias), continues through element-wise activations, pools, PReLUs
and depthwise convs (each repeated per group on its slice of channels, slopes, filters), and ends at one conv
that mixes channels; that conv becomes one partial conv per input group (bias in the first) whose results an
eltwise add sums.
A conv that ends one run and starts the next is split both ways: one partial conv per (output group, input
group) pair. Float semantics are unchanged; in int8 each partial sum costs one more requantization.

Runs are left alone where the split is not clean: a tensor with more than one consumer (SE blocks), a graph
output, or a run ending anywhere but a channel-mixing conv (global pool, channel-wise multiply, concat,
reshape). `find_runs` says which were taken and why the others were skipped.

`channel_peaks` (per-channel max |x| over a float run) feeds the grouping; `kl_thresholds` calibrates the new
tensors with the same KL method as the table (passes/calibration/threshold_methods.py), from a float run of the
rewritten graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from npuc.compiler import ops
from npuc.compiler.errors import UserError
from npuc.compiler.interp import to_graph_layout
from npuc.compiler.ir import Graph, Op
from npuc.passes.calibration.histogram import DEFAULT_BINS, CalibrationStats
from npuc.passes.calibration.threshold_methods import MIN_THRESHOLD, compute_threshold
from npuc.passes.quantization.qsim import Simulator, stack_feeds

PER_CHANNEL_KINDS = frozenset({"activation", "pool2d"})  # ops that act on each channel alone, no constants
PEAK_FLOOR = 1e-3  # channel peaks below this fraction of the tensor's largest do not stretch the cuts


@dataclass
class Run:
    """One chain of per-channel ops: `start` conv, the `members` after it, the mixing `consumer` conv."""

    start: Op
    members: list[Op]
    consumer: Op
    channels: int  # of every tensor in the run

    @property
    def tensors(self) -> list[str]:
        """The split tensors: the start conv's output and each member's."""
        return [self.start.outputs[0], *(op.outputs[0] for op in self.members)]


@dataclass
class RunPlan:
    runs: list[Run] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (start conv, reason)


def _is_depthwise(graph: Graph, op: Op) -> bool:
    if op.kind != "conv2d":
        return False
    w = graph.const(op.inputs[1])
    channels = graph.shape(op.inputs[0])[1]
    return w is not None and op.attrs.group == channels == w.shape[0] and w.shape[1] == 1 and channels > 1


def _channel_slope(graph: Graph, op: Op, channels: int) -> np.ndarray | None:
    """A PReLU's constant slope as `channels` per-channel values (a single slope repeated), or None when `op` is
    no such PReLU (another kind, a slope that is not constant or varies along another axis than the channels)."""
    slope = graph.const(op.inputs[1]) if op.kind == "prelu" and len(op.inputs) == 2 else None
    rank = len(graph.shape(op.inputs[0]))
    if slope is None or slope.ndim > rank or rank < 2:
        return None
    aligned = (1,) * (rank - slope.ndim) + tuple(slope.shape)  # as numpy broadcasts it against the input
    if any(d != 1 for i, d in enumerate(aligned) if i != 1) or aligned[1] not in (1, channels):
        return None
    return np.broadcast_to(np.asarray(slope, np.float32).reshape(-1), (channels,)).copy()


def _is_mixing_conv(graph: Graph, op: Op) -> bool:
    w = graph.const(op.inputs[1]) if op.kind == "conv2d" else None
    biased = len(op.inputs) < 3 or graph.const(op.inputs[2]) is not None
    return w is not None and op.attrs.group == 1 and biased


def find_runs(graph: Graph) -> RunPlan:
    """The runs `split_channel_groups` rewrites, and the conv outputs it leaves alone with the reason."""
    users = graph.consumers()
    outputs = set(graph.outputs)
    plan = RunPlan()
    for op in graph.ops:
        if not _is_mixing_conv(graph, op):
            continue
        members: list[Op] = []
        tensor, reason = op.outputs[0], ""
        while not reason:
            readers = users.get(tensor, [])
            if tensor in outputs or len(readers) != 1:
                reason = f"'{tensor}' has {len(readers)} consumers" + (" and is a graph output" * (tensor in outputs))
            elif readers[0].inputs[0] != tensor or tensor in readers[0].inputs[1:]:
                reason = f"'{tensor}' is not the only data input of '{readers[0].name}'"
            elif (
                readers[0].kind in PER_CHANNEL_KINDS
                or _is_depthwise(graph, readers[0])
                or _channel_slope(graph, readers[0], graph.shape(tensor)[1]) is not None
            ):
                members.append(readers[0])
                tensor = readers[0].outputs[0]
            elif _is_mixing_conv(graph, readers[0]):
                plan.runs.append(Run(op, members, readers[0], graph.shape(tensor)[1]))
                break
            else:
                reason = f"'{tensor}' feeds '{readers[0].name}' ({readers[0].kind}), which is not per-channel"
        if reason:
            plan.skipped.append((op.name, reason))
    return plan


def channel_grouping(peaks: np.ndarray, k: int) -> list[np.ndarray]:
    """Channel indices of up to `k` groups: cuts geometrically spaced between the smallest and largest peak
    (the smallest floored at PEAK_FLOOR of the largest), groups in ascending peak order, empty ones dropped."""
    p = np.asarray(peaks, np.float64).ravel()
    hi = max(float(p.max()), 1e-30)
    lo = max(float(p.min()), hi * PEAK_FLOOR)
    bounds = lo * (hi / lo) ** (np.arange(1, k) / k)
    group = np.searchsorted(bounds, p)
    return [idx for g in range(k) if (idx := np.flatnonzero(group == g)).size]


def _relative_noise(peaks: np.ndarray, idx: list[np.ndarray]) -> float:
    """Sum over channels of (group threshold / channel peak)²: each channel's rounding noise relative to its
    own range when its group shares the group's largest peak (peaks floored as in `channel_grouping`)."""
    p = np.maximum(peaks, max(float(peaks.max()), 1e-30) * PEAK_FLOOR)
    return float(sum(np.sum((p[ch].max() / p[ch]) ** 2) for ch in idx))


def run_grouping(run: Run, peaks: Mapping[str, np.ndarray], k: int) -> list[np.ndarray]:
    """One grouping for all tensors of a run: of the geometric groupings of each run tensor's peaks, the one
    with the least relative rounding noise summed over the run's tensors."""
    known = [np.abs(np.asarray(peaks[t], np.float64)).ravel() for t in run.tensors if t in peaks]
    if not known:
        raise UserError(
            f"channel split: no channel peaks for the run from '{run.start.name}'; pass peaks of its tensors"
        )
    bad = [t for t in run.tensors if t in peaks and np.size(peaks[t]) != run.channels]
    if bad or not np.all(np.isfinite(np.concatenate(known))):
        raise UserError(
            f"channel split: peaks of the run from '{run.start.name}' differ in length or are not finite "
            f"({bad[:2]}); pass one finite max |x| per channel of each tensor"
        )
    candidates = [channel_grouping(p, k) for p in known]
    costs = [sum(_relative_noise(p, idx) for p in known) for idx in candidates]
    return candidates[int(np.argmin(costs))]


class _Rewriter:
    """Builds the split graph op by op; `groups[tensor]` lists the names of a split tensor's group tensors."""

    def __init__(self, graph: Graph) -> None:
        self.src = graph
        self.out = Graph(graph.name, inputs=list(graph.inputs), outputs=list(graph.outputs))
        self.out.input_layouts = dict(graph.input_layouts)
        self.out.tensors = {n: t for n, t in graph.tensors.items() if t.is_const or n in graph.inputs}
        self.groups: dict[str, list[str]] = {}
        self.partials: dict[str, list[str]] = {}

    def const(self, base: str, data: np.ndarray) -> str:
        name = self.out.unique_name(base)
        self.out.add_const(name, np.ascontiguousarray(data))
        return name

    def keep(self, op: Op) -> None:
        self.out.ops.append(op)
        for name in op.outputs:
            self.out.tensors[name] = self.src.tensors[name]

    def per_channel(self, op: Op, idx: list[np.ndarray]) -> None:
        """A member op repeated on each group (a depthwise conv on its slice of the filters)."""
        names = []
        for j, (x, ch) in enumerate(zip(self.groups[op.inputs[0]], idx, strict=True)):
            inputs, attrs = [x], op.attrs
            if op.kind == "conv2d":
                inputs += [self.const(f"{n}.g{j}", self.src.const(n)[ch]) for n in op.inputs[1:]]
                attrs = dataclasses.replace(op.attrs, group=len(ch))
            elif op.kind == "prelu":  # the group's slopes, shaped (1, C, 1, 1) like its input's channels
                slope = _channel_slope(self.src, op, self.src.shape(op.inputs[0])[1])
                shape = [1] * len(self.src.shape(op.inputs[0]))
                shape[1] = len(ch)
                inputs.append(self.const(f"{op.inputs[1]}.g{j}", slope[ch].reshape(shape)))
            names.append(self.out.unique_name(f"{op.outputs[0]}.g{j}"))
            self.out.add_op(op.kind, inputs, [names[-1]], attrs, name=f"{op.name}.g{j}")
        self.groups[op.outputs[0]] = names

    def conv(self, op: Op, out_idx: list[np.ndarray] | None, in_idx: list[np.ndarray] | None) -> None:
        """A conv sliced by output groups and/or split into partial convs over input groups summed by adds."""
        w = self.src.const(op.inputs[1])
        b = self.src.const(op.inputs[2]) if len(op.inputs) > 2 else None
        out_idx = out_idx or [np.arange(w.shape[0])]
        xs = self.groups[op.inputs[0]] if in_idx else [op.inputs[0]]
        in_idx = in_idx or [np.arange(w.shape[1])]
        act, names = ops.fused_act(op), []
        for j, oc in enumerate(out_idx):
            name = op.outputs[0] if len(out_idx) == 1 else self.out.unique_name(f"{op.outputs[0]}.g{j}")
            parts = []
            for i, (x, ic) in enumerate(zip(xs, in_idx, strict=True)):
                part = name if len(in_idx) == 1 else self.out.unique_name(f"{name}.p{i}")
                inputs = [x, self.const(f"{op.inputs[1]}.g{j}.p{i}", w[oc][:, ic])]
                if b is not None and i == 0:
                    inputs.append(self.const(f"{op.inputs[2]}.g{j}", b[oc]))
                attrs = dataclasses.replace(op.attrs, act=act if len(in_idx) == 1 else None)
                self.out.add_op("conv2d", inputs, [part], attrs, name=f"{op.name}.g{j}.p{i}")
                parts.append(part)
            if len(parts) > 1:
                self.partials[name] = parts
                self.out.add_op("eltwise", parts, [name], ops.Eltwise("add", act), name=f"{op.name}.g{j}.sum")
            names.append(name)
        if len(out_idx) > 1:
            self.groups[op.outputs[0]] = names


@dataclass
class ChannelSplit:
    """A split graph and where its new tensors come from."""

    graph: Graph
    groups: dict[str, list[str]] = field(default_factory=dict)  # original tensor -> its group tensors
    partials: dict[str, list[str]] = field(default_factory=dict)  # summed tensor -> its partial conv outputs
    groupings: dict[str, list[np.ndarray]] = field(default_factory=dict)  # what `apply_groupings` replays


Groupings = dict[str, list[np.ndarray]]  # run start conv -> channel indices of each group


def plan_groupings(graph: Graph, peaks: Mapping[str, np.ndarray], k: int) -> Groupings:
    """One grouping per run of `find_runs(graph)` (`run_grouping`), for runs that split into 2+ groups."""
    if k < 1:
        raise UserError(f"channel split: k={k} groups; use k >= 1")
    plan = find_runs(graph) if k > 1 else RunPlan()
    planned = {run.start.name: run_grouping(run, peaks, k) for run in plan.runs}
    return {name: idx for name, idx in planned.items() if len(idx) >= 2}


def apply_groupings(
    graph: Graph, groupings: Mapping[str, list[np.ndarray]], where: str = "channel split"
) -> ChannelSplit:
    """The split graph for `groupings` (as `plan_groupings` made them, e.g. read back from a side file); each
    must name a run start of `graph` and partition its channels, else a UserError (made for another model)."""
    runs = {run.start.name: run for run in find_runs(graph).runs}
    out_groups: Groupings = {}
    in_groups: Groupings = {}
    member_groups: Groupings = {}
    for name, idx in groupings.items():
        run = runs.get(name)
        every = np.sort(np.concatenate(idx)) if idx else np.zeros(0, np.int64)
        if run is None or len(idx) < 2 or not np.array_equal(every, np.arange(run.channels)):
            what = "has no channel run starting" if run is None else f"cannot split the {run.channels} channels"
            raise UserError(
                f"{where}: the model {what} at '{name}'; the split was made for another model, calibrate again"
            )
        out_groups[name] = idx
        in_groups[run.consumer.name] = idx
        member_groups.update({op.name: idx for op in run.members})
    if not out_groups:
        return ChannelSplit(graph)
    rw = _Rewriter(graph)
    for op in graph.ops:
        if op.name in member_groups:
            rw.per_channel(op, member_groups[op.name])
        elif op.name in out_groups or op.name in in_groups:
            rw.conv(op, out_groups.get(op.name), in_groups.get(op.name))
        else:
            rw.keep(op)
    rw.out.ops = _chains_together(rw.out.ops, [runs[name] for name in out_groups])
    rw.out.prune()
    rw.out.verify()
    return ChannelSplit(rw.out, rw.groups, rw.partials, dict(groupings))


def _chains_together(split_ops: list[Op], runs: list[Run]) -> list[Op]:
    """The split graph's ops with each run's group chains one after another (group 0's conv parts, then its
    members, then group 1's ...), where the run's first op stood: a layer group, which takes contiguous ops
    with one output, can then take a chain whole. Valid because every part of a run's start conv reads what
    its first part reads, and a member reads only its chain."""
    place: dict[str, tuple[int, int, int]] = {}  # op name -> (run, group, rank within the chain)
    for r, run in enumerate(runs):
        ranks = {run.start.name: 0, **{m.name: i + 1 for i, m in enumerate(run.members)}}
        for op in split_ops:
            base, _, rest = op.name.partition(".g")
            group = rest.split(".")[0]
            if base in ranks and group.isdigit():
                place[op.name] = (r, int(group), ranks[base])
    chains: dict[int, list[Op]] = {}
    for op in split_ops:
        if op.name in place:
            chains.setdefault(place[op.name][0], []).append(op)
    ordered, done = [], set()
    for op in split_ops:
        if op.name not in place:
            ordered.append(op)
        elif (r := place[op.name][0]) not in done:
            done.add(r)
            ordered += sorted(chains[r], key=lambda o: place[o.name][1:])  # stable: parts keep their order
    return ordered


def split_runs(graph: Graph, peaks: Mapping[str, np.ndarray], k: int) -> ChannelSplit:
    """`split_channel_groups` with the origin of every new tensor."""
    return apply_groupings(graph, plan_groupings(graph, peaks, k))


def split_channel_groups(graph: Graph, peaks: Mapping[str, np.ndarray], k: int) -> Graph:
    """A new graph with every run of `find_runs(graph)` split into up to `k` channel groups, one grouping
    per run (`run_grouping`) from the channel `peaks` (tensor -> per-channel max |x|) of its tensors.
    `graph` is unchanged (and returned as is when nothing splits)."""
    return split_runs(graph, peaks, k).graph


def group_thresholds(split: ChannelSplit, thresholds: Mapping[str, float], peaks: Mapping[str, np.ndarray]) -> dict:
    """Thresholds of the group tensors derived from the original tensor's: min(its threshold, the group's
    largest channel peak), as a per-channel threshold min(threshold, channel peak) coarsened to the group.
    `peaks` are channel peaks of the split graph (`channel_peaks(split.graph, ...)`).

    A group that is zero on every sample (dead channels: PP-OCRv6 rec's first ReLUs) keeps the tensor's own
    threshold: any threshold reproduces its zeros, and tpu-mlir's all-zero floor (1e-5) there made the
    requantization of the convs around it leave the range the vendor simulator and npuc's agree on."""
    found = {}
    for orig, names in split.groups.items():
        if orig not in thresholds:
            continue
        for name in names:
            peak = float(np.max(peaks[name]))
            found[name] = float(thresholds[orig]) if peak < MIN_THRESHOLD else min(float(thresholds[orig]), peak)
    return found


def channel_peaks(graph: Graph, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-channel max |x| (axis 1) of every 4-D float activation over `feeds`, from one batched float run."""
    batch = to_graph_layout(graph, stack_feeds(feeds))  # NHWC-fed inputs as the graph's NCHW tensors
    peaks = {n: np.abs(v).max(axis=(0, 2, 3)) for n, v in batch.items() if v.ndim == 4}

    def record(i: int, op: Op, raw: np.ndarray) -> np.ndarray:
        if raw.ndim == 4 and np.issubdtype(raw.dtype, np.floating):
            peaks[op.outputs[0]] = np.abs(raw).max(axis=(0, 2, 3))
        return raw

    Simulator(graph, {}).forward(batch, quantized=False, hook=record)
    return peaks


def kl_thresholds(
    graph: Graph, feeds: Sequence[Mapping[str, np.ndarray]], names: Sequence[str], bins: int = DEFAULT_BINS
) -> dict[str, float]:
    """KL thresholds of the op outputs `names` over `feeds` (range frozen from the batch's absmax, then one
    histogram: what passes/calibration/calibrate.py's passes give for these tensors)."""
    wanted, found = set(names), {}

    def record(i: int, op: Op, raw: np.ndarray) -> np.ndarray:
        name = op.outputs[0]
        if name in wanted:
            stats = CalibrationStats(bins=bins)
            stats.observe_range(name, raw)
            stats = stats.freeze()
            stats.observe_histogram(name, raw)
            found[name] = compute_threshold(stats.tensors[name], "kl")
        return raw

    Simulator(graph, {}).forward(stack_feeds(feeds), quantized=False, hook=record)
    missing = sorted(wanted - set(found))
    if missing:
        raise UserError(f"channel split: tensors {missing[:4]} are not op outputs of the graph; nothing to calibrate")
    return found


def split_thresholds(
    graph: Graph, split: ChannelSplit, thresholds: Mapping[str, float], feeds: Sequence[Mapping[str, np.ndarray]]
) -> tuple[dict[str, float], dict[str, float]]:
    """(threshold, absmax) of every tensor the split of `graph` made: group tensors from their original's
    threshold (`group_thresholds`), the partial sums and their adds by KL; absmax from a float run."""
    peaks = channel_peaks(split.graph, feeds)
    made = group_thresholds(split, thresholds, peaks)
    new = [n for op in split.graph.ops for n in op.outputs if n not in graph.tensors and n not in made]
    made.update(kl_thresholds(split.graph, feeds, new))
    return made, {n: float(np.max(peaks[n])) for n in made}
