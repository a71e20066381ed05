"""Calibration: per-tensor statistics from onnxruntime over the calibration samples, and the table they give.

Which tensors: those npuc's quantizer sees — the activations of the canonicalized IR (BatchNormalization
folded into the conv before it, Relu fused into its producer, Identity dropped), read from the ORIGINAL
ONNX model (shape-pinned) by exposing each one as an extra onnxruntime output. Canonicalization keeps float
semantics and names a fused result after its last ONNX tensor, so those values are exactly the IR's.

Names in the table follow tpu-mlir: `<onnx tensor>_<OpType>` where the tensor and op are those tpu-mlir
keeps after its own fusions — a Relu fused into a conv keeps the Relu's tensor (`relu_8_Relu`), a
BatchNormalization folded into a conv keeps the conv's (`conv_19_Conv`), an Identity in front of a graph
output gives the output's name with the real producer's type (`output_Gemm`); graph inputs keep their name.
`tensor_table_names` gives that mapping for every ONNX tensor.

Streaming statistics (passes/calibration/histogram.py) on one onnxruntime session (passes/calibration/tap.py).
Samples are loaded one batch at a time (the next batch runs while the current one is folded in); nothing per
sample is kept, except each tensor's absmax for tpu-mlir's geometry. The default `global` histogram bins every
sample over the absmax of all of them in one pass: the range pass bins a power-of-two grid that re-bins exactly
as the absmax grows, in this process or in workers whose grids merge. Given `ranges` (merged range statistics
from elsewhere) a second pass bins over them, to the same counts. `histogram="tpu-mlir"` follows tpu-mlir's
sample-by-sample geometry, which pass 1's per-sample absmax fixes for pass 2 — or, in one process, a single pass
that grows the histogram as tpu-mlir does. Sharded runs by hand: pass 1 per shard with `range_only`, merge the
ranges, pass 2 per shard with those `ranges`, merge — the table is then byte-identical to a single run's.

`CalibrationOptions.tune` > 0 adds tpu-mlir's tune step after KL (passes/calibration/tune.py) on the first N samples;
it needs the samples, so a merged table (`calibrate merge`) is never tuned. `CalibrationOptions.refine`
("bias" or "weights") then refits conv / FC constants to the table on the first `refine_samples` samples
(passes/calibration/refine.py); the result's `refinement` is what `passes.calibration.refinement.save_refinement` writes
beside the table. `CalibrationOptions.split_channels` K > 1 first splits the model's per-channel runs into up to K
channel groups, each its own int8 tensor (passes/calibration/channel_split.py): the table then describes the split
graph, and the side file records the split for the build; tune and refine follow on the split graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx

from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph
from npuc.frontends.onnx import InputShapes, import_model, pin_input_shapes
from npuc.frontends.onnx_load import load_model
from npuc.passes.calibration import shards
from npuc.passes.calibration.calitable import CalibrationTable, table_from_rows
from npuc.passes.calibration.histogram import DEFAULT_BINS, HISTOGRAMS, CalibrationStats
from npuc.passes.calibration.preprocess import Preprocess, list_samples, load_sample, model_inputs
from npuc.passes.calibration.refine import METHODS as REFINE_METHODS
from npuc.passes.calibration.refine import RefineResult
from npuc.passes.calibration.refinement import refine_for_table, split_for_table
from npuc.passes.calibration.stats_file import load_stats
from npuc.passes.calibration.tap import CalibrationPlan, TensorTap, sweep
from npuc.passes.calibration.threshold_methods import THRESHOLD_METHODS, table_rows
from npuc.passes.calibration.tune import tune_table
from npuc.passes.rewrite.canonicalize import canonicalize

PASS_THROUGH_OPS = frozenset({"Identity", "Dropout"})
# BatchNormalization tpu-mlir folds into its producer, keeping the producer's tensor name and type
BN_FOLD_PRODUCERS = frozenset({"Conv", "ConvTranspose", "Gemm"})
# method -> parameters taken from CalibrationOptions (registry, not an if-chain)
METHOD_PARAMS: Mapping[str, Callable[[CalibrationOptions], dict[str, float]]] = MappingProxyType(
    {"kl": lambda o: {}, "max": lambda o: {}, "percentile": lambda o: {"percentile": o.percentile}, "mse": lambda o: {}}
)


MAX_CHANNEL_GROUPS = 8  # --split-channels: more groups buy little (PP-LCNet: k=3 0.993, k=4 0.992 in float)


@dataclass(frozen=True)
class CalibrationOptions:
    """How to calibrate: threshold method, its parameter, batch size, histogram bins."""

    method: str = "kl"
    percentile: float = 99.99
    batch: int = 1
    bins: int = DEFAULT_BINS
    tune: int = 0  # samples for tpu-mlir's tune step after KL (its run_calibration default is 5); 0: none
    refine: str = ""  # "", "bias" or "weights": refit conv / FC constants to the table (passes/calibration/refine.py)
    refine_samples: int = 100  # samples the refinement holds in memory at once, as one batch
    split_channels: int = 0  # K > 1: split per-channel runs into up to K channel groups (channel_split.py)
    histogram: str = "global"  # the histogram geometry: "global" or tpu-mlir's sample by sample (histogram.py)

    def __post_init__(self) -> None:
        if self.method not in THRESHOLD_METHODS:
            raise UserError(f"--method {self.method!r} is not one of {', '.join(THRESHOLD_METHODS)}")
        if not 0 < self.percentile <= 100:
            raise UserError(f"--percentile {self.percentile} must be in (0, 100], e.g. 99.99")
        if not 1 <= self.batch <= 4096:
            raise UserError(f"--batch {self.batch} must be between 1 and 4096")
        if not 0 <= self.tune <= 1000:
            raise UserError(f"--tune {self.tune} must be between 0 and 1000 (tpu-mlir's default is 5)")
        if self.tune and self.method != "kl":
            raise UserError("--tune follows --method kl only (as in tpu-mlir); drop --tune or use --method kl")
        if self.refine and self.refine not in REFINE_METHODS:
            raise UserError(f"--refine {self.refine!r} is not one of {', '.join(REFINE_METHODS)}")
        if not 1 <= self.refine_samples <= 10000:
            raise UserError(f"--refine-samples {self.refine_samples} must be between 1 and 10000")
        if self.split_channels not in (0, 1) and not 2 <= self.split_channels <= MAX_CHANNEL_GROUPS:
            raise UserError(f"--split-channels {self.split_channels} must be 0 (off) or 2..{MAX_CHANNEL_GROUPS}")
        if self.histogram not in HISTOGRAMS:
            raise UserError(f"--histogram {self.histogram!r} is not one of {', '.join(HISTOGRAMS)}")

    def fits_samples(self) -> bool:
        """Whether a step after the table fits the samples themselves (fit_to_samples)."""
        return self.tune > 0 or bool(self.refine) or self.split_channels > 1

    def fit_samples(self) -> int:
        """How many of the first samples fit_to_samples reads."""
        return max(self.refine_samples if self.refine or self.split_channels > 1 else 0, self.tune)

    def method_label(self) -> str:
        """The method as written in the table header."""
        return f"percentile{self.percentile:g}" if self.method == "percentile" else self.method


Progress = Callable[[str, int], Callable[[int], None]]  # (label, total) -> advance(n)


# ---------------------------------------------------------------------------------------------------------
# Naming


def tensor_table_names(model: onnx.ModelProto) -> dict[str, str]:
    """tpu-mlir's table name of every graph input and node output of an ONNX model (see module docstring)."""
    producers = {out: node for node in model.graph.node for out in node.output if out}
    users: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    outputs = {o.name for o in model.graph.output}
    origin: dict[str, tuple[str, str | None]] = {}

    def resolve(tensor: str) -> tuple[str, str | None]:
        # iterative walk up the chain of pass-through / folded ops (models can be deep)
        chain, cur = [], tensor
        while cur not in origin:
            node = producers.get(cur)
            if node is None:
                origin[cur] = (cur, None)
                break
            chain.append(cur)
            src = node.input[0] if node.input else ""
            if node.op_type in PASS_THROUGH_OPS or _bn_folds(node, producers, users, outputs):
                if src not in producers and src not in origin:
                    origin[src] = (src, None)
                cur = src
                continue
            origin[cur] = (cur, node.op_type)
            chain.pop()
            break
        for name in reversed(chain):
            node = producers[name]
            src_name, src_type = origin[node.input[0]]
            # pass-through: the output's name with the real producer's type; folded BN: the producer's
            origin[name] = (name, src_type) if node.op_type in PASS_THROUGH_OPS else (src_name, src_type)
        return origin[tensor]

    names = {}
    candidates = [vi.name for vi in model.graph.input] + [o for n in model.graph.node for o in n.output if o]
    for tensor in candidates:
        base, op_type = resolve(tensor)
        names[tensor] = base if op_type is None else f"{base}_{op_type}"
    return names


