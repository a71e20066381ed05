"""The quantized reference against the float model, and the mixed-precision search built on it.

`Comparison` runs a model on onnxruntime (float) and on the quantized reference interpreter over samples:
per output cosine, SQNR, max abs error and top-1 agreement; per layer (every quantized tensor the float IR
also has, and the graph outputs) cosine, SQNR and max error, worst first; statistics pooled over samples.

`auto_mixed` searches the fewest layers to keep in the scheme's float fallback (bf16 on cv18xx) so that the
worst output cosine reaches a target. Greedy and bounded. Each step takes the int8 layer that loses the most
cosine against its own inputs (the layer that introduces the error, not the ones that inherit it) and tries it
in float together with its consumers (which would re-quantize that tensor with the same threshold); the step
is kept when the output cosine improves. It stops at the target, at `max_layers`, or after 3x that many
trials; a final pass drops every chosen layer the target does not need. Before searching, all int8 layers in
float tells whether the target is reachable at all. `npuc calibrate --target-cos` and `npuc compare
--auto-mixed` use it.

A few held-out samples make the greedy follow their noise. `npuc calibrate` therefore gives it a wider
comparison (the held-out samples and up to 32 calibration ones): it judges the averaging layers (average and
global pools, mean/sum reductions: an 8-bit multiplier on a window sum in int8, cheap in bf16) as one, tried
before the greedy, and it drops the greedy's picks when they do not raise the output there. Measured on PP-OCRv6
rec (24 calibration lines, 5 of them held out; 24 other lines judged): the greedy's 8 picks gave 0.9869 on
the 5 and lost 0.0008 on the unseen lines (0.9771 -> 0.9763, 742 K cycles); the 4 pools, which lose on the 5
but gain on all 24, give 0.9816 there at 533 K cycles (480 K all int8).

Given a ranking (passes/calibration/sensitivity.py: each layer alone in int8; `npuc compare --sensitivity`),
the search keeps a prefix of it in float instead: the first 1, 2, 4, ... ranked layers (up to `max_layers`)
until one reaches the target, then bisection between the last two, so about 2·log2(max_layers) evaluations
instead of the greedy's 3·max_layers. Every prefix it returns as reached was measured to reach. Measured on
PicoDet layout (800x608; the ranking and the target judged on one calibration picture, 10 other documents
scored): the greedy in ranking order kept 48 layers for 0.964 mean / 0.69 worst output cosine, the first 48
ranked layers give 0.9855 / 0.943 (the greedy's keep-if-better steps follow one picture's noise; local loss
blames a layer for error its input brought, the ranking does not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from npuc.compiler.defaults import DEFAULT_MAX_FLOAT_LAYERS
from npuc.compiler.errors import UserError
from npuc.compiler.interp import external_shape, run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.kernels.quantized.formats import convert
from npuc.frontends.onnx import InputShapes, import_model
from npuc.frontends.onnx_load import load_model
from npuc.passes.calibration.calibrate import calibrate, plan_calibration, tensor_table_names
from npuc.passes.calibration.calitable import CalibrationTable, read_table
from npuc.passes.calibration.preprocess import Preprocess, list_samples, load_sample
from npuc.passes.calibration.qtable import beside, bf16_layers
from npuc.passes.calibration.refinement import (
    Refinement,
    load_refinement,
    refit_constants,
    side_file,
    split_as_recorded,
)
from npuc.passes.calibration.rerun import RunCache
from npuc.passes.quantization.quantize import ThresholdMap, quantize, thresholds_for_graph
from npuc.passes.rewrite.canonicalize import canonicalize

# target -> quantize name -> scheme
TARGET_SCHEMES = {"cv18xx": {"int8": "cv18xx_int8", "bf16": "cv18xx_bf16"}}
CONFIDENT = 0.8  # float's top probability from which its top-1 decision counts as confident (bench/accuracy.py)
# `averaging_layers`: op kind -> which of its variants average (max/min pass int8 codes through)
AVERAGING = {"pool2d": lambda a: a.mode == "avg", "global_pool": lambda a: a.mode == "avg",
             "reduce": lambda a: a.kind in ("mean", "sum")}  # fmt: skip
REFERENCE_CACHE_BYTES = 1 << 30  # float per-layer references kept between auto-mixed rounds, beyond: recompute


def _sqnr_db(signal2: float, error2: float) -> float:
    """10 log10(signal / error): +inf without error, -inf for an all-zero reference that the other side is not."""
    if not error2:
        return float("inf")
    return 10 * float(np.log10(signal2 / error2)) if signal2 else float("-inf")


@dataclass
class Agreement:
    """Pooled similarity of a quantized tensor to its float reference."""

    name: str
    cosine: float = 0.0
    sqnr_db: float = 0.0
    max_abs_error: float = 0.0
    top1_agreement: float | None = None
    # top-1 agreement where float gives one class at least CONFIDENT probability (how many such positions)
    confident_top1: float | None = None
    confident_positions: int = 0
    _dot: float = field(default=0.0, repr=False)
    _ref2: float = field(default=0.0, repr=False)
    _q2: float = field(default=0.0, repr=False)
    _err2: float = field(default=0.0, repr=False)
    _top1: list[bool] = field(default_factory=list, repr=False)
    _confident: list[bool] = field(default_factory=list, repr=False)
    sample_cosines: list[float] = field(default_factory=list, repr=False)  # one per add()

    def add(self, ref: np.ndarray, quant: np.ndarray, class_axis: int | None = None,
            probabilities: bool = False) -> None:  # fmt: skip
        """Pool one sample; `class_axis`: the axis of class scores, whose argmax (per position along the other
        axes) is compared for top-1 agreement; `probabilities`: the scores are a softmax's (else logits)."""
        # one C-order copy each (kernels often return NHWC-laid views; astype would keep that layout and
        # ravel copy again)
        r, q = ref.astype(np.float64, order="C").ravel(), quant.astype(np.float64, order="C").ravel()
        dot, ref2, q2 = float(r @ q), float(r @ r), float(q @ q)
        pair = float(np.sqrt(ref2 * q2))
        self.sample_cosines.append(dot / pair if pair else float(np.array_equal(r, q)))
        self._dot += dot
        self._ref2 += ref2
        self._q2 += q2
        error = np.subtract(r, q, out=r)  # r is a copy (astype), reused for the error
        self._err2 += float(error @ error)
        self.max_abs_error = max(self.max_abs_error, float(np.abs(error, out=error).max(initial=0.0)))
        if class_axis is not None:
            quant = quant.reshape(ref.shape)
            agree = (ref.argmax(class_axis) == quant.argmax(class_axis)).ravel()
            self._top1 += list(agree)
            scores = ref.astype(np.float64)
            if not probabilities:  # the largest softmax probability from logits: 1 / sum(exp(l - max))
                scores = 1.0 / np.exp(scores - scores.max(class_axis, keepdims=True)).sum(class_axis, keepdims=True)
            self._confident += list(agree[(scores.max(class_axis) >= CONFIDENT).ravel()])
        norm = np.sqrt(self._ref2 * self._q2)
        self.cosine = self._dot / norm if norm else float(self._ref2 == self._q2)
        self.sqnr_db = _sqnr_db(self._ref2, self._err2)
        self.top1_agreement = float(np.mean(self._top1)) if self._top1 else None
        self.confident_top1 = float(np.mean(self._confident)) if self._confident else None
        self.confident_positions = len(self._confident)

    @staticmethod
    def pooled_cosine(parts: Iterable[Agreement]) -> float:
        """The cosine over every sample of several poolings of the same tensor (each measured on other samples)."""
        parts = list(parts)
        dot, ref2, q2 = (sum(getattr(a, f) for a in parts) for f in ("_dot", "_ref2", "_q2"))
        norm = np.sqrt(ref2 * q2)
        return dot / norm if norm else float(ref2 == q2)

    def public(self) -> dict[str, object]:
        hidden = ("sample_cosines", "confident_top1", "confident_positions")
        fields = {k: v for k, v in asdict(self).items() if not k.startswith("_") and k not in hidden}
        # JSON has no infinities: an exact match (+inf dB) or an all-zero reference (-inf dB) as a string
        return {k: str(v) if isinstance(v, float) and not np.isfinite(v) else v for k, v in fields.items()}


