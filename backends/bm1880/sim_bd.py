"""BM1880 BD (TIU) descriptors executed on simulated local memory with the chip's integer semantics.

Operands live in the 32 NPU lanes (channel c in lane c % 32, see specs/bm1880.md §2.2). Each BD names its
operands res0 (result), opd0, opd1, opd2 with an address, an n/c/h/w shape and a stride mode
`short_<x>_str`: 0 = default EU-aligned strides, 1 and 2 = default packed strides (2 is what the vendor
uses for the 16-bit bias planes), 3 = the explicit `<x>_{n,c,h,w}_str` fields. A 16-bit operand is two
8-bit planes, the high plane one n-block above the low one. A constant operand (`opt_opdX_const`) is the
low byte of its address field.

Arithmetic (specs/bm1880.md §3.2, BMKernel guide ch.4): int64 accumulation, 16-bit bias, optional ReLU,
right shift (`opt_rshift_typ` 1 rounds half up, 0 truncates), saturation to the result format. Decoded
from production cmdbufs: conv (tsk_typ 0), max pool (1/eu 0), depthwise conv (1/eu 2), tensor arithmetic
(3). npuc's own conventions, not observed in vendor files: average pool (1/eu 1: window sum times the
opd1 constant, shifted) and fully-connected (2: opd0 (N,K) x opd1 (K,C) read as n x (c·h·w) matrices).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npuc.backends.cv18xx.sim_mem import LocalMemory
from npuc.compiler.errors import CorruptFileError, UnsupportedError

from . import isa

MAX_ELEMENTS = 1 << 22  # no operand in 32 x 64 KiB of lmem has more; bounds index arrays for damaged files
MAX_MACS = 1 << 32  # work bound per descriptor (a real BM1880 layer slice is far below)
MAX_TAPS = 1 << 14  # kernel positions per descriptor (a global pool over a 128x128 map; one slice each)
MAX_TAP_ELEMENTS = 1 << 28  # input elements gathered over all kernel positions of one descriptor


@dataclass(frozen=True)
class Operand:
    """Where one BD operand lives and how to read it."""

    name: str
    addr: int
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    signed: bool
    int8: bool


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def default_strides(shape: tuple[int, int, int, int], aligned: bool) -> tuple[int, int, int, int]:
    """BMKernel default lmem strides: w packed, h rows, c per lane (EU-aligned or not), n over lane groups."""
    n, c, h, w = shape
    c_str = _align(h * w, isa.EU_NUM) if aligned else h * w
    return (-(-c // isa.NPU_NUM) * c_str, c_str, w, 1)


def operand(f: dict[str, int], name: str, shape: tuple[int, int, int, int] | None = None) -> Operand:
    """Operand `name` (res0/opd0/opd1/opd2) of a BD; `shape` overrides the descriptor's n/c/h/w."""
    shape = shape or tuple(f[f"{name}_{d}"] for d in "nchw")
    mode = f[f"short_{name}_str"]
    strides = tuple(f[f"{name}_{d}_str"] for d in "nchw") if mode == 3 else default_strides(shape, mode == 0)
    return Operand(name, f[f"{name}_addr"], shape, strides, bool(f[f"opt_{name}_sign"]), bool(f[f"opt_{name}_int8"]))


def _check(op: Operand) -> None:
    if int(np.prod(op.shape, dtype=np.int64)) > MAX_ELEMENTS:
        raise CorruptFileError(f"BD operand {op.name} of shape {op.shape} is larger than local memory")


def read(lmem: LocalMemory, op: Operand) -> np.ndarray:
    """Values of a tensor operand as int64 (16-bit operands from their two byte planes)."""
    _check(op)
    fmt = "i8" if op.signed else "u8"
    if op.int8:
        return lmem.read(op.addr, op.shape, op.strides, fmt).astype(np.int64)
    low = lmem.read(op.addr, op.shape, op.strides, "u8").astype(np.int64)
    high = lmem.read(op.addr + op.shape[0] * op.strides[0], op.shape, op.strides, fmt).astype(np.int64)
    return low + (high << 8)


def write(lmem: LocalMemory, op: Operand, values: np.ndarray) -> None:
    """Saturate to the operand's format (int8/uint8 or 16-bit planes) and store."""
    _check(op)
    bits = 8 if op.int8 else 16
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if op.signed else (0, (1 << bits) - 1)
    values = np.clip(values, lo, hi).reshape(op.shape)
    if op.int8:
        lmem.write(op.addr, op.shape, op.strides, "u8", values & 0xFF)
        return
    lmem.write(op.addr, op.shape, op.strides, "u8", values & 0xFF)
    lmem.write(op.addr + op.shape[0] * op.strides[0], op.shape, op.strides, "u8", (values >> 8) & 0xFF)


