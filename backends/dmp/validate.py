"""The DV700 runtime checks of a conv command (spec §1.7: the user driver's CheckRaw_v0, plus the kernel
driver's unified-buffer check), applied at build time and again when an artifact is loaded, so npuc never
emits or runs a command the driver would refuse. Each rule is one registered function returning a problem
sentence or None; `check_layer` raises it as a UserError naming the layer, the run and the field.

The checks depend on the device (`Hardware`): the unified buffer size, the largest kernel and the bitstream's
`svn_version` (non-square pooling, deconvolution and wide dilated padding need >= 93; the public kernel driver
reports 93). Target options `ub_size` and `svn_version` override the DV700 defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from npuc.compiler.errors import UserError
from npuc.compiler.targets import int_option

from .layers import (
    ACT_NONE,
    ACT_PRELU,
    CONV_DECONV_BIT,
    CONV_DEPTHWISE,
    CONV_OFF,
    MAX_RUNS,
    POOL_AVG,
    POOL_MAX,
    POOL_OFF,
    POOL_UPSAMPLE,
    WFMT_8BIT,
    ConvConf,
    Layer,
    Run,
    kernel_wh,
    unpack2,
    unpack4,
)
from .ubuf import run_tiles, single_tile_usage

MAX_KERNEL = 7
MAX_POOL_SIZES = {(2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (3, 3)}
LIMITS = {"w": 2047, "h": 1024, "z": 15, "c": 32768}
POOL_MODES = (POOL_OFF, POOL_MAX, POOL_AVG, POOL_UPSAMPLE)
SVN_NEW_FEATURES = 93  # bitstream revision with non-square pooling, deconvolution, wide dilated padding
BUF_ALIGN = 16  # dmp_dv_buf offsets must be 16-byte aligned


@dataclass(frozen=True)
class Hardware:
    """The device limits the driver checks against (dmp_dv_info / sysfs)."""

    ub_size: int = 640 * 1024
    max_kernel_size: int = MAX_KERNEL
    svn_version: int = SVN_NEW_FEATURES


HARDWARE_OPTIONS = {"ub_size": (1024, 1 << 24), "svn_version": (0, 1 << 16)}


def hardware_from_options(options: dict[str, Any]) -> Hardware:
    """The Hardware described by target options `ub_size` (bytes) and `svn_version` (DV700 defaults)."""
    defaults = asdict(Hardware())
    return Hardware(
        **{key: int_option(options, key, defaults[key], lo, hi) for key, (lo, hi) in HARDWARE_OPTIONS.items()}
    )


@dataclass(frozen=True)
class RunView:
    """What a run check sees: the command, the run's index and input (W, H, C), and the device."""

    conf: ConvConf
    index: int
    dims: tuple[int, int, int]
    hw: Hardware

    @property
    def run(self) -> Run:
        return self.conf.runs[self.index]


RunCheck = Callable[[RunView], str | None]
RUN_CHECKS: list[RunCheck] = []


def run_check(fn: RunCheck) -> RunCheck:
    RUN_CHECKS.append(fn)
    return fn


def _conv_pads(run: Run) -> tuple[int, int, int, int]:
    return unpack4(run.conv_pad)


@run_check
def _does_something(v: RunView) -> str | None:
    run = v.run
    if run.conv_enable == CONV_OFF and run.pool_enable == POOL_OFF and run.actfunc == ACT_NONE and not run.lrn & 1:
        return "does nothing (no conv, pool, activation or LRN); drop it"
    return None


@run_check
def _kernel(v: RunView) -> str | None:
    run = v.run
    if run.conv_enable == CONV_OFF:
        return None
    kw, kh = kernel_wh(run.p)
    sx, sy = unpack2(run.conv_stride)
    left, right, top, bottom = _conv_pads(run)
    w, h, _ = v.dims
    if run.conv_enable & CONV_DECONV_BIT:
        w, h = (w - 1) * max(sx, 1) + 1, (h - 1) * max(sy, 1) + 1
    limit = v.hw.max_kernel_size
    if not (1 <= kw <= limit and 1 <= kh <= limit):
        return f"p: kernel {kw}x{kh} is outside 1..{limit}; split it into smaller convs"
    if sx < 1 or sy < 1:
        return f"conv_stride: stride {sx}x{sy} must be at least 1"
    if run.pz < 1:
        return "pz: kernel depth must be non-zero when conv is enabled"
    if w + left + right < kw or h + top + bottom < kh:
        return f"conv_pad: padded input {w + left + right}x{h + top + bottom} is smaller than the {kw}x{kh} kernel"
    return None


