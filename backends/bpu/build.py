"""Build the bpu output folder: hbDNN contract (JSON + C header) and the QDQ ONNX of npuc's int8 model.

The float graph is quantized with npuc's symmetric int8 scheme (`cv18xx_int8`: per-tensor activations th/127,
per-channel conv weights); the quantized ONNX carries those numbers (passes/export/qdq.py). By default it is the exact
form (passes/export/qdq_exact.py: integer ops that give npuc's int8 codes bit for bit, float32 outputs dequantized
as q·scale like the contract's SCALE); `qdq_form=plain` writes float ops between QuantizeLinear/DequantizeLinear
pairs instead, for tools that expect pure QDQ. Image inputs described by an
hb_mapper config (options["hb_inputs"]) take int8 NHWC runtime pixels (u8 - 128) and start with the
HzPreprocess chain, as hb_mapper's quantized_model.onnx does; featuremap inputs take float32 and are S8
in the contract.

Options (BuildRequest.options):
  name          file prefix (default: the model's stem)
  hb_inputs     InputConfig per input from frontends.hbconfig (absent: every input is a featuremap)
  quanti_type   "scale" (default) or "shift": the quantiType of S8 boundaries; shift rounds the boundary
                threshold up to 127·2^-shift so the scale is a power of two
  quant_output  outputs as S8 codes with their SCALE/SHIFT (default: F32, dequantized)
  float_layers  op/tensor names kept in the fallback format
  calib_data    sample folder/file(s) to calibrate on when no --calib table is given
  calib_method  kl (default), max, percentile, mse; calib_percentile for percentile
  march         bernoulli2 (default, X3/J3), bayes (J5) or bayes-e (X5), recorded in the contract
  qdq_form      exact (default) or plain: the form of the quantized ONNX
  act_scale     tensor (default), channel or auto: activation scales per tensor (th/127), or per channel inside
                the graph (hb_mapper's per_channel; min(th, 2 x channel max |x|)/127 from the calibration
                samples' float run, passes/export/qdq.plan_per_channel), written in the plain form (the exact
                form is npuc's per-tensor integer reference); auto measures both on the calibration samples
                (`choose_act_scale`) and keeps the closer to the float model, the summary gives both cosines
  calib_feeds   a callable giving the calibration feeds of an hb_mapper config (api/hbcalib.py), for act_scale
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_tree
from npuc.compiler.interp import external_shape
from npuc.compiler.ir import Graph
from npuc.compiler.sanitize import file_stem
from npuc.compiler.targets import BuildRequest, BuildResult
from npuc.frontends.hbconfig import InputConfig
from npuc.frontends.hbconfig_schema import MARCHES
from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate, plan_calibration
from npuc.passes.calibration.calitable import CalibrationTable, read_table
from npuc.passes.calibration.channel_split import channel_peaks
from npuc.passes.calibration.preprocess import Preprocess, list_samples, load_sample
from npuc.passes.export.qdq import (
    EXACT_NOTE,
    FORMS,
    InputPrologue,
    plan_from_quantized,
    plan_per_channel,
    split_into_slices,
    thresholds_for_model,
    write_qdq,
    write_qdq_exact,
)
from npuc.passes.quantization.qsim import output_cosines
from npuc.passes.quantization.quantize import ThresholdMap, quantize

from .contract import (
    NUMPY_TYPES,
    Contract,
    TensorProperties,
    contract_to_header,
    contract_to_json,
    make_properties,
)
from .qdq_runtime import qdq_session

CONTRACT_FILE = "hbdnn_contract.json"
QUANTI_TYPES = ("scale", "shift")
ACT_SCALES = ("tensor", "channel", "auto")
AUTO_SAMPLES = (
    32  # act_scale=auto: the calibration samples it measures on (two folds: ranges of one half, the other judges)
)
AUTO_MIN_GAIN = 1e-3  # the mean output cosine per-channel scales must add to be kept
MAX_SHIFT = 31
IMAGE_TYPES = {"nv12": "IMG_NV12", "yuv444": "IMG_YUV444", "rgb": "IMG_RGB", "bgr": "IMG_BGR", "gray": "IMG_Y"}


@dataclass(frozen=True)
class BpuOptions:
    name: str
    hb_inputs: tuple[InputConfig, ...]
    quanti_type: str
    quant_output: bool
    float_layers: tuple[str, ...]
    calib_data: tuple[str, ...]
    calib_method: str
    calib_percentile: float
    march: str
    qdq_form: str = "exact"
    act_scale: str = "tensor"
    calib_feeds: Callable[[], Iterable[dict[str, np.ndarray]]] | None = None

    @classmethod
    def from_request(cls, request: BuildRequest) -> BpuOptions:
        o = dict(request.options)
        quanti = str(o.get("quanti_type", "scale")).lower()
        if quanti not in QUANTI_TYPES:
            raise UserError(f"--option quanti_type={quanti}: use one of {', '.join(QUANTI_TYPES)}")
        march = str(o.get("march", "bernoulli2"))
        if march not in MARCHES:
            raise UserError(f"--option march={march}: use one of {', '.join(MARCHES)} (X3/J3, J5, X5)")
        data = o.get("calib_data") or ()
        hb_inputs, feeds = tuple(o.get("hb_inputs") or ()), o.get("calib_feeds")
        if not all(isinstance(cfg, InputConfig) for cfg in hb_inputs) or (feeds is not None and not callable(feeds)):
            raise UserError("--option hb_inputs / calib_feeds come from an hb_mapper config: pass --config YAML "
                            "instead")  # fmt: skip
        act = str(o.get("act_scale", "tensor")).lower()
        if act not in ACT_SCALES:
            raise UserError(f"--option act_scale={act}: use one of {', '.join(ACT_SCALES)}")
        form = str(o.get("qdq_form", "plain" if act == "channel" else "exact")).lower()
        if form not in FORMS:
            raise UserError(f"--option qdq_form={form}: use one of {', '.join(FORMS)}")
        if (act == "channel" and form != "plain") or (act == "auto" and "qdq_form" in o and form != "plain"):
            raise UserError(
                f"--option act_scale={act} is written in the plain QDQ form (npuc's exact integer form has "
                "per-tensor activations): drop --option qdq_form=exact or use act_scale=tensor"
            )
        return cls(
            name=file_stem(str(o.get("name") or request.model_path.stem)),  # it names the output files
            hb_inputs=hb_inputs,
            quanti_type=quanti,
            quant_output=bool(o.get("quant_output", False)),
            float_layers=tuple(o.get("float_layers") or ()),
            calib_data=tuple(str(d) for d in ([data] if isinstance(data, (str, Path)) else data)),
            calib_method=str(o.get("calib_method", "kl")),
            calib_percentile=float(o.get("calib_percentile", 99.99)),
            march=march,
            qdq_form=form,
            act_scale=act,
            calib_feeds=feeds,
        )


def calibration_table(request: BuildRequest, opts: BpuOptions) -> CalibrationTable:
    """The --calib table, or one made now from options["calib_data"]."""
    if request.calib_table is not None:
        return read_table(request.calib_table)
    if not opts.calib_data:
        raise UserError(
            "target bpu quantizes to int8 and needs thresholds: give --calib TABLE, cal_data_dir in --config, "
            "or --option calib_data=FOLDER"
        )
    g = request.graph
    shapes = {n: external_shape(g, n) for n in g.inputs}
    options = CalibrationOptions(method=opts.calib_method, percentile=opts.calib_percentile)
    result = calibrate(request.model_path, list(opts.calib_data), Preprocess(), options, input_shapes=shapes)
    return result.table


def calibration_feeds(request: BuildRequest, opts: BpuOptions) -> Iterable[dict[str, np.ndarray]]:
    """The samples the per-channel ranges are measured on: the config's (calib_feeds), else calib_data's."""
    if opts.calib_feeds is not None:
        return opts.calib_feeds()
    if not opts.calib_data:
        raise UserError(
            "--option act_scale=channel measures each channel's range on calibration samples: give "
            "--option calib_data=FOLDER (or cal_data_dir in --config)"
        )
    g = request.graph
    inputs = plan_calibration(request.model_path, {n: external_shape(g, n) for n in g.inputs}).inputs
    return (load_sample(f, inputs, Preprocess()) for f in list_samples(list(opts.calib_data)))


def activation_peaks(graph: Graph, feeds: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-channel max |x| of the graph's 4-D activations over `feeds`, one sample at a time (memory flat)."""
    peaks: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, peak in channel_peaks(graph, [feed]).items():
            peaks[name] = np.maximum(peaks[name], peak) if name in peaks else peak
    if not peaks:
        raise UserError("--option act_scale=channel: the calibration data holds no sample")
    return peaks