def constant(f: dict[str, int], name: str) -> int:
    """A constant operand: the low byte of the address field, signed if the operand is."""
    value = f[f"{name}_addr"] & 0xFF
    return value - 256 if f[f"opt_{name}_sign"] and value >= 128 else value


def shift_right(acc: np.ndarray, f: dict[str, int]) -> np.ndarray:
    """ReLU (if enabled) then the arithmetic right shift, rounding half up when opt_rshift_typ is set."""
    if f["opt_relu"]:
        acc = np.maximum(acc, 0)
    r = f["opt_right_shift"]
    if r and f["opt_rshift_typ"]:
        acc = acc + (1 << (r - 1))
    return acc >> r


@dataclass(frozen=True)
class Window:
    """Kernel geometry of a conv/pool BD, checked against the (padded) input."""

    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pads: tuple[int, int, int, int]  # top, bottom, left, right
    out_h: int
    out_w: int


def window(f: dict[str, int], kh: int, kw: int, in_h: int, in_w: int) -> Window:
    if any(f[k] for k in ("conv_opd0_x_ins0", "conv_opd0_y_ins0", "conv_opd0_x_ins0_last", "conv_opd0_y_ins0_last")):
        raise UnsupportedError("BD input zero-insertion (deconvolution) is not simulated")
    sh, sw = f["conv_op_y_str"], f["conv_op_x_str"]
    if min(kh, kw, sh, sw) < 1:
        raise CorruptFileError(f"BD kernel {kh}x{kw} stride {sh}x{sw}: zero kernel size or stride")
    win = Window(
        kh, kw, sh, sw, f["conv_opd1_y_ins0"] + 1, f["conv_opd1_x_ins0"] + 1,
        tuple(f[f"conv_opd0_{p}_pad"] for p in ("up", "dn", "lf", "rt")), f["res0_h"], f["res0_w"],
    )  # fmt: skip
    span_h, span_w = win.dh * (kh - 1) + 1, win.dw * (kw - 1) + 1
    max_h = (in_h + win.pads[0] + win.pads[1] - span_h) // sh + 1
    max_w = (in_w + win.pads[2] + win.pads[3] - span_w) // sw + 1
    if win.out_h < 1 or win.out_w < 1 or win.out_h > max_h or win.out_w > max_w:
        raise CorruptFileError(
            f"BD output {win.out_h}x{win.out_w} does not fit input {in_h}x{in_w}, kernel {kh}x{kw}, "
            f"stride {sh}x{sw}, pads {win.pads}"
        )
    if kh * kw > MAX_TAPS:
        raise UnsupportedError(f"BD kernel {kh}x{kw} is larger than the simulator supports")
    if kh * kw * win.out_h * win.out_w * f["opd0_n"] * f["opd0_c"] > MAX_TAP_ELEMENTS:
        raise UnsupportedError(
            f"BD window work ({kh}x{kw} kernel over {win.out_h}x{win.out_w}) exceeds the simulator's bound"
        )
    return win


def taps(x: np.ndarray, win: Window, pad_value: int):
    """(ky, kx, strided input slice (N, C, out_h, out_w)) for every kernel position."""
    top, bottom, left, right = win.pads
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=pad_value)
    for ky in range(win.kh):
        for kx in range(win.kw):
            y0, x0 = ky * win.dh, kx * win.dw
            yield ky, kx, padded[:, :, y0 : y0 + win.sh * win.out_h : win.sh, x0 : x0 + win.sw * win.out_w : win.sw]


def _pad_value(f: dict[str, int]) -> int:
    value = f["opd0_ins_val"]
    return value - 256 if f["opt_opd0_sign"] and value >= 128 else value


def _budget(*dims: int) -> None:
    if int(np.prod(dims, dtype=np.float64)) > MAX_MACS:
        raise UnsupportedError(f"BD work of {dims} multiply-accumulates exceeds the simulator's bound")


def _bias(lmem: LocalMemory, f: dict[str, int], channels: int) -> np.ndarray:
    if f["tsk_opd_num"] < 3:
        return np.zeros((1, channels, 1, 1), np.int64)
    return read(lmem, operand(f, "opd2", (1, channels, 1, 1))).reshape(1, channels, 1, 1)


def _result(lmem: LocalMemory, f: dict[str, int], acc: np.ndarray) -> None:
    res = operand(f, "res0")
    if acc.shape != res.shape:
        raise CorruptFileError(f"BD result shape {acc.shape} differs from res0 {res.shape}")
    write(lmem, res, shift_right(acc, f))


