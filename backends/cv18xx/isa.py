"""CV18xx TPU register layouts as field tables, and one generic codec for all of them.

A layout is written in the spec's notation (specs/cv18xx.md §3.5): `name wN[hi:lo]`, where a field that
crosses a word boundary is `wN[31:x]+wN+1[y:0]`. Because the words are little-endian, every field is one
contiguous run of bits in the descriptor read as a little-endian integer. Bits no field names (reserved
and debug bits, which cvikernel fills with small values) become `_rsvdN` fields, so decode -> encode gives
back the exact bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from npuc.compiler.errors import CorruptFileError

ENGINE_TIU, ENGINE_CPU, ENGINE_TDMA = 0, 1, 2
ENGINE_NAMES = {ENGINE_TIU: "TIU", ENGINE_CPU: "CPU", ENGINE_TDMA: "TDMA"}
TIU_BYTES, TDMA_BYTES, CMD_HDR_BYTES = 112, 64, 8


@dataclass(frozen=True)
class BitField:
    name: str
    bit: int  # offset of the least significant bit in the descriptor
    width: int


@dataclass(frozen=True)
class FieldTable:
    name: str
    size: int  # bytes
    fields: tuple[BitField, ...]

    def field(self, name: str) -> BitField:
        return next(f for f in self.fields if f.name == name)


_PART = re.compile(r"w(\d+)\[(\d+)(?::(\d+))?\]")


def _parse_layout(name: str, size: int, text: str) -> FieldTable:
    fields: list[BitField] = []
    for item in filter(None, (s.strip() for s in re.split(r"[;\n]", text))):
        fname, spec = item.split()
        parts = [(int(w), int(hi), int(lo or hi)) for w, hi, lo in _PART.findall(spec)]
        start = parts[0][0] * 32 + parts[0][2]
        width = sum(hi - lo + 1 for _, hi, lo in parts)
        bit = start
        for w, hi, lo in parts:  # the pieces must continue each other
            if w * 32 + lo != bit:
                raise ValueError(f"layout {name}: pieces of {fname} are not contiguous")
            bit += hi - lo + 1
        fields.append(BitField(fname, start, width))
    fields.sort(key=lambda f: f.bit)
    full: list[BitField] = []
    pos = 0
    for f in fields:
        if f.bit < pos:
            raise ValueError(f"layout {name}: {f.name} overlaps the previous field")
        if f.bit > pos:
            full.append(BitField(f"_rsvd{pos}", pos, f.bit - pos))
        full.append(f)
        pos = f.bit + f.width
    if pos < size * 8:
        full.append(BitField(f"_rsvd{pos}", pos, size * 8 - pos))
    return FieldTable(name, size, tuple(full))


def decode(table: FieldTable, data: bytes) -> dict[str, int]:
    """Split a descriptor into its fields (reserved runs included)."""
    if len(data) != table.size:
        raise CorruptFileError(f"{table.name} descriptor is {len(data)} bytes, expected {table.size}")
    value = int.from_bytes(data, "little")
    return {f.name: (value >> f.bit) & ((1 << f.width) - 1) for f in table.fields}


def encode(table: FieldTable, fields: dict[str, int]) -> bytes:
    """Pack fields into a descriptor; fields not given are 0. Values must fit their width."""
    known = {f.name: f for f in table.fields}
    value = 0
    for name, v in fields.items():
        f = known.get(name)
        if f is None:
            raise KeyError(f"{table.name} has no field {name!r}")
        if not 0 <= v < (1 << f.width):
            raise ValueError(f"{table.name}.{name}={v} does not fit in {f.width} bits")
        value |= v << f.bit
    return value.to_bytes(table.size, "little")


CMD_HDR_LAYOUT = (
    "magic w0[7:0]; len w0[15:8]; engine_id w0[19:16]; deprecated w0[23:20]; flags w0[31:24]; mask w1[31:0]"
)

TIU_CV182X_LAYOUT = """
cmd_en w0[0]; cmd_end w0[1]; cmd_id_en w0[2]; cmd_keep w0[3]; cmd_intr_en w0[4]; tsk_typ w0[8:5]
tsk_eu_typ w0[13:9]; tsk_opd_num w0[15:14]; opt_res_shift w0[21:16]; opt_left_shift w0[26:22]
opt_shift_typ w0[27]; opt_rshift_typ w0[28]; opd_typ w0[30]; opt_chl_quan w0[31]
cmd_id_tpu w1[15:0]; cmd_id_gdma w1[31:16]
quan_m w2[31:0]
opt_res0_sign w3[0]; opt_opd0_sign w3[1]; opt_opd1_sign w3[2]; opt_opd2_sign w3[3]; opt_res0_seg w3[5:4]
opt_opd0_seg w3[7:6]; opt_opd1_seg w3[9:8]; opt_opd2_seg w3[10]; ps32_md w3[12:11]; double_conv w3[13]
opt_left_tran w3[14]; fp_round_typ w3[15]; opt_relu_typ w3[17:16]; opt_relu_value w3[25:18]
cmd_pre_exe_typ w3[26]; opt_res_add w3[27]
conv_opd0_x_ins0 w4[3:0]; conv_opd0_y_ins0 w4[7:4]; conv_opd0_x_ins0_last w4[11:8]
conv_opd0_y_ins0_last w4[15:12]; conv_opd1_x_ins0 w4[19:16]; conv_opd1_y_ins0 w4[23:20]
opd0_ins_val w5[15:0]; conv_opd0_up_pad w5[19:16]; conv_opd0_dn_pad w5[23:20]; conv_opd0_lf_pad w5[27:24]
conv_opd0_rt_pad w5[31:28]
res0_n w6[11:0]; res0_c w6[23:12]; res0_h w6[31:24]+w7[3:0]; res0_w w7[15:4]; conv_op_x_str w7[20:16]
conv_op_y_str w7[25:21]; cmd_pre_exe w7[27:26]
res0_addr w8[23:0]; opd0_addr w8[31:24]+w9[15:0]; opd1_addr w9[31:16]; opd2_addr w10[15:0]
opt_opd0_const w10[16]; opt_opd1_const w10[17]; opt_opd2_const w10[18]; short_nchwstr_same w10[19]
short_res0_str w10[21:20]; short_opd0_str w10[23:22]; short_opd1_str w10[25:24]; short_opd2_str w10[27:26]
opd0_n w11[11:0]; opd0_c w11[23:12]; opd0_h w12[11:0]; opd0_w w12[23:12]; opd1_n w12[31:24]+w13[3:0]
opd1_c w13[15:4]; opd1_h w13[27:16]; opd1_w w13[31:28]+w14[7:0]; opd2_n w14[19:8]; opd2_c w14[31:20]
opd2_h w15[11:0]; opd2_w w15[23:12]
layer_info w16[15:0]; res0_n_str w16[31:16]; res0_c_str w17[15:0]; res0_h_str w17[31:16]
res0_w_str w18[15:0]; res0_b_str w18[31:16]
opd0_n_str w19[15:0]; opd0_c_str w20[15:0]; opd0_h_str w20[31:16]; opd0_w_str w21[15:0]; opd0_b_str w21[31:16]
opd1_n_str w22[15:0]; opd1_c_str w22[31:16]; opd1_h_str w23[15:0]; opd1_w_str w24[15:0]; opd1_b_str w24[31:16]
opd2_n_str w25[15:0]; opd2_c_str w25[31:16]; opd2_h_str w26[15:0]; opd2_w_str w26[31:16]; opd2_b_str w27[15:0]
"""

TIU_CV183X_LAYOUT = """
cmd_en w0[0]; cmd_end w0[1]; cmd_id_en w0[2]; cmd_id_tpu w0[18:3]; cmd_id_gdma w0[31:19]+w1[2:0]
cmd_keep w1[3]; cmd_intr_en w1[4]; tsk_typ w1[8:5]; tsk_eu_typ w1[16:9]; tsk_opd_num w1[18:17]
opt_right_shift w1[23:19]; opt_left_shift w1[28:24]; opt_shift_typ w1[29]; opt_rshift_typ w1[30]
opt_res_add w1[31]
opt_relu w2[0]; opt_left_tran w2[1]; opt_chl_quan w2[2]; tens_mdsum w2[3]; tens_lookup w2[4]
opt_res0_sign w2[5]; opt_opd0_sign w2[6]; opt_opd1_sign w2[7]; opt_opd2_sign w2[8]; opt_res0_int8 w2[9]
opt_opd0_int8 w2[10]; opt_opd1_int8 w2[11]; opt_opd2_int8 w2[12]; opt_opd0_const w2[13]
opt_opd1_const w2[14]; opt_opd2_const w2[15]; short_nchwstr_same w2[16]; short_res0_str w2[18:17]
short_opd0_str w2[20:19]; short_opd1_str w2[22:21]; short_opd2_str w2[24:23]
conv_opd0_x_ins0 w2[28:25]; conv_opd0_y_ins0 w2[31:29]+w3[0]; conv_opd0_x_ins0_last w3[4:1]
conv_opd0_y_ins0_last w3[8:5]; conv_opd1_x_ins0 w3[12:9]; conv_opd1_y_ins0 w3[16:13]
opd0_ins_val w3[24:17]; ps32_md w3[26:25]; double_conv w3[27]
res0_n w4[11:0]; res0_c w4[23:12]; res0_h w4[31:24]+w5[3:0]; res0_w w5[15:4]; res0_addr w5[31:16]+w6[7:0]
opd0_addr w6[31:8]; opd1_addr w7[15:0]; opd2_addr w8[15:0]
opd0_c w8[27:16]; opd0_h w8[31:28]+w9[7:0]; opd0_w w9[19:8]; opd1_h w9[31:20]; opd1_w w10[11:0]
conv_opd0_up_pad w10[15:12]; conv_opd0_dn_pad w10[19:16]; conv_opd0_lf_pad w10[23:20]
conv_opd0_rt_pad w10[27:24]; conv_op_x_str w10[31:28]; conv_op_y_str w11[3:0]; opd0_ins_fp w11[19:4]
opd0_n w12[11:0]; opd1_n w12[23:12]; opd1_c w12[31:24]+w13[3:0]; opd2_n w13[15:4]; opd2_c w13[27:16]
opd2_h w13[31:28]+w14[7:0]; opd2_w w14[19:8]
quan_m w14[31:20]+w15[19:0]; opd_typ w15[20]; fp_round_typ w15[23:21]
res0_n_str w16[15:0]; res0_c_str w16[31:16]; res0_h_str w17[15:0]; res0_w_str w17[31:16]; res0_b_str w18[15:0]
opd0_n_str w18[31:16]; opd0_c_str w19[15:0]; opd0_h_str w20[15:0]; opd0_w_str w20[31:16]; opd0_b_str w21[15:0]
opd1_n_str w21[31:16]; opd1_c_str w22[15:0]; opd1_h_str w22[31:16]; opd1_w_str w23[15:0]; opd1_b_str w24[15:0]
opd2_n_str w24[31:16]; opd2_c_str w25[15:0]; opd2_h_str w25[31:16]; opd2_w_str w26[15:0]
opd2_b_str w26[31:16]
layer_info w27[27:0]
"""

TDMA_LAYOUT = """
vld w0[0]; compress_en w0[1]; eod w0[2]; intp_en w0[3]; bar_en w0[4]; check_bf16_value w0[5]
trans_dir w0[7:6]; trans_fmt w0[10]; transpose_md w0[12:11]; intra_cmd_paral w0[14]; outstanding_en w0[15]
cmd_id w0[31:16]
spec_func w1[2:0]; dst_fmt w1[4:3]; src_fmt w1[6:5]; cmprs_fmt w1[7]; sys_dtype w1[8]; int8_sign w1[13]
compress_zero_guard w1[14]; int8_rnd_mode w1[15]; wait_id_tpu w1[31:16]
wait_id_other_tdma w2[15:0]; wait_id_sdma w2[31:16]
const_val w3[15:0]; src_base_reg_sel w3[18:16]; mv_lut_idx w3[19]; dst_base_reg_sel w3[22:20]
mv_lut_base w3[23]
dst_h_stride w4[15:0]; dst_c_stride_low w4[31:16]; dst_n_stride w5[31:0]
src_h_stride w6[15:0]; src_c_stride_low w6[31:16]; src_n_stride w7[31:0]
dst_c w8[15:0]; src_c w8[31:16]; dst_w w9[15:0]; dst_h w9[31:16]; src_w w10[15:0]; src_h w10[31:16]
dst_base_addr_low w11[31:0]; src_base_addr_low w12[31:0]; src_n w13[15:0]; dst_base_addr_high w13[23:16]
src_base_addr_high w13[31:24]
src_c_stride_high w14[15:0]; dst_c_stride_high w14[31:16]
compress_bias0 w15[7:0]; compress_bias1 w15[15:8]; layer_ID w15[31:16]
"""


@cache
def cmd_hdr_table() -> FieldTable:
    return _parse_layout("cmd_hdr", CMD_HDR_BYTES, CMD_HDR_LAYOUT)


@cache
def tiu_table(layout: str) -> FieldTable:
    """TIU descriptor table: layout "cv183x", or "cv182x" (shared by cv182x, cv181x, cv180x)."""
    text = {"cv183x": TIU_CV183X_LAYOUT, "cv182x": TIU_CV182X_LAYOUT}[layout]
    return _parse_layout(f"TIU({layout})", TIU_BYTES, text)


@cache
def tdma_table() -> FieldTable:
    return _parse_layout("TDMA", TDMA_BYTES, TDMA_LAYOUT)
