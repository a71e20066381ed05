"""BD sequences of the BM1880 int8 layers, on tiles already in local memory.

Forms are the ones the vendor's compiler emits (golden P-Net): conv = one conv BD with 16-bit bias in two
byte planes; max pool = depthwise/pool BD (eu 0, pad value -128) then an unsigned-constant MUL to requantize;
PReLU = MAX 0, MUL gt_scale, MIN 0, 1x1 depthwise by the int8 slopes, OR of the two halves; lookup =
tensor-arith BD with tens_lookup over the table `bmk1880_tpu_lut` reads (specs/bm1880.md §2.7). npuc's own
forms where the vendor files show none: average pool (eu 1, window sum x constant), LeakyReLU (MUL by a signed
constant instead of the depthwise slopes), eltwise add/max (per-input MUL into 16-bit, then ADD/MAX with the
common shift into int8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import isa
from .emit import Emitter, LTensor, operand
from .layers import Layer

SIGNED_INT8 = dict(
    opt_res0_sign=1, opt_opd0_sign=1, opt_opd1_sign=1, opt_opd2_sign=1,
    opt_res0_int8=1, opt_opd0_int8=1, opt_opd1_int8=1,
)  # fmt: skip
ARITH = {"mul": 0, "add": 2, "max": 4, "min": 5, "or": 8}
POOL_EU = {"max": 0, "avg": 1, "depthwise": 2}


@dataclass(frozen=True)
class Window:
    """The part of a layer's window geometry that changes per tile: pads at tile edges."""

    pads: tuple[int, int, int, int]  # top, bottom, left, right


@dataclass(frozen=True)
class LayerBuffers:
    """Local addresses a layer uses: its input and output tiles, weights, bias, scratch."""

    x: LTensor
    y: LTensor
    weight: int = 0
    bias: int = 0
    work: int = 0
    x2: LTensor | None = None  # second eltwise input
    gains: int = 0  # per-channel u8 gains (1, c, 1, 1) of a conv/dwconv with gains


def _window_fields(layer: Layer, win: Window) -> dict[str, int]:
    top, bottom, left, right = win.pads
    return dict(
        conv_opd0_up_pad=top, conv_opd0_dn_pad=bottom, conv_opd0_lf_pad=left, conv_opd0_rt_pad=right,
        conv_op_y_str=layer.strides[0], conv_op_x_str=layer.strides[1],
        conv_opd1_y_ins0=layer.dilations[0] - 1, conv_opd1_x_ins0=layer.dilations[1] - 1,
    )  # fmt: skip


def arith(em: Emitter, op: str, res: LTensor, a: LTensor, b: LTensor | int, rshift: int = 0, **flags: int) -> None:
    """Tensor arithmetic (tsk_typ 3) with explicit strides; `b` an int = 8-bit constant operand."""
    const_signed = flags.pop("const_signed", 1)
    fields = dict(tsk_typ=3, tsk_eu_typ=ARITH[op], tsk_opd_num=2, opt_right_shift=rshift, **SIGNED_INT8)
    fields |= operand("res0", res, True) | operand("opd0", a, True)
    if isinstance(b, int):
        fields |= dict(opt_opd1_const=1, opd1_addr=b & 0xFF, short_opd1_str=3)
        fields |= {f"opd1_{d}_str": v for d, v in zip("nchw", res.strides, strict=True)}
        fields |= dict(opd1_n=res.shape[0], opd1_c=res.shape[1], opd1_h=res.shape[2], opd1_w=res.shape[3])
        fields["opt_opd1_sign"] = int(b < 0 or const_signed == 1)
    else:
        fields |= operand("opd1", b, True)
    fields |= flags
    em.bd(fields)


def _wide(buf: LayerBuffers) -> LTensor:
    """The 16-bit result of a layer with per-channel gains: two byte planes in its scratch."""
    return LTensor(buf.work, buf.y.shape)