def _bn_folds(node: onnx.NodeProto, producers: dict, users: dict[str, int], outputs: set[str]) -> bool:
    if node.op_type != "BatchNormalization" or not node.input:
        return False
    prev = producers.get(node.input[0])
    return (
        prev is not None
        and prev.op_type in BN_FOLD_PRODUCERS
        and users.get(node.input[0], 0) == 1
        and node.input[0] not in outputs
    )


# ---------------------------------------------------------------------------------------------------------
# Planning


def plan_calibration(
    model_path: str | Path, input_shapes: InputShapes | None = None, observed: Mapping[str, str] | None = None
) -> CalibrationPlan:
    """Load and pin the model, and choose the tensors to observe (the canonicalized IR's activations);
    `observed`: the choice another process's plan of the same model made (a worker given the driver's): the
    model is not imported again."""
    model = load_model(model_path)
    pin_input_shapes(model, input_shapes or {})
    if observed is not None:
        return CalibrationPlan(model, model_inputs(model), dict(observed), [])
    graph = import_model(model)
    canonicalize(graph)
    # the IR's dtypes come from the frontend's shape inference: no second inference of the ONNX model
    onnx_tensors = {vi.name for vi in model.graph.input} | {o for n in model.graph.node for o in n.output if o}
    table_names = tensor_table_names(model)
    ir_tensors = list(graph.inputs) + [o for op in graph.ops for o in op.outputs]
    observed: dict[str, str] = {}
    skipped = []
    for name in dict.fromkeys(ir_tensors):
        tensor = graph.tensors[name]
        if tensor.is_const or not np.issubdtype(np.dtype(tensor.dtype), np.floating):
            continue
        if name not in onnx_tensors:
            skipped.append(name)
            continue
        observed[name] = table_names[name]
    clashes = len(set(observed.values())) != len(observed)
    if clashes:  # two tensors would share a row: fall back to plain ONNX names, which are unique
        observed = {name: name for name in observed}
    return CalibrationPlan(model, model_inputs(model), observed, skipped)