def choose_act_scale(request: BuildRequest, graph: Graph, thresholds: ThresholdMap, qgraph: Graph,
                     opts: BpuOptions, notes: list[str]) -> str:  # fmt: skip
    """act_scale=auto: "channel" or "tensor", whichever plain QDQ model follows onnxruntime's float model closer
    (mean output cosine over the outputs and samples) on up to AUTO_SAMPLES calibration samples, each export run
    unfused (qdq_runtime: the BPU's int32 sums, not a host kernel's saturation). A per-channel scale fits the
    samples it was measured on, so it is judged on samples it did not see: two folds, the channel ranges of each
    half judged on the other. Per channel is kept only when it gains AUTO_MIN_GAIN. Both models
    take float inputs here: an image input's HzPreprocess is the same for both."""
    import onnxruntime as ort

    feeds = list(itertools.islice(calibration_feeds(request, opts), AUTO_SAMPLES))
    half = len(feeds) // 2
    if half == 0:
        raise UserError("--option act_scale=auto judges on samples the ranges were not measured on: give two or "
                        "more calibration samples, or act_scale=tensor|channel")  # fmt: skip
    reference = ort.InferenceSession(str(request.model_path), providers=["CPUExecutionProvider"])
    wanted = [o.name for o in reference.get_outputs()]
    truth = [reference.run(wanted, feed) for feed in feeds]

    def cosines(model: onnx.ModelProto, judged: range) -> list[float]:
        session = qdq_session(model.SerializeToString())
        return [float(output_cosines(np.asarray(want)[None], np.asarray(got)[None])[0]) for i in judged
                for want, got in zip(truth[i], session.run(wanted, feeds[i]), strict=True)]  # fmt: skip

    first, second = range(half), range(half, len(feeds))
    per_channel: list[float] = []
    for measured, judged in ((first, second), (second, first)):
        peaks = activation_peaks(graph, (feeds[i] for i in measured))
        per_channel += cosines(write_qdq(graph, plan_per_channel(graph, thresholds, peaks, opts.float_layers)), judged)
    score = {"tensor": float(np.mean(cosines(write_qdq(qgraph, plan_from_quantized(qgraph)), range(len(feeds))))),
             "channel": float(np.mean(per_channel))}  # fmt: skip
    chosen = "channel" if score["channel"] >= score["tensor"] + AUTO_MIN_GAIN else "tensor"
    notes.append(
        f"act_scale=auto: {chosen} kept (mean output cosine on {len(feeds)} calibration samples, the channel "
        f"ranges of each half judged on the other: per tensor {score['tensor']:.4f}, per channel "
        f"{score['channel']:.4f})"
    )
    return chosen