def conv(lmem: LocalMemory, f: dict[str, int]) -> None:
    """tsk_typ 0: ifmap opd0, weights opd1 laid out [oc][kh][kw][ic] per lane, 16-bit bias opd2."""
    x = read(lmem, operand(f, "opd0"))
    cin, cout, kh, kw = f["opd1_n"], f["opd1_c"], f["opd1_h"], f["opd1_w"]
    if x.shape[1] != cin or f["res0_c"] != cout:
        raise CorruptFileError(f"conv BD channels: input {x.shape[1]}, weights {cin}->{cout}, result {f['res0_c']}")
    if f["short_opd1_str"] == 3:
        strides = tuple(f[f"opd1_{d}_str"] for d in "nchw")
    else:
        c_str = cin * kh * kw
        strides = (1, _align(c_str, isa.EU_NUM) if f["short_opd1_str"] == 0 else c_str, cin * kw, cin)
    weights = read(lmem, Operand("opd1", f["opd1_addr"], (cin, cout, kh, kw), strides, bool(f["opt_opd1_sign"]), True))
    win = window(f, kh, kw, x.shape[2], x.shape[3])
    _budget(x.shape[0], win.out_h, win.out_w, cin, cout, kh, kw)
    acc = np.zeros((x.shape[0], win.out_h, win.out_w, cout), np.float64)  # exact: |sum| < 2^53
    for ky, kx, tap in taps(x, win, _pad_value(f)):
        acc += np.matmul(tap.transpose(0, 2, 3, 1).astype(np.float64), weights[:, :, ky, kx].astype(np.float64))
    acc = acc.astype(np.int64).transpose(0, 3, 1, 2) + _bias(lmem, f, cout)
    _result(lmem, f, acc)


def _depthwise(lmem: LocalMemory, f: dict[str, int], x: np.ndarray, win: Window) -> np.ndarray:
    c = x.shape[1]
    w = read(lmem, operand(f, "opd1", (1, c, win.kh, win.kw)))[0]
    acc = np.zeros((x.shape[0], c, win.out_h, win.out_w), np.int64)
    for ky, kx, tap in taps(x, win, _pad_value(f)):
        acc += tap * w[None, :, ky, kx, None, None]
    return acc + _bias(lmem, f, c)


def _max_pool(lmem: LocalMemory, f: dict[str, int], x: np.ndarray, win: Window) -> np.ndarray:
    out = None
    for _, _, tap in taps(x, win, _pad_value(f)):
        out = tap.copy() if out is None else np.maximum(out, tap)
    return out


def _avg_pool(lmem: LocalMemory, f: dict[str, int], x: np.ndarray, win: Window) -> np.ndarray:
    acc = np.zeros((x.shape[0], x.shape[1], win.out_h, win.out_w), np.int64)
    for _, _, tap in taps(x, win, _pad_value(f)):
        acc += tap
    return acc * (constant(f, "opd1") if f["opt_opd1_const"] else 1)


POOL_KERNELS: dict[int, Callable[[LocalMemory, dict[str, int], np.ndarray, Window], np.ndarray]] = {
    0: _max_pool,
    1: _avg_pool,
    2: _depthwise,
}


def depthwise_pool(lmem: LocalMemory, f: dict[str, int]) -> None:
    """tsk_typ 1: per-channel window ops; the kernel size is opd1's h x w."""
    kernel = POOL_KERNELS.get(f["tsk_eu_typ"])
    if kernel is None:
        raise UnsupportedError(f"depthwise/pool BD with tsk_eu_typ {f['tsk_eu_typ']} is not simulated")
    x = read(lmem, operand(f, "opd0"))
    win = window(f, f["opd1_h"], f["opd1_w"], x.shape[2], x.shape[3])
    _budget(x.shape[0], x.shape[1], win.out_h, win.out_w, win.kh, win.kw)
    _result(lmem, f, kernel(lmem, f, x, win))


def fully_connected(lmem: LocalMemory, f: dict[str, int]) -> None:
    """tsk_typ 2: res0 (N, C) = opd0 (N, K) x opd1 (K, C) + 16-bit bias opd2 (C), in the lmem matrix layout
    (rows, column groups, 1, group width). As in BMKernel's matrix multiply, K is opd1_n, the left matrix's
    last column group is opd1_w wide, and the right matrix and bias take the result's groups (res0 c x w)."""
    res = operand(f, "res0")
    rows, groups, _, width = res.shape
    k, c0, w0, last = f["opd1_n"], f["opd0_c"], f["opd0_w"], f["opd1_w"]
    if c0 == 0 or not 0 < last <= w0 or (c0 - 1) * w0 + last != k or f["opd1_c"] != groups:
        raise CorruptFileError(
            f"fc BD: left {c0} groups of {w0} (last {last}), right {k} rows of {f['opd1_c']} groups, result {res.shape}"
        )
    _budget(rows, k, groups * width)
    x = read(lmem, operand(f, "opd0", (rows, c0, 1, w0))).reshape(rows, c0 * w0)[:, :k]
    w = read(lmem, operand(f, "opd1", (k, groups, 1, width))).reshape(k, groups * width)
    acc = np.matmul(x.astype(np.float64), w.astype(np.float64)).astype(np.int64)
    if f["tsk_opd_num"] >= 3:
        acc = acc + read(lmem, operand(f, "opd2", (1, groups, 1, width))).reshape(1, groups * width)
    write(lmem, res, shift_right(acc, f))


