"""TIU (tensor unit) operations of the CV18xx simulator, one numpy kernel per opcode, keyed in TIU_KERNELS.

Arithmetic follows specs/cv18xx.md §3.4 and §4: int8 per-channel "QDM" requantization (TFLite
SaturatingRoundingDoublingHighMul + RoundingDivideByPOT), per-tensor multiply/accumulate with a right
shift, and bf16 as rounded-to-nearest-even fp32 upper halves.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from npuc.backends.cv18xx.chips import ChipSpec, pairs_channels
from npuc.backends.cv18xx.sim_mem import LocalMemory, Shape, Strides, default_strides
from npuc.compiler.errors import CorruptFileError, UnsupportedError
from npuc.compiler.numformats.rounding import wrap_int32
from npuc.compiler.toward_zero import accumulate_products, accumulate_windows

# cv183x spells some fields differently; the kernels use the cv182x names.
_CV183X_ALIASES = {
    "opt_right_shift": "opt_res_shift",
    "opt_relu": "opt_relu_typ",
    "opt_res0_int8": "opt_res0_seg",
    "opt_opd0_int8": "opt_opd0_seg",
    "opt_opd1_int8": "opt_opd1_seg",
    "opt_opd2_int8": "opt_opd2_seg",
}


def normalize_tiu_fields(fields: dict[str, int]) -> dict[str, int]:
    out = dict(fields)
    for name, alias in _CV183X_ALIASES.items():
        if name in out:
            out[alias] = out.pop(name)
    return out


# ---- number formats -------------------------------------------------------------------------------------


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even; NaN -> 0x7FC0; overflow to +-Inf is clamped to 0x7F7F (sign dropped). The sums
    are uint32: only NaN bit patterns (0xFFFF8000 and up) wrap, and every NaN becomes 0x7FC0 at the end."""
    x = np.asarray(x, np.float32)
    flat = x.reshape(-1)
    u = flat.view(np.uint32)
    rounded = u >> 16
    rounded &= 1
    rounded += u
    rounded += 0x7FFF
    rounded >>= 16
    out = rounded.astype(np.uint16)
    out[(out & 0x7F80) == 0x7F80] = 0x7F7F
    out[np.isnan(flat)] = 0x7FC0
    return out.reshape(x.shape)


FLT_MIN = np.float32(1.1754944e-38)


def flush_subnormal(x: np.ndarray) -> np.ndarray:
    """A bf16 multiply/accumulate result below the smallest normal becomes +0 before rounding (the vendor
    simulator's tanh of the smallest inputs shows it, whatever their sign)."""
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < FLT_MIN, np.float32(0), x)


def saturating_rounding_doubling_high_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.int64), np.asarray(b, np.int64)
    ab = a64 * b64
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    num = ab + nudge
    q = np.abs(num) >> 31
    out = np.where(num < 0, -q, q)  # C division truncates toward zero
    overflow = (a64 == -(1 << 31)) & (b64 == -(1 << 31))
    return np.where(overflow, (1 << 31) - 1, out)


def rounding_divide_by_pot(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    exponent = np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def qdm(acc: np.ndarray, multiplier: np.ndarray, rshift: np.ndarray) -> np.ndarray:
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(acc, multiplier), rshift)


def round_shift(x: np.ndarray, rshift: int) -> np.ndarray:
    """Per-tensor right shift that rounds half up (the reset `opt_rshift_typ`=1 mode)."""
    x = x.astype(np.int64)
    return (x + (1 << (rshift - 1))) >> rshift if rshift > 0 else x


def saturate(x: np.ndarray, relu: bool, bits: int = 8) -> np.ndarray:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return np.clip(np.maximum(x, 0) if relu else x, lo, hi)


# ---- operands ------------------------------------------------------------------------------------------


