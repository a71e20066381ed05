"""TIU descriptors the code generator emits, as field dicts in the cv182x spelling (see emit.encode_tiu).

Each builder fills the fields cvikernel's matching `tiu_*` entry point sets (specs/cv18xx.md §3.4): the
opcode selectors, operand addresses/shapes/strides and the arithmetic options. bf16 variants differ only in
`opd_typ`; per-channel int8 requantization reads 9-byte (bias, multiplier, shift) records at opd2.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuc.backends.cv18xx.chips import pairs_channels
from npuc.backends.cv18xx.lmem import LTensor

EXPLICIT, DEFAULT = 3, 0  # short_*_str: strides given in the descriptor / derived from the shape


def operand(prefix: str, t: LTensor, explicit: bool = True) -> dict[str, int]:
    f = {f"{prefix}_addr": t.addr, **{f"{prefix}_{d}": v for d, v in zip("nchw", t.shape)}}
    f[f"short_{prefix}_str"] = EXPLICIT if explicit else DEFAULT
    if explicit:
        f.update({f"{prefix}_{d}_str": v for d, v in zip("nchw", t.strides)})
    return f


def _typ(t: LTensor) -> dict[str, int]:
    return {"opd_typ": 1, "opt_res0_sign": 0, "opt_opd0_sign": 0} if t.fmt == "bf16" else {}


@dataclass(frozen=True)
class Window:
    """Kernel geometry of a conv/pool tile: kernel, stride, dilation and the pads of this tile."""

    kh: int
    kw: int
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, bottom, left, right
    ins_h: int = 0  # zeros inserted between input rows / columns (a transposed conv's stride - 1)
    ins_w: int = 0

    def fields(self) -> dict[str, int]:
        top, bottom, left, right = self.pads
        return {
            "conv_opd0_y_ins0": self.ins_h,
            "conv_opd0_x_ins0": self.ins_w,
            "conv_opd0_up_pad": top,
            "conv_opd0_dn_pad": bottom,
            "conv_opd0_lf_pad": left,
            "conv_opd0_rt_pad": right,
            "conv_op_y_str": self.sh,
            "conv_op_x_str": self.sw,
            "conv_opd1_y_ins0": self.dh - 1,
            "conv_opd1_x_ins0": self.dw - 1,
        }


def conv(out: LTensor, x: LTensor, w: LTensor, params: LTensor | None, win: Window, relu: bool,
         has_bias: bool) -> dict[str, int]:  # fmt: skip
    """Convolution; `w` is (1, oc, kh*kw, ic) in lmem. int8: `params` holds the per-channel records;
    bf16: `params` is the (2, oc, 1, 1) high/low bias planes or None."""
    oc, ic = out.shape[1], x.shape[1]
    f = {
        "tsk_typ": 0,
        **_typ(x),
        **operand("res0", out),
        **operand("opd0", x, explicit=False),
        "opd1_addr": w.addr,
        "opd1_n": ic,
        "opd1_c": oc,
        "opd1_h": win.kh,
        "opd1_w": win.kw,
        "short_opd1_str": 1,  # the compact weight layout
        **win.fields(),
        "opt_relu_typ": int(relu),
    }
    if x.fmt == "bf16":  # as cvikernel sets them; the depthwise unit instead insists on signed operands
        f.update({"opt_opd1_sign": 0, "opt_opd2_sign": 0})
    elif pairs_channels(ic, False, x.addr, w.addr):
        f["double_conv"] = 1  # two input channels a cycle, as tpu-mlir sets it wherever the chip allows it
    return {**f, **_bias_operand(out, params, has_bias)}


def depthwise(out: LTensor, x: LTensor, w: LTensor, params: LTensor | None, win: Window, relu: bool,
              has_bias: bool) -> dict[str, int]:  # fmt: skip
    f = {
        "tsk_typ": 1,
        "tsk_eu_typ": 2,
        **_typ(x),
        **operand("res0", out),
        **operand("opd0", x),
        **operand("opd1", w, explicit=False),
        **win.fields(),
        "opt_relu_typ": int(relu),
    }
    return {**f, **_bias_operand(out, params, has_bias), "opt_opd2_sign": 1}  # the depthwise unit insists


def _bias_operand(out: LTensor, params: LTensor | None, has_bias: bool) -> dict[str, int]:
    oc = out.shape[1]
    if out.fmt == "bf16":
        if params is None:
            return {"tsk_opd_num": 2}
        return {
            "tsk_opd_num": 3,
            "opd2_addr": params.addr,
            "opd2_n": 1,
            "opd2_c": oc,
            "opd2_h": 1,
            "opd2_w": 1,
            "short_opd2_str": 2,
            "opd2_b_str": params.strides[0],  # distance from the high-16 plane to the low-16 plane
        }
    assert params is not None
    return {
        "tsk_opd_num": 3 if has_bias else 2,
        "opt_chl_quan": 1,
        "opt_res_shift": 0,
        "opd2_addr": params.addr,
        "opd2_n": 1,
        "opd2_c": oc,
        "opd2_h": 1,
        "opd2_w": 1,
        "short_opd2_str": 2,  # packed per-channel records
        "opd2_b_str": 0,
        "opt_opd2_seg": 1,
        "opt_opd2_sign": int(has_bias),
    }


def max_pool(out: LTensor, x: LTensor, win: Window, pad_value: int) -> dict[str, int]:
    return {
        "tsk_typ": 1,
        "tsk_eu_typ": 0,
        "tsk_opd_num": 1,
        **_typ(x),
        **operand("res0", out, explicit=False),
        **operand("opd0", x, explicit=False),
        "opd1_n": 1,
        "opd1_c": 1,
        "opd1_h": win.kh,
        "opd1_w": win.kw,
        **win.fields(),
        "pad_value": pad_value,
    }


def avg_pool(out: LTensor, x: LTensor, win: Window, multiplier: int, rshift: int, relu: bool) -> dict[str, int]:
    """int8: sum * multiplier >> rshift; bf16: sum * multiplier where multiplier is the bf16 of 1/(kh*kw)."""
    return {
        "tsk_typ": 1,
        "tsk_eu_typ": 1,
        "tsk_opd_num": 2,
        **_typ(x),
        **operand("res0", out, explicit=False),
        **operand("opd0", x, explicit=False),
        "opd1_n": 1,
        "opd1_c": 1,
        "opd1_h": win.kh,
        "opd1_w": win.kw,
        "opt_opd1_const": 1,
        "opd1_addr": multiplier,
        "opt_opd1_sign": 0,
        "opt_res_shift": rshift,
        **win.fields(),
        "opt_relu_typ": int(relu),
    }


def _elementwise(eu: int, out: LTensor, a: LTensor, b: LTensor | int) -> dict[str, int]:
    f = {"tsk_typ": 3, "tsk_eu_typ": eu, "tsk_opd_num": 2, **_typ(a), **operand("res0", out), **operand("opd0", a)}
    if isinstance(b, LTensor):
        f.update(operand("opd1", b))
    else:
        raw = int(b) & (0xFFFF if a.fmt == "bf16" else 0xFF)  # an int8 constant is one signed byte
        f.update({"opt_opd1_const": 1, "opd1_addr": raw, **{f"opd1_{d}": v for d, v in zip("nchw", a.shape)}})
        f["short_opd1_str"] = EXPLICIT
    return f


def mul(out: LTensor, a: LTensor, b: LTensor | int, rshift: int = 0, relu: bool = False,
        out16_plane: int | None = None) -> dict[str, int]:  # fmt: skip
    """a * b >> rshift; `out16_plane` keeps an int16 result as low/high byte planes that far apart."""
    f = _elementwise(0, out, a, b)
    f.update({"opt_res_shift": rshift, "opt_relu_typ": int(relu)})
    if out16_plane is not None:
        f.update({"opt_res0_seg": 0, "res0_b_str": out16_plane})
    return f


def mul_qm(out: LTensor, a: LTensor, b: LTensor | int, multiplier: int, rshift: int, relu: bool) -> dict[str, int]:
    """a * b requantized with a 32-bit QDM multiplier and a right shift."""
    f = _elementwise(0, out, a, b)
    f.update({"opt_chl_quan": 1, "quan_m": multiplier, "opt_res_shift": rshift, "opt_relu_typ": int(relu)})
    return f


def mac(out: LTensor, a: LTensor, b: LTensor | int, plane: int, rshift: int, relu: bool, final: bool) -> dict[str, int]:
    """acc16 + a * b, where acc16 is the int16 held as byte planes at out.addr and out.addr + plane; the final
    MAC shifts right and writes int8, earlier ones keep 16 bits."""
    f = _elementwise(1, out, a, b)
    f.update({"opt_res_add": 1, "opt_left_shift": 0, "res0_b_str": plane, "opt_relu_typ": int(relu)})
    f.update({"opt_res_shift": rshift} if final else {"opt_res_shift": 0, "opt_res0_seg": 0})
    return f


def add(out: LTensor, a: LTensor, b: LTensor | int) -> dict[str, int]:
    """bf16 a + b (one rounding of the fp32 sum)."""
    return {**_elementwise(2, out, a, b), "opt_res_shift": 0, "opt_relu_typ": 0}


def sub(out: LTensor, a: LTensor, b: LTensor | int) -> dict[str, int]:
    """bf16 a - b (one rounding of the fp32 difference)."""
    return {**_elementwise(3, out, a, b), "opt_res_shift": 0, "opt_relu_typ": 0}


def maximum(out: LTensor, a: LTensor, b: LTensor | int) -> dict[str, int]:
    return _elementwise(4, out, a, b)


def minimum(out: LTensor, a: LTensor, b: LTensor | int) -> dict[str, int]:
    return _elementwise(5, out, a, b)


def copy(out: LTensor, a: LTensor) -> dict[str, int]:
    f = _elementwise(10, out, a, 0)
    f.update({"tsk_opd_num": 1, "opt_opd1_const": 0})
    return f


def xor_zero(t: LTensor) -> dict[str, int]:
    """t ^= t: zero a tile (the low halves of fp32 words built from bf16)."""
    f = _elementwise(9, t, t, t)
    f.update({"opt_res0_sign": 0, "opt_opd0_sign": 0, "opt_opd1_sign": 0, "opd_typ": 0})
    return f


def matmul(out: LTensor, left: LTensor, right: LTensor, bias: LTensor | None, k: int, multiplier: int,
           rshift: int, relu: bool) -> dict[str, int]:  # fmt: skip
    """out = left @ right (+ bias) in the local matrix layout (rows, col groups, 1, group width)."""
    f = {
        "tsk_typ": 2,
        "tsk_opd_num": 3 if bias is not None else 2,
        **_typ(left),
        **operand("res0", out, explicit=False),
        **operand("opd0", left, explicit=False),
        **operand("opd1", right, explicit=False),
        "opd1_n": k,
        "opt_relu_typ": int(relu),
        "opt_res_shift": rshift,
    }
    if left.fmt == "i8":
        f.update({"opt_chl_quan": 1, "quan_m": multiplier})
    if bias is not None:
        f.update(operand("opd2", bias, explicit=False))
    f.update({"opd2_n": 1, "opt_opd2_seg": 0})  # the simulator requires opd2_n = 1 even without a bias
    return f