def shift_for(threshold: float) -> int | None:
    """The SHIFT of a boundary: largest s with 127·2^-s >= threshold (None if s would be < 0 or > 31)."""
    s = int(np.floor(np.log2(127.0 / float(threshold))))
    return s if 0 <= s <= MAX_SHIFT else None


def boundary_thresholds(
    graph: Graph, table: CalibrationTable, model_path: Path, opts: BpuOptions, notes: list[str]
) -> ThresholdMap:
    """Thresholds with SHIFT boundaries rounded up to powers of two (float inputs, int8 outputs)."""
    th = thresholds_for_model(graph, table, model_path)
    if opts.quanti_type != "shift":
        return th
    images = {i.name for i in opts.hb_inputs if i.is_image}
    names = [n for n in graph.inputs if n not in images] + (list(graph.outputs) if opts.quant_output else [])
    for name in names:
        if name not in th.thresholds:
            continue
        s = shift_for(th.thresholds[name])
        if s is None:
            notes.append(f"{name}: threshold {th.thresholds[name]:g} has no shift in 0..{MAX_SHIFT}; kept as SCALE")
            continue
        th.thresholds[name] = float(np.float32(127.0 * 2.0**-s))
    return th


def _quant_fields(scale: float, opts: BpuOptions) -> dict[str, Any]:
    s = shift_for(scale * 127.0) if opts.quanti_type == "shift" else None
    if s is not None and np.float32(2.0**-s) == np.float32(scale):
        return {"quanti_type": "SHIFT", "shift_data": (s,)}
    return {"quanti_type": "SCALE", "scale_data": (float(np.float32(scale)),), "zero_point_data": (0,)}