# ---------------------------------------------------------------------------------------------------------
# The passes


def collect_ranges(
    plan: CalibrationPlan,
    files: Sequence[Path],
    pre: Preprocess,
    options: CalibrationOptions,
    progress: Progress,
    tap: TensorTap | None = None,
    first: int = 0,
    with_grid: bool = False,
) -> CalibrationStats:
    """Pass 1: running min / max (and, for tpu-mlir's geometry, per-sample absmax) of every observed tensor;
    `first`: the place of `files[0]` in the whole sample list (a shard's offset); `with_grid`: also the global
    histogram's grid, which `histograms()` turns into the histogram pass."""
    stats = CalibrationStats(bins=options.bins, first=first, histogram=options.histogram, with_grid=with_grid)
    names = plan.observed
    observe = lambda n, x: stats.observe_range(names[n], x)  # noqa: E731
    tap = tap or TensorTap(plan, options.batch)
    sweep(tap, files, pre, observe, progress("statistics" if with_grid else "ranges", len(files)), _sample_keys(stats))
    return stats


def collect_histograms(
    plan: CalibrationPlan,
    files: Sequence[Path],
    pre: Preprocess,
    options: CalibrationOptions,
    ranges: CalibrationStats,
    progress: Progress,
    tap: TensorTap | None = None,
) -> CalibrationStats:
    """Pass 2: |x| histograms, each sample binned at the geometry its place in pass 1 gives (found by its key)."""
    _check_same_tensors(ranges, plan)
    if ranges.histogram != options.histogram:
        raise UserError(f"the range statistics were made for the {ranges.histogram} histogram, this run asks for "
                        f"--histogram {options.histogram}; use the same --histogram in both passes")  # fmt: skip
    stats = ranges.freeze()
    names = plan.observed
    observe = lambda n, x: stats.observe_histogram(names[n], x)  # noqa: E731
    tap = tap or TensorTap(plan, options.batch)
    sweep(tap, files, pre, observe, progress("histograms", len(files)), _sample_keys(stats))
    return stats


