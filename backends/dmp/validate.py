"""The DV700 runtime checks of a conv command (spec §1.7, the driver's CheckRaw_v0), applied at build time
and again when an artifact is loaded, so npuc never emits or runs a command the driver would refuse.

Not checked: the UBUF tile usage (`ubuf_get_single_tile_usage`), which needs the kernel driver's tiling math
(not in the spec); multi-run layers are only formed under npuc's own conservative bound (lower_concat.py).
"""

from __future__ import annotations

from collections.abc import Callable

from npuc.compiler.errors import UserError

from .layers import (
    ACT_NONE,
    ACT_PRELU,
    CONV_DEPTHWISE,
    CONV_OFF,
    MAX_RUNS,
    POOL_AVG,
    POOL_MAX,
    POOL_OFF,
    WFMT_8BIT,
    ConvConf,
    Layer,
    Run,
    kernel_wh,
    unpack2,
    unpack4,
)

MAX_KERNEL = 7
MAX_POOL_SIZES = {(2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (3, 3)}
LIMITS = {"w": 2047, "h": 1024, "z": 15, "c": 32768}

RunCheck = Callable[[ConvConf, Run, tuple[int, int, int]], str | None]
RUN_CHECKS: list[RunCheck] = []


def run_check(fn: RunCheck) -> RunCheck:
    RUN_CHECKS.append(fn)
    return fn


@run_check
def _does_something(conf: ConvConf, run: Run, dims: tuple[int, int, int]) -> str | None:
    if run.conv_enable == CONV_OFF and run.pool_enable == POOL_OFF and run.actfunc == ACT_NONE and not run.lrn & 1:
        return "does nothing (no conv, pool, activation or LRN); drop it"
    return None


@run_check
def _kernel(conf: ConvConf, run: Run, dims: tuple[int, int, int]) -> str | None:
    if run.conv_enable == CONV_OFF:
        return None
    kw, kh = kernel_wh(run.p)
    sx, sy = unpack2(run.conv_stride)
    left, right, top, bottom = unpack4(run.conv_pad)
    w, h, _ = dims
    if not (1 <= kw <= MAX_KERNEL and 1 <= kh <= MAX_KERNEL):
        return f"kernel {kw}x{kh} is outside 1..{MAX_KERNEL}; split it into smaller convs"
    if sx < 1 or sy < 1:
        return f"stride {sx}x{sy} must be at least 1"
    if run.pz < 1:
        return "kernel depth pz must be non-zero when conv is enabled"
    if w + left + right < kw or h + top + bottom < kh:
        return f"padded input {w + left + right}x{h + top + bottom} is smaller than the {kw}x{kh} kernel"
    return None


@run_check
def _depthwise(conf: ConvConf, run: Run, dims: tuple[int, int, int]) -> str | None:
    if run.conv_enable == CONV_DEPTHWISE and run.m != dims[2]:
        return f"depthwise conv needs as many outputs as inputs (m={run.m}, c={dims[2]})"
    return None


@run_check
def _pool_with_conv(conf: ConvConf, run: Run, dims: tuple[int, int, int]) -> str | None:
    if run.conv_enable != CONV_OFF and run.pool_enable not in (POOL_OFF, POOL_MAX):
        return "average pooling and upsampling need a run without conv; put them in their own run"
    return None


@run_check
def _pool_size(conf: ConvConf, run: Run, dims: tuple[int, int, int]) -> str | None:
    size = unpack2(run.pool_size)
    if run.pool_enable == POOL_MAX and size not in MAX_POOL_SIZES:
        return f"max pool {size[0]}x{size[1]} is not one of 2x1, 2x2, 2x3, 3x1, 3x2, 3x3; cascade smaller pools"
    if run.pool_enable == POOL_AVG and not all(1 <= s <= MAX_KERNEL for s in size):
        return f"average pool {size[0]}x{size[1]} is outside 1..{MAX_KERNEL}; cascade smaller pools"
    return None


@run_check
def _lrn(conf: ConvConf, run: Run, dims: tuple[int, int, int]) -> str | None:
    if not run.lrn & 1:
        return None
    if dims[2] % 16:
        return f"LRN needs a multiple of 16 channels, got {dims[2]}"
    if conf.topo != 1 or run.conv_enable != CONV_OFF or run.pool_enable != POOL_OFF:
        return "LRN must be a standalone single run (no conv or pool)"
    return None


@run_check
def _dilation(conf: ConvConf, run: Run, dims: tuple[int, int, int]) -> str | None:
    if run.conv_enable == CONV_OFF or run.conv_dilation == 0:
        return None
    kw, kh = kernel_wh(run.p)
    dx, dy = unpack2(run.conv_dilation)
    left, right, top, bottom = unpack4(run.conv_pad)
    if conf.topo != 1 or len(conf.runs) != 1:
        return "a dilated conv must be the only run of its layer"
    if run.pool_enable != POOL_OFF:
        return "a dilated conv cannot be fused with pooling"
    if kw % 2 == 0 or kh % 2 == 0:
        return f"a dilated conv needs an odd kernel, got {kw}x{kh}"
    same = (dx * (kw - 1) // 2, dy * (kh - 1) // 2)
    if (left, right) != (same[0], same[0]) or (top, bottom) != (same[1], same[1]):
        return f"a dilated conv needs 'same' padding ({same[0]}, {same[1]}), got l{left} r{right} t{top} b{bottom}"
    if run.actfunc == ACT_PRELU:
        return "a dilated conv cannot use PReLU"
    return None


@run_check
def _quantized_prelu(conf: ConvConf, run: Run, dims: tuple[int, int, int]) -> str | None:
    if run.weight_fmt == WFMT_8BIT and run.actfunc == ACT_PRELU:
        return "8-bit quantized weights cannot be combined with PReLU; store this run's weights in fp16"
    return None


def run_output_dims(run: Run, dims: tuple[int, int, int]) -> tuple[int, int, int]:
    """(W, H, C) after a run: conv, then pooling / upsampling."""
    w, h, c = dims
    if run.conv_enable != CONV_OFF:
        kw, kh = kernel_wh(run.p)
        sx, sy = unpack2(run.conv_stride)
        dx, dy = unpack2(run.conv_dilation) if run.conv_dilation else (1, 1)
        left, right, top, bottom = unpack4(run.conv_pad)
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


def check_layer(index: int, layer: Layer) -> None:
    """Raise UserError naming the layer and run if its conv command breaks a DV700 rule."""
    conf = layer.conv
    if conf is None:
        return
    where = f"DMP layer {index} '{layer.name}'"
    if conf.topo == 0:
        raise UserError(f"{where}: topo is 0, so no run writes anything; set the bit of the last run")
    if conf.z == 0:
        raise UserError(f"{where}: input depth z is 0; use 1 for 2-D tensors")
    if conf.topo.bit_length() != len(conf.runs) or len(conf.runs) > MAX_RUNS:
        raise UserError(f"{where}: topo 0x{conf.topo:x} does not match its {len(conf.runs)} runs (at most {MAX_RUNS})")
    for key, limit in LIMITS.items():
        if getattr(conf, key) > limit:
            raise UserError(f"{where}: input {key} = {getattr(conf, key)} exceeds the DV700 limit {limit}")
    for r, (run, dims) in enumerate(zip(conf.runs, run_input_dims(conf))):
        for check in RUN_CHECKS:
            problem = check(conf, run, dims)
            if problem:
                raise UserError(f"{where} run {r} ({', '.join(run.ops) or 'no ops'}): {problem}")
        out = run_output_dims(run, dims)
        if min(out) < 1:
            raise UserError(f"{where} run {r}: output size {out} is empty; check kernel, stride and padding")
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