def apply_gains(em: Emitter, layer: Layer, buf: LayerBuffers) -> None:
    """int8 y = (16-bit result x u8 gain of its channel) >> gain_shift, rounded; the gains read with h/w strides 0."""
    wide = _wide(buf)
    g = LTensor(buf.gains, (1, wide.shape[1], 1, 1))
    gains = LTensor(g.addr, wide.shape, fixed=(0, g.strides[1], 0, 0))
    arith(em, "mul", buf.y, wide, gains, layer.gain_shift, opt_opd0_int8=0, opt_opd1_sign=0)


def conv(em: Emitter, layer: Layer, buf: LayerBuffers, win: Window, oc: int) -> None:
    """Conv BD: opd0 ifmap, opd1 weights [oc][kh·kw][ic] packed, opd2 16-bit bias planes."""
    ic = buf.x.shape[1]
    kh, kw = layer.kernel
    fields = dict(tsk_typ=0, tsk_opd_num=3 if layer.bias is not None else 2, opt_right_shift=layer.rshift,
                  opt_relu=int(layer.relu), short_opd1_str=1, short_opd2_str=2, **SIGNED_INT8)  # fmt: skip
    res = buf.y if layer.gains is None else _wide(buf)
    fields |= operand("res0", res) | operand("opd0", buf.x) | _window_fields(layer, win)
    fields |= dict(opt_res0_int8=int(layer.gains is None))
    fields |= dict(opd1_addr=buf.weight, opd1_n=ic, opd1_c=oc, opd1_h=kh, opd1_w=kw)
    if layer.bias is not None:
        fields |= dict(opd2_addr=buf.bias, opd2_n=1, opd2_c=oc, opd2_h=1, opd2_w=1)
    em.bd(fields)
    if layer.gains is not None:
        apply_gains(em, layer, buf)


def _dwpool(em: Emitter, eu: str, layer: Layer, buf: LayerBuffers, win: Window, **extra: int) -> None:
    c = buf.x.shape[1]
    kh, kw = layer.kernel
    fields = dict(tsk_typ=1, tsk_eu_typ=POOL_EU[eu], opd1_n=1, opd1_c=c, opd1_h=kh, opd1_w=kw, **SIGNED_INT8)
    fields |= operand("res0", extra.pop("res", buf.y)) | operand("opd0", buf.x) | _window_fields(layer, win) | extra
    em.bd(fields)


def dwconv(em: Emitter, layer: Layer, buf: LayerBuffers, win: Window, oc: int) -> None:
    """Depthwise conv: pool BD eu 2 with per-channel kernels (aligned) and the 16-bit bias."""
    extra = dict(tsk_opd_num=2, opt_right_shift=layer.rshift, opt_relu=int(layer.relu), opd1_addr=buf.weight)
    if layer.bias is not None:
        c = buf.x.shape[1]
        extra |= dict(tsk_opd_num=3, short_opd2_str=2, opd2_addr=buf.bias, opd2_n=1, opd2_c=c, opd2_h=1, opd2_w=1)
    if layer.gains is not None:
        extra |= dict(res=_wide(buf), opt_res0_int8=0)
    _dwpool(em, "depthwise", layer, buf, win, **extra)
    if layer.gains is not None:
        apply_gains(em, layer, buf)


def pool(em: Emitter, layer: Layer, buf: LayerBuffers, win: Window, oc: int) -> None:
    (m,) = layer.multipliers
    if layer.mode == "avg":  # window sum x m >> r in one BD
        _dwpool(em, "avg", layer, buf, win, tsk_opd_num=2, opt_opd1_const=1, opt_opd1_sign=0, opd1_addr=m,
                opt_right_shift=layer.rshift)  # fmt: skip
        return
    _dwpool(em, "max", layer, buf, win, tsk_opd_num=1, opd0_ins_val=0x80)  # pad with -128
    if (m, layer.rshift) != (1, 0):
        arith(em, "mul", buf.y, buf.y, m, layer.rshift, const_signed=0)