def _input_properties(qgraph: Graph, name: str, cfg: Any, opts: BpuOptions) -> TensorProperties:
    if cfg is not None and cfg.is_image:
        n, c, h, w = qgraph.shape(name)
        c_rt = 1 if cfg.type_rt == "gray" else 3
        layout = "NCHW" if cfg.type_rt in ("nv12", "gray") else (cfg.layout_rt or "NHWC")
        valid = (n, c_rt, h, w) if layout == "NCHW" else (n, h, w, c_rt)
        p = make_properties(name, valid, layout, IMAGE_TYPES[cfg.type_rt], False)
        p.extra = {
            "input_type_rt": cfg.type_rt,
            "input_type_train": cfg.type_train,
            "input_space_and_range": cfg.space,
            "norm_type": cfg.norm_type,
            "mean_value": list(cfg.mean or ()),
            "scale_value": list(cfg.scale or ()),
            "quantized_model_input": f"int8 {'x'.join(map(str, (n, h, w, c_rt)))} NHWC, u8 - 128",
        }
        return p
    shape = external_shape(qgraph, name)
    layout = qgraph.input_layouts.get(name, "nchw").upper() if len(shape) == 4 else "NONE"
    fmt = _boundary_format(qgraph, name)
    if fmt is None:  # the scheme kept this input unquantized (no threshold): the contract says its type
        return make_properties(name, shape, layout, NUMPY_TYPES[np.dtype(qgraph.tensors[name].dtype).name], False)
    return make_properties(name, shape, layout, "S8", False, **_quant_fields(fmt, opts))


def _boundary_format(qgraph: Graph, name: str) -> float | None:
    """The int8 scale a graph input is quantized to on entry (its cast op), or None."""
    for op in qgraph.ops:
        q = getattr(op.attrs, "quant", None)
        if op.kind == "cast" and op.inputs[0] == name and q is not None and q.output is not None:
            if q.output.scheme == "int8_sym":
                return float(q.output.scale)
    return None


def _output_properties(qgraph: Graph, name: str, opts: BpuOptions) -> TensorProperties:
    shape = qgraph.shape(name)
    layout = "NCHW" if len(shape) == 4 else "NONE"
    producer = next((op for op in qgraph.ops if name in op.outputs), None)
    q = getattr(producer.attrs, "quant", None) if producer is not None else None
    fmt = q.inputs[0] if producer is not None and producer.kind == "cast" and q is not None and q.inputs else None
    if opts.quant_output and fmt is not None and fmt.scheme == "int8_sym":
        return make_properties(name, shape, layout, "S8", True, **_quant_fields(float(fmt.scale), opts))
    dtype = np.dtype(qgraph.tensors[name].dtype)  # an output may pass integers through (token ids)
    return make_properties(name, shape, layout, NUMPY_TYPES[dtype.name] if dtype.kind in "iu" else "F32", True)