def _sample_keys(stats: CalibrationStats) -> Callable[[str], None] | None:
    """tpu-mlir's histogram finds each sample's place by a key of its content; the global one needs no place."""
    return stats.begin_sample if stats.histogram == "tpu-mlir" else None


def _check_same_tensors(stats: CalibrationStats, plan: CalibrationPlan) -> None:
    want, got = list(plan.observed.values()), list(stats.tensors)
    if set(want) != set(got):
        extra = sorted(set(got) - set(want))[:3]
        missing = sorted(set(want) - set(got))[:3]
        raise UserError(
            f"the range statistics do not belong to this model (missing {missing}, extra {extra}); "
            "pass ranges computed for the same model and --input-shape"
        )


@dataclass
class CalibrationResult:
    """What a run produced: the statistics, the table (None after a range-only run), timing."""

    stats: CalibrationStats
    table: CalibrationTable | None
    samples: int
    seconds: float
    skipped: list[str]
    refinement: RefineResult | None = None  # with CalibrationOptions.refine
    groupings: dict[str, list[np.ndarray]] = field(default_factory=dict)  # with CalibrationOptions.split_channels


def calibrate(
    model_path: str | Path,
    data: Sequence[str | Path],
    pre: Preprocess | None = None,
    options: CalibrationOptions | None = None,
    input_shapes: InputShapes | None = None,
    limit: int | None = None,
    ranges: CalibrationStats | None = None,
    range_only: bool = False,
    keep_histograms: bool = False,
    progress: Progress | None = None,
    jobs: int | None = 1,
    ray_address: str | None = None,
    keep_grid: bool = False,
) -> CalibrationResult:
    """Calibrate a model on sample files and build its table.

    `ranges`: merged pass-1 statistics of all shards (skips pass 1, so shards bin alike); `range_only`: stop
    after pass 1 (no table); `keep_histograms`: make the histograms even for `max`, which needs only ranges;
    `keep_grid` with `range_only`: the range statistics keep the global histogram's grid, so `histograms()` makes
    them at any merged geometry without another pass.
    `jobs`: the cores the passes use, as worker processes of one onnxruntime thread each (None: every core;
    fewer workers when there are few samples, their threads sharing the cores; 1: this process, one thread);
    `ray_address`: run them on a Ray cluster instead (passes/calibration/shards.py). The table does not depend on
    either.
    """
    pre, options, progress = pre or Preprocess(), options or CalibrationOptions(), progress or no_progress
    start = time.perf_counter()
    files = list_samples(data, limit)
    histograms = not range_only and (options.method != "max" or keep_histograms)
    one_pass = ranges is None and options.histogram == "global" and (histograms or (range_only and keep_grid))
    workers = shards.effective_jobs(jobs, len(files))
    if ray_address or workers > 1:
        executor = shards.open_executor(workers, ray_address, (_warm_worker, ()))  # starting while this one plans
        try:
            plan = plan_calibration(model_path, input_shapes)
            stats = _collect_on_workers(plan, model_path, input_shapes, files, pre, options, ranges, histograms,
                                        progress, executor, jobs, one_pass)  # fmt: skip
        finally:
            executor.close()
    else:
        plan = plan_calibration(model_path, input_shapes)
        stats = _collect_here(plan, files, pre, options, ranges, histograms, progress, jobs or 0, one_pass)
    if one_pass and histograms:  # the grid gives the histograms at the merged absmax, no second pass
        stats = stats.histograms()
    table = None if range_only else stats_to_table(stats, options)
    refinement, groupings = None, {}
    if table is not None and options.fits_samples():
        feeds = [load_sample(p, plan.inputs, pre) for p in files[: options.fit_samples()]]
        table, refinement, groupings = fit_to_samples(plan, table, feeds, options)
    seconds = time.perf_counter() - start
    return CalibrationResult(stats, table, len(files), seconds, plan.skipped, refinement, groupings)