@dataclass
class CompareReport:
    samples: int
    outputs: list[Agreement]
    layers: list[Agreement]  # worst cosine first
    float_layers: list[str] = field(default_factory=list)
    int8_layers: list[str] = field(default_factory=list)  # layers still in int8, worst first
    judged: list[Agreement] = field(default_factory=list)  # per output, what the automatic choices measure

    @property
    def output_cosine(self) -> float:
        """The worst output's cosine: what --auto-mixed targets."""
        return min(a.cosine for a in self.outputs)

    @property
    def mean_sample_cosine(self) -> float:
        """The worst output's mean per-sample cosine (a few large outputs do not outweigh the rest)."""
        return min(float(np.mean(a.sample_cosines)) for a in self.outputs)


@dataclass
class MixedResult:
    """What --auto-mixed found: the layers kept in float and the report with them."""

    target: float
    reached: bool
    float_layers: list[str]
    int8_cosine: float  # all layers quantized
    all_float_cosine: float | None  # every int8 layer in the fallback (None: not needed)
    report: CompareReport
    evaluations: int
    reason: str

    def public(self) -> dict[str, object]:
        return {
            "target_cosine": self.target,
            "reached": self.reached,
            "float_layers": self.float_layers,
            "output_cosine": self.report.output_cosine,
            "int8_cosine": self.int8_cosine,
            "all_float_cosine": self.all_float_cosine,
            "evaluations": self.evaluations,
            "reason": self.reason,
        }