@run_check
def _pad_fields(v: RunView) -> str | None:
    for name in ("conv_pad", "pool_pad"):
        left, _, top, _ = unpack4(getattr(v.run, name))
        if left > 0x7F or top > 0x7F:
            return f"{name}: left {left} / top {top} exceed the 7-bit fields the driver reads (max 127)"
    return None


@run_check
def _depthwise(v: RunView) -> str | None:
    if v.run.conv_enable == CONV_DEPTHWISE and v.run.m != v.dims[2]:
        return f"m: depthwise conv needs as many outputs as inputs (m={v.run.m}, c={v.dims[2]})"
    return None


@run_check
def _pool_mode(v: RunView) -> str | None:
    if v.run.pool_enable not in POOL_MODES:
        return f"pool_enable={v.run.pool_enable} is not 0 (off), 1 (max), 2 (average) or 4 (upsampling)"
    if v.run.conv_enable != CONV_OFF and v.run.pool_enable not in (POOL_OFF, POOL_MAX):
        return "pool_enable: average pooling and upsampling need a run without conv; put them in their own run"
    return None


@run_check
def _pool_window(v: RunView) -> str | None:
    run = v.run
    if run.pool_enable not in (POOL_MAX, POOL_AVG):
        return None
    kw, kh = unpack2(run.pool_size)
    sx, sy = unpack2(run.pool_stride)
    left, right, top, bottom = unpack4(run.pool_pad)
    w, h, _ = v.dims
    limit = v.hw.max_kernel_size
    if run.pool_enable == POOL_MAX and (kw, kh) not in MAX_POOL_SIZES:
        return f"pool_size: max pool {kw}x{kh} is not one of 2x1, 2x2, 2x3, 3x1, 3x2, 3x3; cascade smaller pools"
    if run.pool_enable == POOL_AVG and not (1 <= kw <= limit and 1 <= kh <= limit):
        return f"pool_size: average pool {kw}x{kh} is outside 1..{limit}; cascade smaller pools"
    if sx < 1 or sy < 1:
        return f"pool_stride: stride {sx}x{sy} must be at least 1"
    if w + left + right < kw or h + top + bottom < kh:
        return f"pool_pad: padded input {w + left + right}x{h + top + bottom} is smaller than the {kw}x{kh} pool"
    if kw != kh and v.hw.svn_version < SVN_NEW_FEATURES:
        return (
            f"pool_size: non-square pooling {kw}x{kh} needs svn_version >= {SVN_NEW_FEATURES} "
            f"(device has {v.hw.svn_version}); use a square window"
        )
    return None


@run_check
def _deconv(v: RunView) -> str | None:
    if not v.run.conv_enable & CONV_DECONV_BIT:
        return None
    if v.hw.svn_version < SVN_NEW_FEATURES:
        return (
            f"conv_enable={v.run.conv_enable}: deconvolution needs svn_version >= {SVN_NEW_FEATURES} "
            f"(device has {v.hw.svn_version})"
        )
    if v.run.conv_dilation and unpack2(v.run.conv_stride) != (1, 1) and max(unpack2(v.run.conv_dilation)) > 1:
        return "conv_stride: a dilated deconvolution needs stride 1"
    return None


@run_check
def _lrn(v: RunView) -> str | None:
    run = v.run
    if not run.lrn & 1:
        return None
    if v.dims[2] % 16:
        return f"lrn: LRN needs a multiple of 16 channels, got {v.dims[2]}"
    if v.conf.topo != 1 or run.conv_enable != CONV_OFF or run.pool_enable != POOL_OFF:
        return "lrn: LRN must be a standalone single run (no conv or pool)"
    return None