_OPERANDS = ("res0", "opd0", "opd1", "opd2")
_SHAPE_KEYS = {p: tuple(f"{p}_{d}" for d in "nchw") for p in _OPERANDS}
_STRIDE_KEYS = {p: tuple(f"{p}_{d}_str" for d in "nchw") for p in _OPERANDS}


class TiuContext:
    """Reads and writes the operands of one TIU descriptor."""

    def __init__(self, fields: dict[str, int], lmem: LocalMemory, chip: ChipSpec) -> None:
        self.f = normalize_tiu_fields(fields)
        self.lmem = lmem
        self.chip = chip
        self.bf16 = bool(self.f["opd_typ"])
        self.esz = 2 if self.bf16 else 1

    def shape(self, p: str) -> Shape:
        f = self.f
        return tuple(f[k] for k in _SHAPE_KEYS[p])  # type: ignore[return-value]

    def strides(self, p: str, shape: Shape | None = None) -> Strides:
        shape = shape or self.shape(p)
        if self.f[f"short_{p}_str"] == 3:
            f = self.f
            return tuple(f[k] for k in _STRIDE_KEYS[p])  # type: ignore[return-value]
        return default_strides(shape, self.esz, self.chip.lanes, self.chip.eu_bytes)

    def fmt(self, p: str) -> str:
        return "bf16" if self.bf16 else ("i8" if self.f.get(f"opt_{p}_sign", 1) else "u8")

    def read(self, p: str, shape: Shape | None = None, addr: int | None = None) -> np.ndarray:
        shape = shape or self.shape(p)
        addr = self.f[f"{p}_addr"] if addr is None else addr
        v = self.lmem.read(addr, shape, self.strides(p, shape), self.fmt(p))
        return bf16_to_f32(v) if self.bf16 else v.astype(np.int64)

    def const(self, p: str) -> np.ndarray:
        raw = self.f[f"{p}_addr"]
        if self.bf16:
            return bf16_to_f32(np.array(raw, np.uint16))
        return np.int64(raw - 256 if self.f.get(f"opt_{p}_sign", 0) and raw & 0x80 else raw & 0xFF)

    def in_result_lanes(self, p: str) -> int:
        """The address of a per-output-channel operand (conv/depthwise filters and parameters) as the TIU uses
        it: its offset within the lane, in the lanes of the result's channels — a conv whose result starts in
        lane L reads channel c's filter from lane L + c, whatever lane the operand's address names."""
        size = self.lmem.size
        return (self.f["res0_addr"] // size) * size + self.f[f"{p}_addr"] % size

    def operand(self, p: str) -> np.ndarray:
        return self.const(p) if self.f[f"opt_{p}_const"] else self.read(p)

    def write_res(self, values: np.ndarray, shape: Shape | None = None) -> None:
        shape = shape or self.shape("res0")
        strides = self.strides("res0", shape)
        if self.bf16:
            self.lmem.write(self.f["res0_addr"], shape, strides, "bf16", f32_to_bf16(values))
        elif self.f["opt_res0_seg"] == 0:  # 16-bit result as a low byte plane and a high byte plane
            v = values.astype(np.int64) & 0xFFFF
            self.lmem.write(self.f["res0_addr"], shape, strides, "u8", v & 0xFF)
            self.lmem.write(self.f["res0_addr"] + self.f["res0_b_str"], shape, strides, "u8", v >> 8)
        else:
            self.lmem.write(self.f["res0_addr"], shape, strides, self.fmt("res0"), values)

    def read_res16(self) -> np.ndarray:
        shape, strides = self.shape("res0"), self.strides("res0")
        lo = self.lmem.read(self.f["res0_addr"], shape, strides, "u8").astype(np.int64)
        hi = self.lmem.read(self.f["res0_addr"] + self.f["res0_b_str"], shape, strides, "i8").astype(np.int64)
        return hi * 256 + lo

    def channel_params(self, oc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-channel (bias, multiplier, shift) records at opd2: 9 bytes each, 5 without a bias."""
        rec = 9 if self.f["tsk_opd_num"] == 3 else 5
        raw = self.lmem.read(self.in_result_lanes("opd2"), (1, oc, 1, rec), (0, rec, 0, 1), "u8").reshape(oc, rec)
        words = raw[:, : rec - 1].copy().view("<u4").astype(np.int64)
        bias = words[:, 0].astype(np.int32).astype(np.int64) if rec == 9 else np.zeros(oc, np.int64)
        return bias, words[:, -1], raw[:, -1].astype(np.int64)


# ---- kernels --------------------------------------------------------------------------------------------


MAX_INSERTED_ELEMENTS = 1 << 26  # an input spread wider than this is a corrupt descriptor, not a real layer


def _insert(ctx: TiuContext, x: np.ndarray, value: float) -> np.ndarray:
    """The input with `conv_opd0_y/x_ins0` copies of `value` between its rows/columns and `*_ins0_last` after
    the last one (a transposed conv as a stride-1 conv over the spread input)."""
    f = ctx.f
    ins_h, ins_w = f["conv_opd0_y_ins0"], f["conv_opd0_x_ins0"]
    last_h, last_w = f["conv_opd0_y_ins0_last"], f["conv_opd0_x_ins0_last"]
    if not (ins_h or ins_w or last_h or last_w):
        return x
    n, c, h, w = x.shape
    if h == 0 or w == 0:
        raise CorruptFileError("TIU: an input with insertion has an empty height or width")
    eh, ew = (h - 1) * (ins_h + 1) + 1, (w - 1) * (ins_w + 1) + 1
    if n * c * (eh + last_h) * (ew + last_w) > MAX_INSERTED_ELEMENTS:
        raise CorruptFileError(f"TIU: inserting zeros into a {n}x{c}x{h}x{w} input exceeds any local memory")
    out = np.full((n, c, eh + last_h, ew + last_w), value, x.dtype)
    out[:, :, 0 : eh : ins_h + 1, 0 : ew : ins_w + 1] = x
    return out


def _windows(ctx: TiuContext, x: np.ndarray, kh: int, kw: int, pad_value: float) -> np.ndarray:
    """(n, c, oh, ow, kh, kw) input windows after insertion, padding, dilation and stride."""
    f = ctx.f
    x = _insert(ctx, x, pad_value)
    pads = (
        (0, 0),
        (0, 0),
        (f["conv_opd0_up_pad"], f["conv_opd0_dn_pad"]),
        (f["conv_opd0_lf_pad"], f["conv_opd0_rt_pad"]),
    )
    xp = np.pad(x, pads, constant_values=pad_value)
    dh, dw = f["conv_opd1_y_ins0"] + 1, f["conv_opd1_x_ins0"] + 1
    win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))[..., ::dh, ::dw]
    _, _, oh, ow = ctx.shape("res0")
    win = win[:, :, :: f["conv_op_y_str"], :: f["conv_op_x_str"]][:, :, :oh, :ow]
    if win.shape[2:4] != (oh, ow):
        raise CorruptFileError(f"TIU: the input gives {win.shape[2]}x{win.shape[3]} windows, res0 wants {oh}x{ow}")
    return win


def _bf16_bias(ctx: TiuContext, oc: int) -> np.ndarray:
    """fp32 bias of a bf16 conv: a high-16 plane, then a low-16 plane one plane of the conv's own `oc` further
    (ceil(oc / lanes) x 2 bytes). The vendor simulator takes that distance from oc, not from opd2_b_str: a
    bias view into a wider parameter tensor reads the wrong low halves there (checked on cv181x and cv183x)."""
    strides = default_strides((1, oc, 1, 1), 2, ctx.chip.lanes, ctx.chip.eu_bytes, eu_align=False)
    addr = ctx.in_result_lanes("opd2")
    hi = ctx.lmem.read(addr, (1, oc, 1, 1), strides, "bf16").astype(np.uint32)
    lo = ctx.lmem.read(addr + strides[0], (1, oc, 1, 1), strides, "bf16").astype(np.uint32)
    return ((hi << 16) | lo).view(np.float32).astype(np.float64)


def _bias_or_none(ctx: TiuContext, oc: int) -> np.ndarray | None:
    return _bf16_bias(ctx, oc).ravel() if ctx.f["tsk_opd_num"] == 3 else None


def _finish_bf16(ctx: TiuContext, acc: np.ndarray) -> None:
    """Store float32 sums (bias included) of a bf16 conv/depthwise, rounded to bf16, with its ReLU."""
    ctx.write_res(np.maximum(acc, 0) if ctx.f["opt_relu_typ"] else acc)


def _finish(ctx: TiuContext, acc: np.ndarray) -> None:
    """Bias, requantization or bf16 rounding, ReLU, and the store of a conv/pool/depthwise result."""
    f, oc = ctx.f, acc.shape[1]
    relu = bool(f["opt_relu_typ"])
    if ctx.bf16:
        if f["tsk_opd_num"] == 3:
            acc = acc + _bf16_bias(ctx, oc)
        with np.errstate(over="ignore"):  # overflow becomes Inf, which f32_to_bf16 clamps
            acc = acc.astype(np.float32)
        ctx.write_res(np.maximum(acc, 0) if relu else acc)
    elif f["opt_chl_quan"]:
        bias, mult, shift = ctx.channel_params(oc)
        idx = (None, slice(None), None, None)
        # the sums plus the bias are a 32-bit accumulator: it wraps (a bias saturated at int32 beside a tiny
        # input scale, PP-OCRv6 rec's dead channels at threshold 1e-5, runs so on the vendor simulator)
        ctx.write_res(saturate(qdm(wrap_int32(acc + bias[idx]), mult[idx], shift[idx]), relu))
    else:
        ctx.write_res(saturate(round_shift(acc, f["opt_res_shift"]), relu))


def tiu_conv(ctx: TiuContext) -> None:
    x = ctx.read("opd0")
    ic, oc, kh, kw = ctx.shape("opd1")
    f = ctx.f
    if f["double_conv"] and not pairs_channels(ic, ctx.bf16, f["opd0_addr"], f["opd1_addr"]):
        # two channels a cycle: the same sums, where the chip can pair them
        raise UnsupportedError(f"double_conv on a conv it cannot pair (ic {ic}, {'bf16' if ctx.bf16 else 'int8'}, "
                               f"ifmap at {f['opd0_addr']:#x}, filter at {f['opd1_addr']:#x})")  # fmt: skip
    e = ctx.esz  # weights are packed per output channel as [kh][kw][ic]
    w = ctx.lmem.read(
        ctx.in_result_lanes("opd1"), (1, oc, kh * kw, ic), (0, kh * kw * ic * e, ic * e, e), ctx.fmt("opd1")
    )
    w = (bf16_to_f32(w) if ctx.bf16 else w.astype(np.int64)).reshape(oc, kh, kw, ic).transpose(0, 3, 1, 2)
    win = _windows(ctx, x, kh, kw, 0)
    if ctx.bf16:  # float32 sums rounded toward zero in the TIU's order (compiler/toward_zero.py)
        _finish_bf16(ctx, accumulate_windows(win, w, 1, _bias_or_none(ctx, oc)))
        return
    _finish(ctx, _integer_conv(win, w))


def _integer_conv(win: np.ndarray, w: np.ndarray) -> np.ndarray:
    """int64 sums (n, oc, oh, ow) of integer windows (n, c, oh, ow, kh, kw) with filters (oc, c, kh, kw): one
    float64 matrix product per kernel position. Exact: every product of two bytes and every partial sum is an
    integer below 2^53 (at most 255 * 255 * 4095 * 4095 * 4095 < 2^52 for any descriptor's sizes)."""
    n, c, oh, ow, kh, kw = win.shape
    acc = np.zeros((n, w.shape[0], oh * ow), np.float64)
    filters = w.astype(np.float64)
    for i in range(kh):
        for j in range(kw):
            acc += filters[:, :, i, j] @ win[..., i, j].reshape(n, c, oh * ow).astype(np.float64)
    return acc.astype(np.int64).reshape(n, -1, oh, ow)


def tiu_depthwise(ctx: TiuContext) -> None:
    x = ctx.read("opd0")
    n, c, kh, kw = ctx.shape("opd1")
    w = ctx.const("opd1") if ctx.f["opt_opd1_const"] else ctx.read("opd1", addr=ctx.in_result_lanes("opd1"))
    win = _windows(ctx, x, kh, kw, 0)
    if ctx.bf16:
        filters = np.broadcast_to(np.asarray(w, np.float32), (1, c, kh, kw)).reshape(c, 1, kh, kw)
        _finish_bf16(ctx, accumulate_windows(win, filters, c, _bias_or_none(ctx, c)))
        return
    _finish(ctx, (win * (w.reshape(1, c, 1, 1, kh, kw) if np.ndim(w) else w)).sum(axis=(4, 5)))


def tiu_max_pool(ctx: TiuContext) -> None:
    if ctx.bf16:  # cv183x keeps the bf16 pad value in its own field
        pad = bf16_to_f32(np.array(ctx.f.get("opd0_ins_fp", ctx.f["opd0_ins_val"]), np.uint16))
    else:
        bits = 8 if ctx.chip.tiu_layout == "cv183x" else 16  # cv183x keeps an 8-bit int8 pad value
        raw = ctx.f["opd0_ins_val"]
        pad = raw - ((1 << bits) if raw & (1 << (bits - 1)) else 0)
    win = _windows(ctx, ctx.read("opd0"), ctx.f["opd1_h"], ctx.f["opd1_w"], pad)
    ctx.write_res(win.max(axis=(4, 5)))


def tiu_avg_pool(ctx: TiuContext) -> None:
    kh, kw = ctx.f["opd1_h"], ctx.f["opd1_w"]
    win = _windows(ctx, ctx.read("opd0"), kh, kw, 0)
    if ctx.bf16 and win.size:  # each x * multiplier, added in the conv's order and rounding (48x96 windows show it)
        c = win.shape[1]
        multiplier = np.full((c, 1, kh, kw), ctx.const("opd1"), np.float32)
        _finish_bf16(ctx, accumulate_windows(win, multiplier, c))
        return
    _finish(ctx, win.sum(axis=(4, 5)) * ctx.const("opd1"))


def tiu_mul(ctx: TiuContext) -> None:
    f = ctx.f
    if ctx.bf16:  # subnormal operands read as zero (a subnormal times 1.625 gives 0 on the vendor's); the
        # relu flag applies (the vendor's bf16 Mul -> Relu result has no negative value)
        with np.errstate(over="ignore"):  # overflow becomes Inf, which f32_to_bf16 clamps
            prod = flush_subnormal(flush_subnormal(ctx.read("opd0")) * flush_subnormal(ctx.operand("opd1")))
        ctx.write_res(np.maximum(prod, 0) if f["opt_relu_typ"] else prod)
        return
    prod = ctx.read("opd0") * ctx.operand("opd1")
    if f["opt_chl_quan"]:
        ctx.write_res(saturate(qdm(prod, f["quan_m"], f["opt_res_shift"]), bool(f["opt_relu_typ"])))
    elif f["opt_res0_seg"] == 0:
        ctx.write_res(saturate(round_shift(prod, f["opt_res_shift"]), bool(f["opt_relu_typ"]), 16))
    else:
        ctx.write_res(saturate(round_shift(prod, f["opt_res_shift"]), bool(f["opt_relu_typ"])))


def tiu_mac(ctx: TiuContext) -> None:
    f = ctx.f
    if ctx.bf16:
        prev = bf16_to_f32(ctx.lmem.read(f["res0_addr"], ctx.shape("res0"), ctx.strides("res0"), "bf16"))
        a, b, prev = (flush_subnormal(v) for v in (ctx.read("opd0"), ctx.operand("opd1"), prev))
        with np.errstate(over="ignore"):
            acc = flush_subnormal(a * b + (prev if f["opt_res_add"] else 0))
        ctx.write_res(np.maximum(acc, 0) if f["opt_relu_typ"] else acc)
        return
    acc = ctx.read("opd0") * ctx.operand("opd1")
    if f["opt_res_add"]:
        acc = acc + (ctx.read_res16() << f["opt_left_shift"])
    bits = 8 if f["opt_res0_seg"] else 16
    ctx.write_res(saturate(round_shift(acc, f["opt_res_shift"]), bool(f["opt_relu_typ"]), bits))


def _bf16_arith(op: Callable[[np.ndarray, np.ndarray], np.ndarray], name: str) -> Callable[[TiuContext], None]:
    """bf16 add / sub: the fp32 result of two bf16 operands (subnormals read and written as zero), then the
    relu flag and rounding to bf16. The int8 forms (16-bit operand planes and shifts) are not modelled."""

    def kernel(ctx: TiuContext) -> None:
        if not ctx.bf16:
            raise UnsupportedError(f"TIU operation {name} on int8 operands is not simulated yet")
        out = flush_subnormal(op(flush_subnormal(ctx.read("opd0")), flush_subnormal(ctx.operand("opd1"))))
        ctx.write_res(np.maximum(out, 0) if ctx.f["opt_relu_typ"] else out)

    return kernel


def _bitwise(op: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[TiuContext], None]:
    def kernel(ctx: TiuContext) -> None:
        ctx.write_res(op(ctx.read("opd0").astype(np.int64), np.asarray(ctx.operand("opd1"), np.int64)))

    return kernel


def tiu_copy(ctx: TiuContext) -> None:
    ctx.write_res(ctx.read("opd0"))


def _extreme(op: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[TiuContext], None]:
    def kernel(ctx: TiuContext) -> None:
        ctx.write_res(op(ctx.read("opd0"), ctx.operand("opd1")))

    return kernel


def tiu_matmul(ctx: TiuContext) -> None:
    """res0[rows, cols] = opd0[rows, K] @ opd1[K, cols] (+ bias planes); matrices in the lmem matrix layout.

    The left matrix holds its K columns in opd0_c groups of opd0_w, the last group opd1_w wide (that is what
    the opd1_w field carries); the right matrix is K rows of the result's column groups (opd1_c x res0_w)."""
    f = ctx.f
    if f["ps32_md"]:
        raise UnsupportedError("partial-sum (ps32) matmul is not simulated yet")
    rows, c0, _, w0 = ctx.shape("opd0")
    k, c1, _, last = ctx.shape("opd1")
    _, rc, _, rw = ctx.shape("res0")
    if c0 == 0 or (c0 - 1) * w0 + last != k or not 0 < last <= w0:  # the hardware asserts the same
        raise CorruptFileError(
            f"matmul: the left matrix's {c0} column groups of {w0} (last {last}) do not make the right's {k} rows"
        )
    if c1 != rc:
        raise CorruptFileError(f"matmul: the right matrix has {c1} column groups, the result {rc}")
    w1 = rw  # the right matrix's and the bias's column-group width
    left = ctx.read("opd0", (rows, c0, 1, w0)).reshape(rows, c0 * w0)[:, :k]
    right = ctx.read("opd1", (k, c1, 1, w1)).reshape(k, c1 * w1)
    if ctx.bf16:  # float32 sums rounded toward zero, across the column groups first, the bias last
        bias = None
        if f["tsk_opd_num"] == 3:  # fp32 bias as a high-16 row and a low-16 row
            shape = (2, c1, 1, w1)
            raw = ctx.lmem.read(f["opd2_addr"], shape, ctx.strides("opd2", shape), "bf16").reshape(2, -1)
            bias = ((raw[0].astype(np.uint32) << 16) | raw[1]).view(np.float32)
        # a column group's unused tail holds whatever local memory held (inf and NaN bit patterns too): its
        # products are formed, as on the chip, and never stored
        with np.errstate(over="ignore", invalid="ignore"):
            acc = accumulate_products(left, right, w0, bias)
            out = acc.astype(np.float32)
        ctx.write_res((np.maximum(out, 0) if f["opt_relu_typ"] else out)[:, : rc * rw], (rows, rc, 1, rw))
        return
    acc = left @ right
    if f["tsk_opd_num"] == 3:
        planes = 4 if f["opt_chl_quan"] else 2
        raw = ctx.lmem.read(
            f["opd2_addr"], (planes, c1, 1, w1), ctx.strides("opd2", (planes, c1, 1, w1)), "u8"
        ).reshape(planes, c1 * w1)
        bias = sum(raw[p].astype(np.int64) << (8 * p) for p in range(planes))
        acc = acc + bias.astype(np.int32 if planes == 4 else np.int16).astype(np.int64)
    relu = bool(f["opt_relu_typ"])
    if f["opt_chl_quan"]:  # the products plus the bias are a 32-bit accumulator that wraps, as a conv's
        out = saturate(qdm(wrap_int32(acc), f["quan_m"], f["opt_res_shift"]), relu)
    else:
        out = saturate(round_shift(acc, f["opt_res_shift"]), relu)
    ctx.write_res(out[:, : rc * rw].reshape(rows, rc, 1, rw), (rows, rc, 1, rw))


def tiu_lookup(ctx: TiuContext) -> None:
    """res0 = table[opd0]: each element, read as an unsigned byte, indexes the 256-entry table (opd1,
    (1, lanes, 16, 16) int8 or (1, lanes, 32, 8) bf16) kept in its own lane; a bf16 element indexes with the
    low byte of its bits. Channel c of an operand starting in lane L lives in lane (L + c) % lanes."""
    lanes, size = ctx.chip.lanes, ctx.lmem.size

    def raw(p: str) -> np.ndarray:  # bf16 operands as their bits
        return ctx.lmem.read(ctx.f[f"{p}_addr"], ctx.shape(p), ctx.strides(p), "bf16" if ctx.bf16 else ctx.fmt(p))

    tables = raw("opd1").reshape(ctx.shape("opd1")[1], -1)
    if tables.shape != (lanes, 256):
        raise UnsupportedError(f"a lookup table of shape {ctx.shape('opd1')} is not simulated")
    table_lane0 = ctx.f["opd1_addr"] // size
    per_lane = tables[(np.arange(lanes) - table_lane0) % lanes]
    x = raw("opd0").astype(np.int64)  # bf16: the low byte of each element's bits is the index
    lane = (ctx.f["opd0_addr"] // size + np.arange(x.shape[1])) % lanes
    picked = per_lane[lane[None, :, None, None], x & 0xFF]
    ctx.write_res(bf16_to_f32(picked) if ctx.bf16 else picked.astype(np.int64))


TIU_KERNELS: dict[str, Callable[[TiuContext], None]] = {
    "conv": tiu_conv,
    "depthwise": tiu_depthwise,
    "max_pool": tiu_max_pool,
    "avg_pool": tiu_avg_pool,
    "matmul": tiu_matmul,
    "mul": tiu_mul,
    "mac": tiu_mac,
    "and": _bitwise(np.bitwise_and),
    "or": _bitwise(np.bitwise_or),
    "xor": _bitwise(np.bitwise_xor),
    "copy": tiu_copy,
    "add": _bf16_arith(np.add, "add"),
    "sub": _bf16_arith(np.subtract, "sub"),
    "max": _extreme(np.maximum),
    "min": _extreme(np.minimum),
    "lookup": tiu_lookup,
}