def check_feed(feed: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """A sample must have the model's input shapes and a numeric dtype (else onnxruntime fails opaquely)."""
    for name, want in shapes.items():
        value = np.asarray(feed[name])
        if tuple(value.shape) != tuple(want) or value.dtype.kind not in "fiub":
            got = "x".join(map(str, value.shape)) or "scalar"
            raise UserError(
                f"{where}: input '{name}' is {got} {value.dtype}, the model takes {'x'.join(map(str, want))} "
                "numbers; save samples at the model's input shape"
            )


def _scheme_of(qgraph: Graph, name: str) -> str | None:
    fmt = qgraph.tensors[name].quant if name in qgraph.tensors else None
    return None if fmt is None else fmt.scheme


def _as_float(qgraph: Graph, name: str, value: np.ndarray) -> np.ndarray:
    fmt = qgraph.tensors[name].quant
    if fmt is not None and fmt.scheme == "int8_sym":
        return value.astype(np.float32) * np.float32(fmt.threshold / 127.0)
    return convert(value, fmt, None)


class Comparison:
    """A model, its thresholds and samples, with the float references computed once; `evaluate` quantizes
    with a given set of float layers and measures it."""

    def __init__(
        self,
        model: Path,
        table: CalibrationTable | ThresholdMap,
        data: Path | Sequence[dict[str, np.ndarray]],
        scheme: str,
        input_shapes: InputShapes | None = None,
        pre: Preprocess | None = None,
        refinement: Refinement | None = None,
    ) -> None:
        import onnxruntime as ort

        source = load_model(model)
        self.graph = import_model(source, input_shapes)
        canonicalize(self.graph)
        self.refinement = refinement  # what the build applies from the table's side file: the split, the refit
        if refinement is not None:  # the float reference stays the model's: the split is exact, the refit is not
            self.graph = split_as_recorded(self.graph, refinement)
        if isinstance(table, ThresholdMap):
            self.thresholds = table
        else:  # the source model's table names place rows of BN-folded convs (`<conv out>_Conv`)
            self.thresholds = thresholds_for_graph(self.graph, table, table_names=tensor_table_names(source))
        self.scheme = scheme
        shapes = {n: tuple(external_shape(self.graph, n)) for n in self.graph.inputs}  # as fed (NHWC inputs too)
        if isinstance(data, Path):  # what calibrate reads: .npz/.npy samples and pictures, folders, lists
            inputs = plan_calibration(model, input_shapes).inputs
            self.feeds = [load_sample(p, inputs, pre or Preprocess()) for p in list_samples([data])]
        else:
            self.feeds = list(data)
            for i, feed in enumerate(self.feeds):
                check_feed(feed, shapes, f"sample {i}")
        # samples saved as float64 (numpy's default) run as the model's input type
        dtypes = {n: np.dtype(self.graph.tensors[n].dtype) for n in self.graph.inputs}
        self.feeds = [
            {n: np.asarray(v, dtype=dtypes.get(n, np.asarray(v).dtype)) for n, v in f.items()} for f in self.feeds
        ]
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        self.ref_outputs = [dict(zip(names, session.run(names, feed))) for feed in self.feeds]
        self._ref_layers: dict[int, dict[str, np.ndarray]] = {}
        self._cached_bytes = 0
        self.base_float: list[str] = []  # layers every evaluation keeps in float (the table's qtable, as the build)
        self.qtable: Path | None = None  # where base_float came from
        self.producers = {out: op for op in self.graph.ops for out in op.outputs}
        self.runs = RunCache(QUANT_KERNELS)  # successive evaluations resume where their graphs first differ

    def ref_layers(self, i: int) -> dict[str, np.ndarray]:
        """Every float IR tensor of sample i (kept while the cache budget lasts)."""
        if i in self._ref_layers:
            return self._ref_layers[i]
        values = run(self.graph, self.feeds[i], keep_all=True)
        size = sum(v.nbytes for v in values.values())
        if self._cached_bytes + size <= REFERENCE_CACHE_BYTES:
            self._ref_layers[i] = values
            self._cached_bytes += size
        return values

    def float_names(self, layers: Iterable[str]) -> list[str]:
        """Layer tensors plus the names of the ops producing them: the quantizer may split an op from its
        activation, and both halves belong to the layer."""
        out = []
        for name in layers:
            out.append(name)
            if name in self.producers:
                out.append(self.producers[name].name)
        return out

    def quantized(self, float_layers: Iterable[str] = ()) -> Graph:
        """The quantized graph `npuc build` makes from the table, its side file and these float layers: the
        split graph with the refitted constants (outside the float layers), quantized."""
        names = self.float_names(float_layers)
        graph = (
            self.graph if self.refinement is None else refit_constants(self.graph, self.refinement, float_layers=names)
        )
        return quantize(graph, self.thresholds, self.scheme, names)

    def evaluate(self, float_layers: Iterable[str] = (), per_layer: bool = True,
                 samples: Sequence[int] | None = None) -> CompareReport:  # fmt: skip
        """Quantize with `float_layers` (and `base_float`) kept in float and measure every sample (or those
        indexed by `samples`): the outputs and what the automatic choices judge, and with `per_layer` every
        quantized tensor (the per-layer pooling costs as much as the quantized run on large models; searches that
        only score the outputs skip it)."""
        chosen = list(dict.fromkeys([*self.base_float, *float_layers]))
        qgraph = self.quantized(chosen)
        outputs = {name: Agreement(name) for name in self.graph.outputs}
        judged = {name: Agreement(tensor) for name, tensor in self.judged.items() if tensor != name}
        layers: dict[str, Agreement] = {}
        class_axes = self.class_axes
        softmaxed = {name: getattr(self.producers.get(name), "kind", None) == "softmax" for name in outputs}
        self.runs.begin(qgraph)
        for i in range(len(self.feeds)) if samples is None else samples:
            # the float IR run is only for the judged tensors and the layers (the outputs' reference is onnxruntime's)
            feed, ref_all = self.feeds[i], self.ref_layers(i) if per_layer or judged else {}
            q_all = self.runs.run(i, feed)
            for name, agreement in outputs.items():
                agreement.add(self.ref_outputs[i][name], q_all[name], class_axes[name], softmaxed[name])
            for agreement in judged.values():
                name = agreement.name
                agreement.add(ref_all[name], _as_float(qgraph, name, q_all[name]))
            for name, value in q_all.items() if per_layer else ():
                if name not in ref_all or name in self.graph.inputs:
                    continue
                if qgraph.tensors[name].quant is not None or name in self.graph.outputs:
                    layers.setdefault(name, Agreement(name)).add(ref_all[name], _as_float(qgraph, name, value))
        self.runs.end()
        ranked = sorted(layers.values(), key=lambda a: (a.cosine, a.name))
        # graph outputs are dequantized by a cast: their layer's format is that of the cast's input
        inner = {op.outputs[0]: op.inputs[0] for op in qgraph.ops if op.outputs[0] in self.graph.outputs}
        int8 = [a.name for a in ranked if _scheme_of(qgraph, inner.get(a.name, a.name)) == "int8_sym"]
        count = len(self.feeds) if samples is None else len(samples)
        report = CompareReport(count, list(outputs.values()), ranked, chosen, int8)
        report.judged = [judged.get(name, outputs[name]) for name in self.graph.outputs]
        return report

    @property
    def judged(self) -> dict[str, str]:
        """Graph output -> the tensor whose error the automatic choices measure: a softmax's input (its logits)
        where the output is a softmax, which saturates and hides the error on confident samples; else itself."""
        found = {}
        for name in self.graph.outputs:
            op = self.producers.get(name)
            logits = op.inputs[0] if op is not None and op.kind == "softmax" else name
            found[name] = logits if logits in self.graph.tensors and logits not in self.graph.inputs else name
        return found

    @property
    def class_axes(self) -> dict[str, int | None]:
        """Graph output -> the axis of its class scores, for top-1 agreement: a softmax's axis (per position of a
        sequence: OCR), else the one axis past the first longer than 1 (a classifier's logits); else None."""
        axes: dict[str, int | None] = {}
        for name in self.graph.outputs:
            op, shape = self.producers.get(name), self.graph.tensors[name].shape
            long = [axis for axis, size in enumerate(shape) if axis and size > 1]
            axes[name] = long[0] if len(long) == 1 else None
            if op is not None and op.kind == "softmax" and shape:
                axis = op.attrs.axis % len(shape)  # opset < 13 normalises the flattened axes from `axis` on
                axes[name] = axis if axis == len(shape) - 1 or not op.attrs.coerce_2d else axes[name]
        return axes

    def unit(self, layer: str) -> list[str]:
        """The layers that leave int8 together to keep tensor `layer` out of int8: its producer and every
        consumer (each consumer would re-quantize it with the same threshold)."""
        consumers = [op.outputs[0] for op in self.graph.ops if layer in op.inputs and op.outputs]
        return list(dict.fromkeys([layer, *consumers]))

    def averaging_layers(self, layers: Iterable[str]) -> list[str]:
        """Those of `layers` an average pool, global pool or reduction makes (max pools excepted: in int8 they
        pass the codes through). Their int8 form scales a window sum by an 8-bit multiplier and shift; in the
        fallback they cost little (one pass over their input, outputs far smaller)."""
        ops = [(name, self.producers.get(name)) for name in layers]
        return [name for name, op in ops if op is not None and op.kind in AVERAGING and AVERAGING[op.kind](op.attrs)]

    def local_loss(self, report: CompareReport) -> dict[str, float]:
        """Per layer: the worst cosine among its activation inputs minus its own (the error it adds)."""
        cos = {a.name: a.cosine for a in report.layers}
        loss = {}
        for name, own in cos.items():
            op = self.producers.get(name)
            inputs = [n for n in (op.inputs if op else []) if n and not self.graph.tensors[n].is_const]
            loss[name] = min((cos.get(n, 1.0) for n in inputs), default=1.0) - own
        return loss


def auto_mixed(comparison: Comparison, target: float, max_layers: int = DEFAULT_MAX_FLOAT_LAYERS,
               base: Sequence[str] = (), order: Sequence[str] | None = None,
               wider: Callable[[], Comparison] | None = None) -> MixedResult:  # fmt: skip
    """The fewest float layers (greedy, bounded) for an output cosine >= target; see the module docstring.
    `base`: layers in float from the start (a pattern's), not counted among those chosen; `order`: a ranking of
    the int8 layers (passes/calibration/sensitivity.py), whose shortest reaching prefix is searched instead;
    `wider`: makes the same model's comparison on more samples (called once the search needs it), which judges
    what the few samples of `comparison` cannot: every int8 averaging layer (`Comparison.averaging_layers`) in
    float at once, tried first and kept when the output gains (not counted against `max_layers`), and the
    greedy's picks, dropped when they do not gain."""
    bundle: list[str] = []

    def evaluate(layers: Iterable[str] = (), per_layer: bool = False) -> CompareReport:
        return comparison.evaluate([*base, *bundle, *layers], per_layer=per_layer)

    if not 0.0 < target <= 1.0:
        raise UserError(f"--auto-mixed {target}: a cosine target must be in (0, 1], e.g. 0.99")
    if max_layers < 1:
        raise UserError(f"--max-float-layers {max_layers} must be at least 1")
    base_report = evaluate(per_layer=True)  # the layers' losses choose the picks
    evaluations = 1
    if base_report.output_cosine >= target:
        reason = "int8 already reaches it"
        return MixedResult(target, True, [], base_report.output_cosine, None, base_report, evaluations, reason)
    candidates = base_report.int8_layers
    every = evaluate(candidates)
    evaluations += 1
    if every.output_cosine < target:
        reason = (
            f"unreachable: even all {len(candidates)} int8 layers in float give output cosine "
            f"{every.output_cosine:.6f} < {target}"
        )
        return MixedResult(target, False, [], base_report.output_cosine, every.output_cosine, base_report,
                           evaluations, reason)  # fmt: skip
    if order is not None:
        return _ranked_prefix(evaluate, target, max_layers, [n for n in order if n in candidates], base_report,
                              every, evaluations)  # fmt: skip
    report, widely = base_report, None  # widely: `wider`'s output cosine of what is kept so far
    if wider is not None:
        wide = wider()
        widely = wide.evaluate(base, per_layer=False).output_cosine
        averages = comparison.averaging_layers(candidates)
        evaluations += 1 + bool(averages)
        if averages and (trial := wide.evaluate([*base, *averages], per_layer=False).output_cosine) > widely:
            bundle[:], widely = averages, trial
            report = evaluate(per_layer=True)
            evaluations += 1
    chosen: list[str] = []
    tried, last = set(), []
    budget = 3 * max_layers  # evaluations the greedy phase may spend
    while report.output_cosine < target and len(chosen) < max_layers and budget > 0:
        left = [n for n in report.int8_layers if n not in chosen and n not in tried]
        if not left:
            break
        loss = comparison.local_loss(report)
        pick = max(left, key=lambda n: (loss.get(n, 0.0), n))
        tried.add(pick)
        unit = [n for n in comparison.unit(pick) if n not in chosen and n not in bundle]
        if len(chosen) + len(unit) > max_layers:
            continue
        # with its layers pooled: a kept pick's layers choose the next pick (measuring it again would cost a run
        # where the cache cannot keep one: PicoDet 800x608 on 4 samples)
        trial = evaluate(chosen + unit, per_layer=True)
        evaluations, budget = evaluations + 1, budget - 1
        if trial.output_cosine > report.output_cosine:  # keep only picks that help the output
            chosen += unit
            report, last = trial, unit
    unheld = ""
    if chosen and widely is not None:
        evaluations += 1
        if wide.evaluate([*base, *bundle, *chosen], per_layer=False).output_cosine <= widely:
            unheld = f"; {len(chosen)} pick(s) dropped: no gain on {len(wide.feeds)} samples"
            chosen, last, report = [], [], evaluate(per_layer=True)
            evaluations += 1
    if report.output_cosine < target:
        reason = (
            f"not reached within --max-float-layers {max_layers}: {len(chosen)} float layer(s){_with(bundle)} give "
            f"{report.output_cosine:.6f} < {target} (all int8 layers in float give {every.output_cosine:.6f})"
            f"{unheld}"
        )
        return MixedResult(target, False, bundle + chosen, base_report.output_cosine, every.output_cosine, report,
                           evaluations, reason)  # fmt: skip
    dropped = False
    # re-check: drop what the others made unnecessary (not the last pick: without it the target was missed)
    for name in [n for n in chosen if n not in last] if len(chosen) > 1 else []:
        trial = evaluate([n for n in chosen if n != name])
        evaluations += 1
        if trial.output_cosine >= target:
            chosen.remove(name)
            dropped = True
    if dropped:
        report = evaluate(chosen, per_layer=True)
    reason = f"{len(chosen)} float layer(s){_with(bundle)} reach {report.output_cosine:.6f} >= {target}"
    return MixedResult(target, True, bundle + chosen, base_report.output_cosine, every.output_cosine, report,
                       evaluations, reason)  # fmt: skip


def _with(bundle: list[str]) -> str:
    return f" and {len(bundle)} averaging one(s)" if bundle else ""


def _ranked_prefix(evaluate: Callable[..., CompareReport], target: float, max_layers: int, order: list[str],
                   base_report: CompareReport, every: CompareReport, evaluations: int) -> MixedResult:  # fmt: skip
    """The shortest prefix of `order` in float that reaches `target` (see the module docstring); else the best
    prefix measured."""
    top = min(max_layers, len(order))
    rungs = sorted({*(2**i for i in range(top.bit_length()) if 2**i < top), top})
    measured: dict[int, CompareReport] = {}

    def reaches(k: int) -> bool:
        nonlocal evaluations
        measured[k] = evaluate(order[:k])
        evaluations += 1
        return measured[k].output_cosine >= target

    lo, hi = 0, None
    for k in rungs:
        if reaches(k):
            hi = k
            break
        lo = k
    if hi is None:
        k = max(measured, key=lambda n: (measured[n].output_cosine, -n), default=0)
        report = evaluate(order[:k], per_layer=True) if k else base_report  # its layers, for the report
        evaluations += bool(k)
        reason = (f"not reached within --max-float-layers {max_layers}: the best prefix of the ranking, {k} "
                  f"float layer(s), gives {report.output_cosine:.6f} < {target} (all int8 layers in float give "
                  f"{every.output_cosine:.6f})")  # fmt: skip
        return MixedResult(target, False, order[:k], base_report.output_cosine, every.output_cosine, report,
                           evaluations, reason)  # fmt: skip
    while hi - lo > 1:  # every hi kept was measured to reach the target
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    report = evaluate(order[:hi], per_layer=True)
    reason = f"the first {hi} ranked layer(s) in float reach {report.output_cosine:.6f} >= {target}"
    return MixedResult(target, True, order[:hi], base_report.output_cosine, every.output_cosine, report,
                       evaluations + 1, reason)  # fmt: skip


def _scheme(target: str, quant: str) -> str:
    schemes = TARGET_SCHEMES.get(target)
    if schemes is None or quant not in schemes:
        raise UserError(f"--target {target} --quant {quant}: not supported; use --target cv18xx --quant int8|bf16")
    return schemes[quant]


def load_comparison(
    model: Path,
    table: Path | CalibrationTable | None,
    data: Path,
    target: str = "cv18xx",
    quant: str = "int8",
    calib_data: Sequence[str | Path] = (),
    input_shapes: InputShapes | None = None,
    pre: Preprocess | None = None,
    given: Sequence[str] = (),
    qtable: Path | None = None,
) -> Comparison:
    """A Comparison from the CLI's inputs: a table file, a table, or calibration data (KL) to make one;
    `pre` prepares pictures (the same preprocessing as calibrate's). A table calibrated on pictures records
    its preprocessing: it is used, and a field of `pre` named in `given` (set on the command line) that
    contradicts it is an error naming both values. As `npuc build --calib TABLE` does, int8 keeps the BF16
    layers of `qtable`, else of the qtable beside a table file, in float."""
    scheme = _scheme(target, quant)
    if (table is None) == (not calib_data):
        raise UserError("give exactly one of --calib TABLE or --calib-data DIR")
    refinement, path = None, None
    if table is None:
        table = calibrate(model, list(calib_data), pre, input_shapes=input_shapes).table
    elif not isinstance(table, CalibrationTable):
        if side_file(table).is_file():  # the table describes the graph its side file makes, as the build reads it
            refinement = load_refinement(side_file(table))
        path, table = table, read_table(table)
        pre = recorded_preprocess(table, pre or Preprocess(), given, str(path))
    if qtable is not None and quant != "int8":
        raise UserError(f"--qtable {qtable} is for int8 comparisons; drop it with --quant {quant}")
    if qtable is None and path is not None and quant == "int8" and beside(path).is_file():
        qtable = beside(path)
    comparison = Comparison(model, table, data, scheme, input_shapes, pre, refinement)
    if qtable is not None:
        known = {op.name for op in comparison.graph.ops} | set(comparison.graph.tensors)
        comparison.base_float = bf16_layers(qtable, known, target)
        comparison.qtable = qtable
    return comparison


def recorded_preprocess(table: CalibrationTable, pre: Preprocess, given: Sequence[str], where: str) -> Preprocess:
    """The preprocessing `table` was calibrated with (its `# preprocess:` line), else `pre`; a field set on the
    command line (`given`) must agree with the table's."""
    if table.preprocess is None:
        return pre
    recorded = Preprocess.from_spec(table.preprocess, where)
    for name, ours, theirs in pre.differences(recorded):
        if name in given:
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag} {ours} contradicts {where}, calibrated with {name}={theirs}; drop {flag} "
                            "or calibrate again with it")  # fmt: skip
    return recorded