def fit_to_samples(
    plan: CalibrationPlan, table: CalibrationTable, feeds: Sequence[Mapping[str, np.ndarray]],
    options: CalibrationOptions,
) -> tuple[CalibrationTable, RefineResult | None, dict[str, list[np.ndarray]]]:  # fmt: skip
    """The steps that fit the samples themselves, on the canonicalized IR as the build will quantize it: the
    channel split, tpu-mlir's tune step, the constants' refit. (table, refinement, groupings)."""
    graph = import_model(plan.model)
    canonicalize(graph)
    names = dict(plan.observed)
    refinement, groupings = None, {}
    if options.split_channels > 1:
        split_feeds = feeds[: options.refine_samples]  # one batch, as the refit's
        graph, table, names, groupings = split_for_table(graph, table, names, split_feeds, options.split_channels)
    if options.tune > 0:
        table = tune_table(graph, table, names, feeds[: options.tune])
    if options.refine:
        refinement = refine_for_table(graph, table, feeds[: options.refine_samples], options.refine, table_names=names)
    return table, refinement, groupings


def _collect_here(
    plan: CalibrationPlan,
    files: Sequence[Path],
    pre: Preprocess,
    options: CalibrationOptions,
    ranges: CalibrationStats | None,
    histograms: bool,
    progress: Progress,
    threads: int = 0,
    one_pass: bool = False,
) -> CalibrationStats:
    """The statistics in this process, on one onnxruntime session of `threads` threads (0: every core): one pass
    for the global histogram's grid (`one_pass`) and for tpu-mlir's histogram, else ranges then histograms."""
    tap = TensorTap(plan, options.batch, threads=threads)
    if one_pass:
        return collect_ranges(plan, files, pre, options, progress, tap, with_grid=True)
    if ranges is None and histograms and options.histogram == "tpu-mlir":
        stats = CalibrationStats(bins=options.bins, histogram=options.histogram)
        names = plan.observed
        observe = lambda n, x: stats.observe_growing(names[n], x)  # noqa: E731
        sweep(tap, files, pre, observe, progress("statistics", len(files)))  # samples in order: no keys
        return stats.finish_growing()
    if ranges is None:
        ranges = collect_ranges(plan, files, pre, options, progress, tap)
    return collect_histograms(plan, files, pre, options, ranges, progress, tap) if histograms else ranges


def _collect_on_workers(
    plan: CalibrationPlan,
    model_path: str | Path,
    input_shapes: InputShapes | None,
    files: Sequence[Path],
    pre: Preprocess,
    options: CalibrationOptions,
    ranges: CalibrationStats | None,
    histograms: bool,
    progress: Progress,
    executor: shards.LocalProcesses | shards.RayCluster,
    cores: int | None,
    one_pass: bool = False,
) -> CalibrationStats:
    """The statistics split over the executor's worker processes or Ray cluster; the same as `_collect_here`'s.
    `cores`: what the local workers' threads share (None: every core)."""

    def run(label: str, frozen: CalibrationStats | None, grid: bool = False) -> CalibrationStats:
        jobs = shards.shard_jobs(model_path, input_shapes, files, pre, options.batch, options.bins, executor.jobs,
                                 frozen, options.histogram, cores, grid, tuple(plan.observed.items()))  # fmt: skip
        return shards.run_pass(executor, run_shard, jobs, progress(label, len(files)))

    if one_pass:
        return run("statistics", None, grid=True)
    if ranges is None:
        ranges = run("ranges", None)
    if not histograms:
        return ranges
    _check_same_tensors(ranges, plan)
    return run("histograms", ranges)


_SESSIONS: dict[tuple, tuple[CalibrationPlan, TensorTap]] = {}  # per worker process, kept between tasks


def _warm_worker() -> None:
    """A starting worker's first step, while the driver plans: what its first task would import."""
    import onnxruntime  # noqa: F401