@run_check
def _dilation(v: RunView) -> str | None:
    run = v.run
    if run.conv_enable == CONV_OFF or max(unpack2(run.conv_dilation)) <= 1:
        return None
    kw, kh = kernel_wh(run.p)
    dx, dy = (max(d, 1) for d in unpack2(run.conv_dilation))
    sx, sy = unpack2(run.conv_stride)
    left, right, top, bottom = _conv_pads(run)
    w, h, _ = v.dims
    span_x, span_y = (kw - 1) * dx + 1, (kh - 1) * dy + 1
    if v.conf.topo != 1:
        return "conv_dilation: a dilated conv must be the only run of its layer"
    if run.pool_enable != POOL_OFF:
        return "conv_dilation: a dilated conv cannot be fused with pooling"
    if kw % 2 == 0 or kh % 2 == 0:
        return f"p: a dilated conv needs an odd kernel, got {kw}x{kh}"
    if w + left + right < span_x or h + top + bottom < span_y:
        padded = f"{w + left + right}x{h + top + bottom}"
        return f"conv_pad: padded input {padded} is smaller than the dilated {span_x}x{span_y} kernel"
    if v.hw.svn_version < SVN_NEW_FEATURES and (max(left, right) > w or max(top, bottom) > h):
        return (
            f"conv_pad: pads l{left} r{right} t{top} b{bottom} exceed the {w}x{h} input, which needs "
            f"svn_version >= {SVN_NEW_FEATURES} (device has {v.hw.svn_version})"
        )
    if sx < 1 or sy < 1:
        return None  # reported by the kernel rule
    deconv = bool(run.conv_enable & CONV_DECONV_BIT)
    ox = (left + ((w - 1) * sx + 1 if deconv else w) + right - span_x) // (1 if deconv else sx) + 1
    oy = (top + ((h - 1) * sy + 1 if deconv else h) + bottom - span_y) // (1 if deconv else sy) + 1
    if ox * sx != w or oy * sy != h:
        pads = f"l{left} r{right} t{top} b{bottom}"
        return f"conv_pad: a dilated conv needs 'same' padding, but {pads} give {ox}x{oy} from {w}x{h}"
    if run.actfunc == ACT_PRELU:
        return "actfunc: a dilated conv cannot use PReLU"
    return None


@run_check
def _quantized_prelu(v: RunView) -> str | None:
    if v.run.conv_enable != CONV_OFF and v.run.weight_fmt == WFMT_8BIT and v.run.actfunc == ACT_PRELU:
        return "weight_fmt: 8-bit quantized weights cannot be combined with PReLU; store this run's weights in fp16"
    return None


@run_check
def _tiles(v: RunView) -> str | None:
    tiles = run_tiles(v.run, v.dims, v.hw.ub_size)
    w, h, c = v.dims
    if tiles.count == 0:
        return (
            f"ub_size: {w}x{h}x{c} input does not fit the {v.hw.ub_size}-byte unified buffer even in {w} tiles "
            f"(needs {tiles.in_bytes + tiles.out_bytes} bytes); reduce the channels or split the layer"
        )
    if tiles.count > 1 and not v.conf.topo >> v.index & 1:
        return (
            f"topo: the output stays in the unified buffer but the run needs {tiles.count} tiles (only 1 allowed); "
            "write it to memory (a layer of its own)"
        )
    return None


def run_output_dims(run: Run, dims: tuple[int, int, int]) -> tuple[int, int, int]:
    """(W, H, C) after a run: conv, then pooling / upsampling."""
    w, h, c = dims
    if run.conv_enable != CONV_OFF:
        kw, kh = kernel_wh(run.p)
        sx, sy = unpack2(run.conv_stride)
        dx, dy = unpack2(run.conv_dilation) if run.conv_dilation else (1, 1)
        left, right, top, bottom = unpack4(run.conv_pad)
        if run.conv_enable & CONV_DECONV_BIT:  # the input spread by the stride, then a stride-1 conv
            w, h, sx, sy = (w - 1) * sx + 1, (h - 1) * sy + 1, 1, 1
        w = (w + left + right - ((kw - 1) * dx + 1)) // sx + 1
        h = (h + top + bottom - ((kh - 1) * dy + 1)) // sy + 1
        c = run.m
    if run.pool_enable in (POOL_MAX, POOL_AVG):
        kw, kh = unpack2(run.pool_size)
        sx, sy = unpack2(run.pool_stride)
        left, right, top, bottom = unpack4(run.pool_pad)
        w = (w + left + right - kw) // sx + 1
        h = (h + top + bottom - kh) // sy + 1
    elif run.pool_enable != POOL_OFF:
        w, h = 2 * w, 2 * h
    return w, h, c


LayerCheck = Callable[[Layer, ConvConf, Hardware], str | None]
LAYER_CHECKS: dict[str, list[LayerCheck]] = {"before_runs": [], "after_runs": []}


def layer_check(stage: str) -> Callable[[LayerCheck], LayerCheck]:
    """Register a whole-command check, run before the per-run checks (structure) or after them."""

    def register(fn: LayerCheck) -> LayerCheck:
        LAYER_CHECKS[stage].append(fn)
        return fn

    return register