def compare_model(
    model: Path,
    table: Path | CalibrationTable | None,
    data: Path,
    target: str = "cv18xx",
    quant: str = "int8",
    float_layers: Iterable[str] = (),
    calib_data: Sequence[str | Path] = (),
) -> CompareReport:
    """Quantize `model` with `table` (or a KL table from `calib_data`) and compare it with the float model on
    every sample in `data`."""
    return load_comparison(model, table, data, target, quant, calib_data).evaluate(float_layers)


def held_out_search(
    model: Path,
    table: CalibrationTable,
    held_out: Sequence[dict[str, np.ndarray]],
    target: float,
    max_layers: int = DEFAULT_MAX_FLOAT_LAYERS,
    input_shapes: InputShapes | None = None,
    base: Sequence[str] = (),
    refinement: Refinement | None = None,
    calibration: Callable[[], Sequence[dict[str, np.ndarray]]] = list,
) -> MixedResult:
    """`npuc calibrate --target-cos`: the fewest cv18xx layers to keep in bf16, besides `base`, for an output
    cosine >= `target` on samples the thresholds never saw (on the graph `refinement` makes, when given). Those
    and the samples `calibration` loads (only when int8 misses the target) judge the averaging layers and the
    greedy's picks (`auto_mixed`'s `wider`)."""
    scheme = _scheme("cv18xx", "int8")
    comparison = Comparison(model, table, held_out, scheme, input_shapes, refinement=refinement)

    def wide() -> Comparison:
        return Comparison(model, table, [*held_out, *calibration()], scheme, input_shapes, refinement=refinement)

    return auto_mixed(comparison, target, max_layers, base, wider=wide)
