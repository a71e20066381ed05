"""hb_mapper-style YAML build configs (Horizon OpenExplorer; specs/dmp-lyngor-horizon.md §3.2).

The four groups model_parameters, input_parameters, calibration_parameters and compiler_parameters must all
be present (custom_op is optional). Every key is checked against the values hb_mapper documents; a bad
value is a UserError naming the file, `group.key`, the value and what is allowed. What npuc honours becomes
an `HbConfig`; every other key present is listed in `HbConfig.ignored`, one line each with the reason.

Multi-input values are `;`-separated in `input_name` order. Relative paths (onnx_model, working_dir,
cal_data_dir) are taken relative to the YAML file's folder, so a config works from any current directory.
Calibration: `default` and `kl` use npuc's KL, `max` its max, and `max` with `max_percentile` < 1 npuc's
percentile method at 100·max_percentile; `mix` runs as `default` (noted), `load` and `skip` are refused.
`per_channel: True` makes the bpu build's activation scales per channel (backends/bpu/build.py, act_scale).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from npuc.compiler.errors import UserError
from npuc.compiler.schema import check
from npuc.frontends.colorspace import (
    CHANNELS,
    TRAIN_FROM_RT,
    YUV_SPACES,
    PreprocessAffine,
    check_even_hw,
)
from npuc.frontends.colorspace import preprocess_affine as _affine
from npuc.frontends.hbconfig_schema import GROUPS, HB_CONFIG, load_yaml

OPTIONAL_GROUPS = ("custom_op",)
# marches of the Bayes family: per-node placement/int16 (node_info), no core_num, int16 outputs
BAYES_FAMILY = ("bayes", "bayes-e")
DEFAULT_CALIBRATION_TYPE = "default"  # hb_mapper's value when the key is absent
TYPES_TRAIN = ("rgb", "bgr", "yuv444", "gray", "featuremap")
TYPES_RT = ("rgb", "bgr", "yuv444", "nv12", "gray", "featuremap")
LAYOUTS = ("NHWC", "NCHW")
NORM_TYPES = ("data_mean_and_scale", "data_mean", "data_scale", "no_preprocess")
REMOVE_NODE_TYPES = ("Quantize", "Transpose", "Dequantize", "Cast", "Reshape")
RESIZER_MAX_PIXELS = 18432
OUTPUT_OPTIMIZATIONS = {
    "bernoulli2": ("set_model_output_int8",),
    "bayes": ("set_model_output_int8", "set_model_output_int16"),
    "bayes-e": ("set_model_output_int8", "set_model_output_int16"),
}
_SHAPE_RE = re.compile(r"^\d+(x\d+)*$")

NO_BIN = "npuc writes no .bin (Horizon's compiler makes it)"
# Keys npuc reads but does not act on, with the reason reported to the user.
IGNORED_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "model_parameters.layer_out_dump": "per-layer dumps: use `npuc compare` instead",
        "model_parameters.output_nodes": "npuc keeps the model's own outputs",
        "model_parameters.remove_node_type": "npuc inserts no boundary Quantize/Dequantize nodes to remove",
        "model_parameters.remove_node_name": "npuc inserts no boundary nodes to remove",
        "model_parameters.debug_mode": "calibration data dumps are not written",
        "model_parameters.node_info": "per-node BPU/CPU placement and int16 types are not modelled",
        "model_parameters.set_node_data_type": "deprecated by Horizon; per-node int16 is not modelled",
        "input_parameters.input_batch": "npuc compiles the model's batch as given",
        "calibration_parameters.cal_data_type": "read: raw sample files are this dtype; .npy/.npz keep their own",
        "calibration_parameters.preprocess_on": "npuc always decodes and resizes pictures itself",
        "calibration_parameters.run_on_cpu": "node placement is Horizon's compiler's; use --float-layers",
        "calibration_parameters.run_on_bpu": "node placement is Horizon's compiler's",
        "calibration_parameters.optimization": "npuc's outputs follow --quant-output",
        "compiler_parameters.*": NO_BIN,
        "custom_op.*": "custom operators are not supported by npuc",
    }
)


@dataclass(frozen=True)
class InputConfig:
    """One model input as the config describes it (shape None: take the model's)."""

    name: str | None
    type_train: str
    layout_train: str
    type_rt: str
    layout_rt: str | None
    space: str
    shape: tuple[int, ...] | None
    norm_type: str
    mean: tuple[float, ...] | None
    scale: tuple[float, ...] | None

    @property
    def is_image(self) -> bool:
        return self.type_rt != "featuremap"

    def affine(self) -> PreprocessAffine | None:
        """The HzPreprocess chain (int8 runtime pixel -> model value); None for a featuremap."""
        if not self.is_image:
            return None
        return _affine(self.type_rt, self.type_train, self.norm_type, self.mean, self.scale, self.space)


@dataclass(frozen=True)
class HbConfig:
    """What npuc honours from an hb_mapper YAML, plus one line per key it ignores."""

    source: Path
    model: Path
    march: str
    output_prefix: str
    working_dir: Path
    inputs: tuple[InputConfig, ...]
    cal_data_dir: Path | None
    calibration_type: str
    max_percentile: float = 1.0
    cal_data_type: str | None = None  # dtype of raw sample files (hb_mapper's float32 / uint8 .bin/.rgb)
    per_channel: bool = False  # activation scales per channel (the bpu target's act_scale=channel)
    ignored: tuple[str, ...] = field(default_factory=tuple)

    @property
    def calib_method(self) -> tuple[str, float]:
        """npuc's calibration method and percentile (see the module docstring)."""
        if self.calibration_type == "max" and self.max_percentile < 1.0:
            return "percentile", 100.0 * self.max_percentile
        return ("max" if self.calibration_type == "max" else "kl"), 99.99

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes the config pins, by input name (for the ONNX frontend)."""
        return {i.name: i.shape for i in self.inputs if i.name is not None and i.shape is not None}

    def bind(self, model_inputs: Mapping[str, tuple[int, ...]]) -> HbConfig:
        """Fill names/shapes from the model and check the config against it (layout, channels, even H/W)."""
        names = list(model_inputs)
        if len(self.inputs) != len(names):
            raise _err(
                self.source,
                "input_parameters.input_name",
                f"describes {len(self.inputs)} input(s) but the model has {len(names)} ({', '.join(names)})",
                "give one ';'-separated value per model input",
            )
        bound = []
        for spec, model_name in zip(self.inputs, names, strict=True):
            name = spec.name or model_name
            if name not in model_inputs:
                raise _err(self.source, "input_parameters.input_name", f"{name!r} is not a model input", f"use {names}")
            shape = spec.shape or tuple(model_inputs[name])
            _check_layout(self.source, name, spec, shape)
            bound.append(InputConfig(**{**spec.__dict__, "name": name, "shape": tuple(shape)}))
        return HbConfig(**{**self.__dict__, "inputs": tuple(bound)})


# ---------------------------------------------------------------------------------------------------------
# Reading


def _err(source: Path, key: str, problem: str, fix: str) -> UserError:
    return UserError(f"{source}: {key}: {problem}; {fix}")


def load_config(path: str | Path) -> HbConfig:
    """Read and validate an hb_mapper YAML config."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}; check the --config path")
    return parse_config(load_yaml(path), path)