def activation(em: Emitter, layer: Layer, buf: LayerBuffers, win: Window, oc: int) -> None:
    """ReLU / LeakyReLU / PReLU: positive side x·gt >> gt_shift, negative side by the slope(s)."""
    gt, le = layer.multipliers
    gt_shift, le_shift = layer.shifts
    x, y = buf.x, buf.y
    if layer.mode == "relu":
        arith(em, "max", y, x, 0)
        if (gt, gt_shift) != (64, 6):  # 64 >> 6 is the identity
            arith(em, "mul", y, y, gt, gt_shift)
        return
    # the negative half is built in the output, never in the input: a later layer of the group may read it
    pos = LTensor(buf.work, x.shape)
    arith(em, "max", pos, x, 0)
    arith(em, "mul", pos, pos, gt, gt_shift)
    arith(em, "min", y, x, 0)
    if layer.mode == "prelu":
        one = Layer(layer.name, "act", (), "", kernel=(1, 1))
        _dwpool(em, "depthwise", one, LayerBuffers(y, y), Window((0, 0, 0, 0)), tsk_opd_num=2,
                opt_right_shift=le_shift, opd1_addr=buf.weight)  # fmt: skip
    else:
        arith(em, "mul", y, y, le, le_shift)
    arith(em, "or", y, pos, y, opt_res0_sign=0, opt_opd0_sign=0, opt_opd1_sign=0)


def eltwise(em: Emitter, layer: Layer, buf: LayerBuffers, win: Window, oc: int) -> None:
    """y = op(x1·m1, x2·m2) >> r: the products go to 16-bit scratch, the final op saturates to int8."""
    t1 = LTensor(buf.work, buf.x.shape)
    t2 = LTensor(buf.work + 2 * t1.lane_bytes, buf.x.shape)
    m1, m2 = layer.multipliers
    arith(em, "mul", t1, buf.x, m1, const_signed=0, opt_res0_int8=0)
    arith(em, "mul", t2, buf.x2, m2, const_signed=0, opt_res0_int8=0)
    arith(em, layer.mode, buf.y, t1, t2, layer.rshift, opt_relu=int(layer.relu), opt_opd0_int8=0, opt_opd1_int8=0)


LUT_ENTRIES = 256


def lut_table(addr: int) -> LTensor:
    """The lookup table in local memory: (1, 32, 1, 256), the same 256 bytes in every lane."""
    return LTensor(addr, (1, isa.NPU_NUM, 1, LUT_ENTRIES))


def lookup(em: Emitter, y: LTensor, x: LTensor, table: LTensor) -> None:
    """Tensor-arith BD with tens_lookup: y = table[lane][x's byte] (opd1 the (1, 32, 1, 256) table)."""
    fields = dict(tsk_typ=3, tens_lookup=1, tsk_opd_num=2, **SIGNED_INT8)
    fields |= operand("res0", y, True) | operand("opd0", x, True) | operand("opd1", table) | dict(short_opd1_str=0)
    em.bd(fields)


def lut(em: Emitter, layer: Layer, buf: LayerBuffers, win: Window, oc: int) -> None:
    lookup(em, buf.y, buf.x, lut_table(buf.weight))


KERNELS: dict[str, Callable[[Emitter, Layer, LayerBuffers, Window, int], None]] = {
    "conv": conv,
    "dwconv": dwconv,
    "pool": pool,
    "act": activation,
    "eltwise": eltwise,
    "lut": lut,
}


def work_bytes(layer: Layer, tile: int) -> int:
    """Scratch bytes per lane a layer needs beyond its input and output tiles (tile = int8 tile bytes)."""
    if layer.kind == "eltwise":
        return 4 * tile  # two 16-bit products
    if layer.gains is not None:
        return 2 * tile  # the 16-bit result before the gains
    if layer.kind == "act" and layer.mode != "relu":
        return tile  # the positive half
    return 0