def run_shard(job: shards.ShardJob) -> CalibrationStats:
    """One chunk of one pass, in a worker; a pure function of `job`. The worker loads the model once, with the
    tensors the driver's plan chose."""
    key = (job.model_path, job.input_shapes, job.batch, job.threads)
    if key not in _SESSIONS:
        _SESSIONS.clear()  # one model per worker at a time
        plan = plan_calibration(job.model_path, dict(job.input_shapes) or None, dict(job.observed) or None)
        _SESSIONS[key] = (plan, TensorTap(plan, job.batch, threads=job.threads))
    plan, tap = _SESSIONS[key]
    options = CalibrationOptions(batch=job.batch, bins=job.bins, method="max", histogram=job.histogram)
    files = [Path(f) for f in job.files]
    if job.ranges is None:
        return collect_ranges(plan, files, job.pre, options, no_progress, tap, first=job.first, with_grid=job.grid)
    return collect_histograms(plan, files, job.pre, options, job.ranges, no_progress, tap)


def no_progress(label: str, total: int) -> Callable[[int], None]:
    return lambda n: None


def stats_to_table(stats: CalibrationStats, options: CalibrationOptions) -> CalibrationTable:
    """The cali_table of statistics; a function of the statistics alone, so merged shards give the same bytes."""
    if not stats.tensors:
        raise UserError("no tensors were calibrated; the model has no float activations")
    needs_hist = options.method != "max"
    if needs_hist and any(st.hist is None for st in stats.tensors.values()):
        raise UserError(
            f"method {options.method!r} needs histogram statistics but these are range-only; "
            "run the histogram pass (drop --range-only) or use --method max"
        )
    rows = table_rows(stats, options.method, **METHOD_PARAMS.get(options.method, lambda o: {})(options))
    samples = max(st.samples for st in stats.tensors.values())
    return table_from_rows(rows, method=options.method_label(), sample_number=samples, histogram_bins=stats.bins)


def merge_stats_files(paths: Sequence[str | Path]) -> CalibrationStats:
    """Merge saved statistics shards (all range-pass or all histogram-pass over the same frozen ranges)."""
    if not paths:
        raise UserError("calibrate merge needs at least one statistics file")
    merged = _load_shard(paths[0])
    for path in paths[1:]:
        shard = _load_shard(path)
        _check_mergeable(merged, shard, Path(paths[0]), Path(path))
        merged = merged.merge(shard)
    return merged


def _load_shard(path: str | Path) -> CalibrationStats:
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError as exc:
        raise UserError(f"cannot read statistics {path}: {exc.strerror}; check the path") from None
    if head[:1] == b"#":  # a cali_table has thresholds only: there is nothing to add up
        raise UserError(
            f"{path} is a calibration table, not statistics; merge the .npz files written with --save-stats"
        )
    return load_stats(path)


def _check_mergeable(a: CalibrationStats, b: CalibrationStats, pa: Path, pb: Path) -> None:
    if set(a.tensors) != set(b.tensors):
        raise UserError(f"{pb.name} has other tensors than {pa.name}; merge shards of the same model only")
    for name, st in a.tensors.items():
        other = b.tensors[name]
        if (st.hist is None) != (other.hist is None):
            raise UserError(
                f"{pb.name} and {pa.name} are from different passes; merge range-only shards together and "
                "histogram shards together"
            )
        if st.hist is not None and (st.hist_range != other.hist_range or st.numel != other.numel):
            raise UserError(
                f"{pb.name} and {pa.name} were binned over different ranges (tensor {name!r}); run shards with "
                "--range-only, merge those, then run each shard with --ranges MERGED"
            )


def max_abs_thresholds(graph: Graph, feeds: Sequence[Mapping[str, np.ndarray]], floor: float = 0.0) -> dict[str, float]:
    """Max-abs threshold of every activation of an IR graph over a few feeds, run by npuc's float interpreter
    (for small models in benches and tests; `calibrate` is the streaming tool for real data)."""
    from npuc.compiler.interp import run

    table: dict[str, float] = {}
    for feed in feeds:
        for name, value in run(graph, dict(feed), keep_all=True).items():
            if name in graph.tensors and graph.tensors[name].data is None:
                table[name] = max(table.get(name, floor), float(np.abs(value).max()))
    return table