def parse_config(data: Any, source: Path) -> HbConfig:
    """Validate parsed YAML (a mapping of the four groups) into an HbConfig."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: the config must be a mapping of {', '.join(GROUPS)}; see hb_mapper's template")
    for group in GROUPS:
        if group not in data:
            raise _err(source, group, "group is missing", "all four groups must be present (values may be empty)")
    check(data, HB_CONFIG, str(source), "see hb_mapper's config template for the allowed values", UserError)
    ignored: list[str] = []
    for group in data:
        if group not in GROUPS + OPTIONAL_GROUPS:
            ignored.append(f"{group}: unknown group, ignored")
    groups = {g: _group(data, g, source) for g in GROUPS + OPTIONAL_GROUPS}
    base = source.parent
    model = _model_parameters(groups["model_parameters"], source, base, ignored)
    inputs = _input_parameters(groups["input_parameters"], source, model["march"], ignored)
    cal = _calibration_parameters(groups["calibration_parameters"], source, base, model["march"], ignored)
    _compiler_parameters(groups["compiler_parameters"], source, model["march"], inputs, ignored)
    _custom_op(groups["custom_op"], source, ignored)
    return HbConfig(
        source=source,
        model=model["model"],
        march=model["march"],
        output_prefix=model["prefix"],
        working_dir=model["working_dir"],
        inputs=inputs,
        cal_data_dir=cal["dir"],
        calibration_type=cal["type"],
        max_percentile=cal["max_percentile"],
        cal_data_type=cal["data_type"],
        per_channel=cal["per_channel"],
        ignored=tuple(ignored),
    )


def _group(data: dict, group: str, source: Path) -> dict:
    return data.get(group) or {}  # a mapping or empty: the schema checked it


# ---------------------------------------------------------------------------------------------------------
# Value checks (each names the key and the allowed values)


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _choice(source: Path, key: str, value: Any, allowed: tuple[str, ...]) -> str:
    text = _text(value)
    if text not in allowed:
        raise _err(source, key, f"{text!r} is not allowed", f"use one of {', '.join(allowed)}")
    return text


def _required(group: dict, name: str, source: Path, key: str) -> Any:
    if _text(group.get(name)) == "":
        raise _err(source, key, "is required", "set it (see hb_mapper's config template)")
    return group[name]


def _bool(value: Any) -> bool:
    """A boolean the schema admitted (true/false or their spellings as text)."""
    return value if isinstance(value, bool) else _text(value).lower() == "true"


def _split(value: Any) -> list[str]:
    return [part.strip() for part in _text(value).split(";")]


def _per_input(group: dict, name: str, count: int, source: Path) -> list[str] | None:
    """A `;`-separated value with one entry per input (a single entry applies to a single input)."""
    if _text(group.get(name)) == "":
        return None
    parts = _split(group[name])
    if len(parts) != count:
        raise _err(
            source,
            f"input_parameters.{name}",
            f"has {len(parts)} ';'-separated value(s) for {count} input(s)",
            "give one value per input, in input_name order",
        )
    return parts


def _shape(source: Path, key: str, text: str) -> tuple[int, ...]:
    if not _SHAPE_RE.match(text) or any(int(d) < 1 for d in text.split("x")):
        raise _err(source, key, f"{text!r} is not a shape", "write positive sizes joined by x, e.g. 1x3x224x224")
    return tuple(int(d) for d in text.split("x"))


def _numbers(source: Path, key: str, text: str) -> tuple[float, ...] | None:
    if text in ("", "None"):
        return None
    try:
        values = tuple(float(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise _err(source, key, f"{text!r} is not a list of numbers", "write one number or one per channel") from None
    if not values or any(v != v or v in (float("inf"), float("-inf")) for v in values):
        raise _err(source, key, f"{text!r} has no finite number", "write one number or one per channel")
    return values


# ---------------------------------------------------------------------------------------------------------
# The groups


def _note_ignored(group_name: str, group: dict, honoured: tuple[str, ...], ignored: list[str]) -> None:
    for key in group:
        if key in honoured:
            continue
        full = f"{group_name}.{key}"
        reason = IGNORED_REASONS.get(full) or IGNORED_REASONS.get(f"{group_name}.*") or "unknown key"
        ignored.append(f"{full}: {reason}, ignored")


def _model_parameters(g: dict, source: Path, base: Path, ignored: list[str]) -> dict[str, Any]:
    key = "model_parameters"
    has_onnx, has_caffe = _text(g.get("onnx_model")) != "", _text(g.get("caffe_model")) != ""
    if has_onnx and has_caffe:
        raise _err(source, f"{key}.onnx_model", "both onnx_model and caffe_model are set", "give exactly one model")
    if has_caffe:
        if _text(g.get("prototxt")) == "":
            raise _err(source, f"{key}.prototxt", "caffe_model needs prototxt", "set prototxt to the .prototxt file")
        raise _err(source, f"{key}.caffe_model", "Caffe models are not supported by npuc", "convert it to ONNX")
    if not has_onnx:
        raise _err(source, f"{key}.onnx_model", "is required (no model given)", "set onnx_model to the .onnx file")
    march = _text(_required(g, "march", source, f"{key}.march"))
    prefix = _text(_required(g, "output_model_file_prefix", source, f"{key}.output_model_file_prefix"))
    if "/" in prefix or "\\" in prefix:
        raise _err(source, f"{key}.output_model_file_prefix", f"{prefix!r} has a path separator", "use working_dir")
    working_dir = base / _text(g.get("working_dir") or "model_output")
    if _text(g.get("remove_node_type")) != "":
        for part in _split(g["remove_node_type"]):
            _choice(source, f"{key}.remove_node_type", part, REMOVE_NODE_TYPES)
    for bayes_only in ("node_info", "set_node_data_type"):
        empty = g.get(bayes_only) in ({}, "", None)
        if bayes_only in g and not empty and march not in BAYES_FAMILY:
            raise _err(
                source, f"{key}.{bayes_only}", f"is for marches {', '.join(BAYES_FAMILY)}, not {march}", "remove it"
            )
    honoured = ("onnx_model", "march", "output_model_file_prefix", "working_dir", "caffe_model", "prototxt")
    _note_ignored(key, g, honoured, ignored)
    return {"model": base / _text(g["onnx_model"]), "march": march, "prefix": prefix, "working_dir": working_dir}


def _input_parameters(g: dict, source: Path, march: str, ignored: list[str]) -> tuple[InputConfig, ...]:
    key = "input_parameters"
    names = _split(g["input_name"]) if _text(g.get("input_name")) != "" else [None]
    count = len(names)
    train = _per_input(g, "input_type_train", count, source)
    layout_train = _per_input(g, "input_layout_train", count, source)
    rt = _per_input(g, "input_type_rt", count, source)
    norm = _per_input(g, "norm_type", count, source)
    for name, values in (("input_type_train", train), ("input_layout_train", layout_train), ("input_type_rt", rt)):
        if values is None:
            raise _err(source, f"{key}.{name}", "is required", "set it for every input")
    if norm is None:
        raise _err(source, f"{key}.norm_type", "is required", f"use one of {', '.join(NORM_TYPES)}")
    layout_rt = _per_input(g, "input_layout_rt", count, source) or [None] * count
    spaces = _per_input(g, "input_space_and_range", count, source) or [None] * count
    shapes = _per_input(g, "input_shape", count, source) or [None] * count
    means = _per_input(g, "mean_value", count, source) or [""] * count
    scales = _per_input(g, "scale_value", count, source) or [""] * count
    if "input_batch" in g and count > 1:
        raise _err(source, f"{key}.input_batch", "is for single-input models only", "remove it")
    inputs = []
    for i in range(count):
        tag = f" (input {i})" if count > 1 else ""
        t_train = _choice(source, f"{key}.input_type_train{tag}", train[i], TYPES_TRAIN)
        t_rt = _choice(source, f"{key}.input_type_rt{tag}", rt[i], TYPES_RT)
        if t_rt not in TRAIN_FROM_RT[t_train]:
            raise _err(
                source,
                f"{key}.input_type_rt{tag}",
                f"{t_rt} cannot feed input_type_train {t_train}",
                f"allowed for {t_train}: {', '.join(TRAIN_FROM_RT[t_train])}",
            )
        l_train = _choice(source, f"{key}.input_layout_train{tag}", layout_train[i], LAYOUTS)
        l_rt = (
            None
            if layout_rt[i] in (None, "")
            else _choice(source, f"{key}.input_layout_rt{tag}", layout_rt[i], LAYOUTS)
        )
        if march == "bernoulli2" and t_rt == "yuv444" and l_rt == "NCHW":
            raise _err(
                source, f"{key}.input_layout_rt{tag}", "X3 (bernoulli2) does not take yuv444 as NCHW", "use NHWC"
            )
        space = "regular"
        if spaces[i] not in (None, ""):
            space = _choice(source, f"{key}.input_space_and_range{tag}", spaces[i], tuple(YUV_SPACES))
            if t_rt != "nv12":
                raise _err(
                    source, f"{key}.input_space_and_range{tag}", f"applies to nv12 only, not {t_rt}", "remove it"
                )
        shape = None if shapes[i] in (None, "") else _shape(source, f"{key}.input_shape{tag}", shapes[i])
        n_type = _choice(source, f"{key}.norm_type{tag}", norm[i], NORM_TYPES)
        mean = _numbers(source, f"{key}.mean_value{tag}", means[i])
        scale = _numbers(source, f"{key}.scale_value{tag}", scales[i])
        if n_type in ("data_mean_and_scale", "data_mean") and mean is None:
            raise _err(source, f"{key}.mean_value{tag}", f"is required by norm_type {n_type}", "give the mean(s)")
        if n_type in ("data_mean_and_scale", "data_scale") and scale is None:
            raise _err(source, f"{key}.scale_value{tag}", f"is required by norm_type {n_type}", "give the scale(s)")
        channels = CHANNELS.get(t_train, 0)
        for label, values in (("mean_value", mean), ("scale_value", scale)):
            if values is not None and len(values) not in (1, channels):
                raise _err(
                    source,
                    f"{key}.{label}{tag}",
                    f"has {len(values)} values for a {channels}-channel {t_train} input",
                    f"give 1 or {channels} values separated by spaces",
                )
        inputs.append(InputConfig(names[i], t_train, l_train, t_rt, l_rt, space, shape, n_type, mean, scale))
    honoured = (
        "input_name", "input_type_train", "input_layout_train", "input_type_rt", "input_layout_rt",
        "input_space_and_range", "input_shape", "norm_type", "mean_value", "scale_value",
    )  # fmt: skip
    _note_ignored(key, g, honoured, ignored)
    return tuple(inputs)


def _check_layout(source: Path, name: str, spec: InputConfig, shape: tuple[int, ...]) -> None:
    key = "input_parameters.input_layout_train"
    if spec.type_train == "featuremap":
        return
    if len(shape) != 4:
        raise _err(source, key, f"input {name!r} has shape {shape}, not 4-D", "image inputs must be N,C,H,W or N,H,W,C")
    c_axis, h_axis, w_axis = (1, 2, 3) if spec.layout_train == "NCHW" else (3, 1, 2)
    if shape[c_axis] != CHANNELS[spec.type_train]:
        raise _err(
            source,
            key,
            f"{spec.layout_train} puts {shape[c_axis]} channels on input {name!r} {shape}, but "
            f"{spec.type_train} has {CHANNELS[spec.type_train]}",
            "set the layout the model was trained with",
        )
    if spec.type_rt in ("nv12", "yuv444"):
        check_even_hw(name, shape[h_axis], shape[w_axis], spec.type_rt)


def _calibration_parameters(g: dict, source: Path, base: Path, march: str, ignored: list[str]) -> dict[str, Any]:
    key = "calibration_parameters"
    ctype = _text(g.get("calibration_type")) or DEFAULT_CALIBRATION_TYPE
    if ctype == "load":
        raise _err(
            source, f"{key}.calibration_type", "load (a QAT model's ranges) is not supported", "use default, kl or max"
        )
    if ctype == "skip":
        raise _err(
            source,
            f"{key}.calibration_type",
            "skip (random data, for speed tests) is not supported",
            "use default, kl or max",
        )
    if ctype == "mix":
        ignored.append(f"{key}.calibration_type: mix search is not implemented, calibrating as default (kl)")
    percentile = 1.0
    if "max_percentile" in g:
        if ctype != "max":
            raise _err(
                source, f"{key}.max_percentile", f"applies to calibration_type max only, not {ctype}", "remove it"
            )
        percentile = float(g["max_percentile"])
        if percentile <= 0.0:
            raise _err(source, f"{key}.max_percentile", "0 clips every value", "use a value such as 0.99999")
    cal_type = _text(g.get("cal_data_type")) or None
    per_channel = "per_channel" in g and _bool(g["per_channel"])
    if per_channel and ctype == "default":
        raise _err(source, f"{key}.per_channel", "is not available with calibration_type default", "use kl or max")
    if _text(g.get("optimization")) != "":
        allowed = OUTPUT_OPTIMIZATIONS[march]
        for part in _split(g["optimization"]):
            _choice(source, f"{key}.optimization", part, allowed)
    cal_dir = None if _text(g.get("cal_data_dir")) == "" else base / _text(g["cal_data_dir"])
    honoured = ("cal_data_dir", "calibration_type", "max_percentile", "cal_data_type", "per_channel")
    _note_ignored(key, g, honoured, ignored)
    return {
        "type": ctype,
        "max_percentile": percentile,
        "dir": cal_dir,
        "data_type": cal_type,
        "per_channel": per_channel,
    }


def _compiler_parameters(
    g: dict, source: Path, march: str, inputs: tuple[InputConfig, ...], ignored: list[str]
) -> None:
    key = "compiler_parameters"
    for name in ("compile_mode", "optimize_level"):
        _required(g, name, source, f"{key}.{name}")
    if "core_num" in g and march in BAYES_FAMILY:
        raise _err(source, f"{key}.core_num", f"must not be set for march {march}", "remove it")
    if "input_source" in g:
        _input_source(g["input_source"], source, inputs)
    _note_ignored(key, g, (), ignored)


def _input_source(value: Any, source: Path, inputs: tuple[InputConfig, ...]) -> None:
    key = "compiler_parameters.input_source"
    names = [i.name for i in inputs]
    for name, where in value.items():
        spec = next((i for i in inputs if i.name == name or (i.name is None and len(inputs) == 1)), None)
        if spec is None:
            raise _err(source, f"{key}.{name}", "is not an input_name", f"use one of {names}")
        if where == "resizer" and spec.shape is not None and len(spec.shape) == 4:
            h, w = (spec.shape[2], spec.shape[3]) if spec.layout_train == "NCHW" else spec.shape[1:3]
            if h * w >= RESIZER_MAX_PIXELS:
                raise _err(
                    source,
                    f"{key}.{name}",
                    f"resizer needs h*w < {RESIZER_MAX_PIXELS}, got {h}x{w}",
                    "use ddr or pyramid",
                )


def _custom_op(g: dict, source: Path, ignored: list[str]) -> None:
    _note_ignored("custom_op", g, (), ignored)