def prologues_for(inputs: Sequence[Any]) -> dict[str, InputPrologue]:
    return {cfg.name: InputPrologue(cfg.affine()) for cfg in inputs if cfg.is_image}


def quantized_model(request: BuildRequest, graph: Graph, thresholds: ThresholdMap, qgraph: Graph,
                    opts: BpuOptions, notes: list[str]) -> onnx.ModelProto:  # fmt: skip
    """The folder's quantized ONNX: exact integer form (outputs dequantized as q·scale) or plain QDQ, per-tensor
    (`qgraph`'s numbers) or with per-channel activations (`graph` and `thresholds`, ranges measured now)."""
    prologues = prologues_for(opts.hb_inputs)
    act = (
        choose_act_scale(request, graph, thresholds, qgraph, opts, notes)
        if opts.act_scale == "auto"
        else opts.act_scale
    )
    if act == "channel":
        peaks = activation_peaks(graph, calibration_feeds(request, opts))
        plan = plan_per_channel(graph, thresholds, peaks, opts.float_layers)
        channels = sum(1 for scale in plan.act.values() if np.ndim(scale) == 1)
        notes.append(f"activations per channel in {channels} of the {len(plan.act)} int8 tensors (plain QDQ form; "
                     "the graph's inputs and outputs per tensor)")  # fmt: skip
        return write_qdq(graph, plan, opts.name, prologues)
    if opts.qdq_form == "plain":
        return write_qdq(qgraph, plan_from_quantized(qgraph), opts.name, prologues)
    return write_qdq_exact(qgraph, opts.name, prologues, output_dequant="float32", note=f"npuc bpu int8; {EXACT_NOTE}")


def build_bpu(request: BuildRequest) -> BuildResult:
    """`npuc build --target bpu`: the output folder with the contract, its C header and the QDQ ONNX."""
    opts = BpuOptions.from_request(request)
    graph = split_into_slices(request.graph)  # the QDQ writers take single-output ops
    by_name = {cfg.name: cfg for cfg in opts.hb_inputs}
    unknown = sorted(set(by_name) - set(graph.inputs))
    if unknown:
        raise UserError(f"config input(s) {unknown} are not model inputs {graph.inputs}; fix input_name")
    notes: list[str] = []
    table = calibration_table(request, opts)
    thresholds = boundary_thresholds(graph, table, request.model_path, opts, notes)
    qgraph = quantize(graph, thresholds, "cv18xx_int8", opts.float_layers)
    model = quantized_model(request, graph, thresholds, qgraph, opts, notes)
    model_file = f"{opts.name}_quantized_model.onnx"
    contract = Contract(
        name=opts.name,
        march=opts.march,
        model_file=model_file,
        inputs=[_input_properties(qgraph, n, by_name.get(n), opts) for n in graph.inputs],
        outputs=[_output_properties(qgraph, n, opts) for n in graph.outputs],
        notes=[
            "the deployable .bin is made by Horizon's hb_mapper; this folder is npuc's int8 model and its I/O",
            *notes,
        ],
    )
    files = {
        CONTRACT_FILE: contract_to_json(contract),
        f"{opts.name}_hbdnn_contract.h": contract_to_header(contract),
        model_file: model.SerializeToString(deterministic=True),
    }
    atomic_write_tree(request.output, files, what="the bpu target")
    int8_ops = sum(1 for op in qgraph.ops if getattr(getattr(op.attrs, "quant", None), "mode", "") == "int8")
    return BuildResult(
        [request.output],
        {
            "int8 ops": int8_ops,
            "ops": len(qgraph.ops),
            "inputs": len(contract.inputs),
            "outputs": len(contract.outputs),
        },
        notes=list(notes),
        chip=opts.march,
        quant="int8",
    )