@layer_check("before_runs")
def _topo(layer: Layer, conf: ConvConf, hw: Hardware) -> str | None:
    if conf.topo == 0:
        return "topo is 0, so no run writes anything; set the bit of the last run"
    if conf.z == 0:
        return "z: input depth z is 0; use 1 for 2-D tensors"
    if conf.topo.bit_length() != len(conf.runs) or len(conf.runs) > MAX_RUNS:
        return f"topo 0x{conf.topo:x} does not match its {len(conf.runs)} runs (at most {MAX_RUNS})"
    return None


@layer_check("before_runs")
def _limits(layer: Layer, conf: ConvConf, hw: Hardware) -> str | None:
    for key, limit in LIMITS.items():
        if getattr(conf, key) > limit:
            return f"{key}: input {key} = {getattr(conf, key)} exceeds the DV700 limit {limit}"
    return None


@layer_check("after_runs")
def _aligned(layer: Layer, conf: ConvConf, hw: Hardware) -> str | None:
    offsets = {"input_buf": layer.input_offs, "output_buf": layer.output_offs, "eltwise_buf": conf.eltwise_offs}
    offsets.update({f"run[{r}].weight_buf": run.weight_offs for r, run in enumerate(conf.runs)})
    offsets["u8tofp16_table"] = conf.u8tofp16_offs
    for name, offs in offsets.items():
        if offs is not None and offs % BUF_ALIGN:
            return f"{name}.offs = {offs} is not {BUF_ALIGN}-byte aligned"
    return None


@layer_check("after_runs")
def _multi_run(layer: Layer, conf: ConvConf, hw: Hardware) -> str | None:
    if conf.topo == 1:
        return None
    if conf.z > 1 or any(run.pz > 1 for run in conf.runs):
        return f"topo 0x{conf.topo:x}: a command with depth (z={conf.z} or pz > 1) cannot have multiple runs"
    used = single_tile_usage(conf, hw.ub_size)
    if used > hw.ub_size:
        return (
            f"ub_size: its {len(conf.runs)} runs need {used} bytes of unified buffer in one tile, more than the "
            f"{hw.ub_size} available; split the runs into separate layers"
        )
    return None


def check_layer(index: int, layer: Layer, hw: Hardware = Hardware()) -> None:
    """Raise UserError naming the layer, run and field if its conv command breaks a DV700 driver rule."""
    conf = layer.conv
    if conf is None:
        return
    where = f"DMP layer {index} '{layer.name}'"
    for check in LAYER_CHECKS["before_runs"]:
        problem = check(layer, conf, hw)
        if problem:
            raise UserError(f"{where}: {problem}")
    for r, dims in enumerate(run_input_dims(conf)):
        view = RunView(conf, r, dims, hw)
        for check in RUN_CHECKS:
            problem = check(view)
            if problem:
                raise UserError(f"{where} run {r} ({', '.join(conf.runs[r].ops) or 'no ops'}): {problem}")
        out = run_output_dims(conf.runs[r], dims)
        if min(out) < 1:
            raise UserError(f"{where} run {r}: output size {out} is empty; check kernel, stride and padding")
    for check in LAYER_CHECKS["after_runs"]:
        problem = check(layer, conf, hw)
        if problem:
            raise UserError(f"{where}: {problem}")
    branches = branch_output_dims(conf)
    if len({b[:2] for b in branches}) != 1:
        raise UserError(f"{where}: its branches end in different sizes {branches}; concat needs equal W and H")
    if any(b[2] % 8 for b in branches[:-1]):
        raise UserError(
            f"{where}: branch channels {[b[2] for b in branches]} are not multiples of 8 before the last, so the "
            "branches cannot be written side by side in the FPGA layout"
        )


def run_input_dims(conf: ConvConf) -> list[tuple[int, int, int]]:
    """(W, H, C) each run reads: the previous run's output through the UBUF, or the layer input again after
    a run whose topo bit sends its output to memory (the start of the next branch)."""
    dims, out = (conf.w, conf.h, conf.c), []
    for r, run in enumerate(conf.runs):
        out.append(dims)
        dims = (conf.w, conf.h, conf.c) if conf.topo >> r & 1 else run_output_dims(run, dims)
    return out


def branch_output_dims(conf: ConvConf) -> list[tuple[int, int, int]]:
    """(W, H, C) written to memory by each run whose topo bit is set, in run order."""
    return [
        run_output_dims(run, dims)
        for r, (run, dims) in enumerate(zip(conf.runs, run_input_dims(conf)))
        if conf.topo >> r & 1
    ]


def layer_output_dims(conf: ConvConf) -> tuple[int, int, int]:
    """The layer's output: its branches side by side along channels (one branch for a plain layer)."""
    branches = branch_output_dims(conf)
    return branches[0][0], branches[0][1], sum(b[2] for b in branches)