def _bitwise(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    return lambda a, b, old, f: fn(a & 0xFF, b & 0xFF)


ARITH_KERNELS: dict[int, Callable[[np.ndarray, np.ndarray, Callable[[], np.ndarray], dict[str, int]], np.ndarray]] = {
    0: lambda a, b, old, f: a * b,
    1: lambda a, b, old, f: a * b + (old() << f["opt_left_shift"]),  # mac: accumulate onto the result
    2: lambda a, b, old, f: a + b,
    3: lambda a, b, old, f: a - b,
    4: lambda a, b, old, f: np.maximum(a, b),
    5: lambda a, b, old, f: np.minimum(a, b),
    7: _bitwise(np.bitwise_and),
    8: _bitwise(np.bitwise_or),
    9: _bitwise(np.bitwise_xor),
    10: lambda a, b, old, f: a,
}
BITWISE = {7, 8, 9}


def lookup(lmem: LocalMemory, f: dict[str, int]) -> None:
    """tsk_typ 3 with tens_lookup: res0 = opd1[lane][byte of opd0], opd1 a (1, 32, 1, entries) table (one per
    lane, `bmk1880_tpu_lut`); int8 in and out, no shift or ReLU."""
    if f["opt_opd1_const"] or not (f["opt_opd0_int8"] and f["opt_res0_int8"]):
        raise UnsupportedError("lookup BD with a constant table or 16-bit operands is not simulated")
    res = operand(f, "res0")
    table_op = operand(f, "opd1")
    entries = table_op.shape[3]
    if table_op.shape[:3] != (1, isa.NPU_NUM, 1) or not 0 < entries <= 256:
        raise CorruptFileError(f"lookup table of shape {table_op.shape}; expected (1, {isa.NPU_NUM}, 1, <=256)")
    index = read(lmem, operand(f, "opd0", res.shape)) & 0xFF
    if int(index.max(initial=0)) >= entries:
        raise CorruptFileError(f"lookup index {int(index.max())} beyond the {entries}-entry table")
    table = read(lmem, table_op)[0, :, 0, :]  # (lanes, entries)
    lane = (np.arange(res.shape[1]) % isa.NPU_NUM)[None, :, None, None]
    write(lmem, res, table[lane, index])


def arith(lmem: LocalMemory, f: dict[str, int]) -> None:
    """tsk_typ 3: element-wise res0 = op(opd0, opd1 or constant), then ReLU/shift/saturate."""
    if f["tens_lookup"]:
        lookup(lmem, f)
        return
    kernel = ARITH_KERNELS.get(f["tsk_eu_typ"])
    if kernel is None:
        raise UnsupportedError(f"tensor-arith BD with tsk_eu_typ {f['tsk_eu_typ']} is not simulated")
    res = operand(f, "res0")
    a = read(lmem, operand(f, "opd0", res.shape))
    b = constant(f, "opd1") if f["opt_opd1_const"] else read(lmem, operand(f, "opd1", res.shape))
    out = kernel(a, np.asarray(b, np.int64), lambda: read(lmem, res), f)
    if f["tsk_eu_typ"] in BITWISE:  # raw bytes: no shift or saturation
        lmem.write(res.addr, res.shape, res.strides, "u8", np.broadcast_to(out, res.shape))
        return
    write(lmem, res, shift_right(np.broadcast_to(out, res.shape), f))


BD_KERNELS: dict[int, Callable[[LocalMemory, dict[str, int]], None]] = {
    0: conv,
    1: depthwise_pool,
    2: fully_connected,
    3: arith,
}


def run_bd(lmem: LocalMemory, f: dict[str, int]) -> None:
    """Execute one decoded BD descriptor on `lmem`."""
    kernel = BD_KERNELS.get(f["tsk_typ"])
    if kernel is None:
        raise UnsupportedError(f"BD task type {f['tsk_typ']} is not simulated")
    if f["opt_opd0_const"]:
        raise UnsupportedError("BD with a constant opd0 is not simulated")
    if f["tens_lookup"] and f["tsk_typ"] != 3:
        raise UnsupportedError(f"lookup on BD task type {f['tsk_typ']} is not simulated (only tensor arith)")
    kernel(lmem, f)
