"""BM1880 BMKernel instruction formats as field tables, with one generic codec for encode and decode.

A field table is a list of (name, bit offset, width) over a little-endian descriptor (bit 0 = LSB of
byte 0). A name listed more than once is one value split over several bit ranges, low part first (the
40-bit GDMA addresses and 32-bit c-strides are stored that way). Facts: specs/bm1880.md §2.3–2.6.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Engines of cmd_hdr_t.engine_id (bm_kernel_legacy.h).
ENGINE_BD = 0
ENGINE_CPU = 1
ENGINE_GDMA = 2
ENGINE_CDMA = 3

CMD_HDR_MAGIC = 0xA5
CMD_HDR_SIZE = 8
FLAG_NEURON = 1  # GDMA gmem operand is an offset into the neuron (activation) area
FLAG_WEIGHT = 2  # GDMA gmem operand is an offset into the command's weight blob

GMEM_BASE = 0x1_0000_0000  # gmem addresses in a cmdbuf are GMEM_BASE + area offset before relocation
LMEM_BASE = 0x0800_0000  # lmem addresses in GDMA descriptors
NPU_NUM = 32
EU_NUM = 16
LMEM_SIZE = 65536  # bytes per NPU
BD_MAX_CHANNELS = (1 << 12) - 1  # a BD's res0_c / opd0_c fields are 12 bits (§2.5)
LMEM_BANKS = 8

# GDMA direction (word0 bits 6-7) and BD task types (reg_bdcast.h).
GDMA_DIRECTIONS = {0: "S2L", 1: "L2S", 2: "S2S", 3: "L2L"}
BD_TASK_TYPES = {0: "conv", 1: "dwpool", 2: "fc", 3: "arith", 4: "fc2"}
ARITH_EU_TYPES = {
    0: "mul", 1: "mac", 2: "add", 3: "sub", 4: "max", 5: "min", 6: "shift",
    7: "and", 8: "or", 9: "xor", 10: "copy",
}  # fmt: skip


@dataclass(frozen=True)
class FieldTable:
    """A fixed-size descriptor layout; `encode(decode(b)) == b` for every byte string of `size` bytes."""

    name: str
    size: int  # bytes
    fields: tuple[tuple[str, int, int], ...]
    parts: dict[str, tuple[tuple[int, int, int], ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        covered = 0
        parts: dict[str, list[tuple[int, int, int]]] = {}
        for name, offset, width in self.fields:
            if width <= 0 or offset < 0 or offset + width > self.size * 8:
                raise ValueError(f"{self.name}.{name}: bits {offset}+{width} outside {self.size} bytes")
            mask = ((1 << width) - 1) << offset
            if covered & mask:
                raise ValueError(f"{self.name}.{name}: bits {offset}+{width} overlap another field")
            covered |= mask
            shift = sum(w for _, w, _ in parts.get(name, []))
            parts.setdefault(name, []).append((offset, width, shift))
        if covered != (1 << (self.size * 8)) - 1:
            raise ValueError(f"{self.name}: fields do not cover all {self.size * 8} bits")
        object.__setattr__(self, "parts", {k: tuple(v) for k, v in parts.items()})

    def width(self, name: str) -> int:
        return sum(w for _, w, _ in self.parts[name])

    def decode(self, data: bytes) -> dict[str, int]:
        """All fields (in table order of first appearance) of one descriptor."""
        if len(data) != self.size:
            raise ValueError(f"{self.name} descriptor is {self.size} bytes, got {len(data)}")
        bits = int.from_bytes(data, "little")
        out: dict[str, int] = {}
        for name, parts in self.parts.items():
            value = 0
            for offset, width, shift in parts:
                value |= ((bits >> offset) & ((1 << width) - 1)) << shift
            out[name] = value
        return out

    def encode(self, values: dict[str, int]) -> bytes:
        """Descriptor bytes; fields not given are 0. Unknown names or out-of-range values raise ValueError."""
        bits = 0
        for name, value in values.items():
            parts = self.parts.get(name)
            if parts is None:
                raise ValueError(f"{self.name} has no field {name!r}")
            if not 0 <= value < (1 << self.width(name)):
                raise ValueError(f"{self.name}.{name} = {value} does not fit {self.width(name)} bits")
            for offset, width, shift in parts:
                bits |= ((value >> shift) & ((1 << width) - 1)) << offset
        return bits.to_bytes(self.size, "little")


def _seq(start: int, width: int, names: list[str]) -> list[tuple[str, int, int]]:
    """Consecutive fields of equal width."""
    return [(name, start + i * width, width) for i, name in enumerate(names)]


CMD_HDR = FieldTable(
    "cmd_hdr",
    CMD_HDR_SIZE,
    (("magic", 0, 8), ("len", 8, 8), ("engine_id", 16, 4), ("deprecated", 20, 4), ("flags", 24, 8),
     ("mask", 32, 32)),
)  # fmt: skip

_FLAG_NAMES_W2 = [
    "opt_relu", "opt_left_tran", "opt_winograd", "tens_mdsum", "tens_lookup",
    "opt_res0_sign", "opt_opd0_sign", "opt_opd1_sign", "opt_opd2_sign",
    "opt_res0_int8", "opt_opd0_int8", "opt_opd1_int8", "opt_opd2_int8",
    "opt_opd0_const", "opt_opd1_const", "opt_opd2_const", "short_nchwstr_same",
]  # fmt: skip

# BD / TIU descriptor: 28 words = 112 bytes (bm1880_reg.h).
BD = FieldTable(
    "bd",
    112,
    tuple(
        [("cmd_en", 0, 1), ("cmd_end", 1, 1), ("cmd_id_en", 2, 1), ("cmd_id_tpu", 3, 16),
         ("cmd_id_gdma", 19, 16), ("cmd_keep", 35, 1), ("cmd_intr_en", 36, 1), ("tsk_typ", 37, 4),
         ("tsk_eu_typ", 41, 8), ("tsk_opd_num", 49, 2), ("opt_right_shift", 51, 5),
         ("opt_left_shift", 56, 5), ("opt_shift_typ", 61, 1), ("opt_rshift_typ", 62, 1),
         ("opt_res_add", 63, 1)]
        + _seq(64, 1, _FLAG_NAMES_W2)
        + _seq(81, 2, ["short_res0_str", "short_opd0_str", "short_opd1_str", "short_opd2_str"])
        + _seq(89, 4, ["conv_opd0_x_ins0", "conv_opd0_y_ins0", "conv_opd0_x_ins0_last",
                       "conv_opd0_y_ins0_last", "conv_opd1_x_ins0", "conv_opd1_y_ins0"])
        + [("opd0_ins_val", 113, 8), ("rsvd0", 121, 7)]
        + _seq(128, 12, ["res0_n", "res0_c", "res0_h", "res0_w"])
        + [("res0_addr", 176, 24), ("opd0_addr", 200, 24), ("opd1_addr", 224, 16), ("rsvd1", 240, 16),
           ("opd2_addr", 256, 16)]
        + _seq(272, 12, ["opd0_c", "opd0_h", "opd0_w", "opd1_h", "opd1_w"])
        + _seq(332, 4, ["conv_opd0_up_pad", "conv_opd0_dn_pad", "conv_opd0_lf_pad", "conv_opd0_rt_pad",
                        "conv_op_x_str", "conv_op_y_str"])
        + [("rsvd2", 356, 28)]
        + _seq(384, 12, ["opd0_n", "opd1_n", "opd1_c", "opd2_n", "opd2_c", "opd2_h", "opd2_w"])
        + [("rsvd3", 468, 44)]
        + _seq(512, 16, ["res0_n_str", "res0_c_str", "res0_h_str", "res0_w_str", "res0_b_str",
                         "opd0_n_str", "opd0_c_str", "rsvd4", "opd0_h_str", "opd0_w_str", "opd0_b_str",
                         "opd1_n_str", "opd1_c_str", "opd1_h_str", "opd1_w_str", "rsvd5", "opd1_b_str",
                         "opd2_n_str", "opd2_c_str", "opd2_h_str", "opd2_w_str", "opd2_b_str"])
        + [("rsvd6", 864, 32)]
    ),
)  # fmt: skip

# GDMA descriptor: 16 words = 64 bytes (bm1880_gdma_reg.h). Addresses are 40 bits (low32 + high8),
# c-strides 32 bits (low16 + high16): split fields, low part listed first.
GDMA = FieldTable(
    "gdma",
    64,
    (
        ("valid", 0, 1), ("cmd_type", 1, 1), ("eod", 2, 1), ("intr_en", 3, 1), ("barrier", 4, 1),
        ("stride_en", 5, 1), ("direction", 6, 2), ("broadcast", 8, 1), ("add_result", 9, 1),
        ("common_mode", 10, 1), ("rsvd0", 11, 1), ("hold_value", 12, 1), ("rsvd1", 13, 3),
        ("cmd_id", 16, 16),
        ("special_func", 32, 3), ("dst_fmt", 35, 2), ("src_fmt", 37, 3), ("is_matrix", 40, 1),
        ("winograd_scale", 41, 4), ("lrn_dir", 45, 1), ("chw_share", 46, 1), ("rsvd2", 47, 1),
        ("wait_bd_id", 48, 16),
        ("rsvd3", 64, 32),
        ("const_value", 96, 8), ("rsvd4", 104, 24),
        ("dst_h_stride", 128, 16), ("dst_c_stride", 144, 16), ("dst_n_stride", 160, 32),
        ("src_h_stride", 192, 16), ("src_c_stride", 208, 16), ("src_n_stride", 224, 32),
        ("dst_c", 256, 16), ("src_c", 272, 16), ("dst_w", 288, 16), ("dst_h", 304, 16),
        ("src_w", 320, 16), ("src_h", 336, 16),
        ("dst_addr", 352, 32), ("src_addr", 384, 32),
        ("src_n", 416, 16), ("dst_addr", 432, 8), ("src_addr", 440, 8),
        ("src_c_stride", 448, 16), ("dst_c_stride", 464, 16),
        ("rsvd5", 480, 32),
    ),
)  # fmt: skip


@dataclass(frozen=True)
class EngineFormat:
    """How one engine's commands look in a cmdbuf: mnemonic and descriptor table (None = opaque bytes)."""

    mnemonic: str
    table: FieldTable | None


ENGINES: dict[int, EngineFormat] = {
    ENGINE_BD: EngineFormat("BD", BD),
    ENGINE_CPU: EngineFormat("CPU", None),
    ENGINE_GDMA: EngineFormat("GDMA", GDMA),
}


def gmem_address(offset: int) -> int:
    """The unrelocated gmem address the compiler writes for an offset into the neuron or weight area."""
    return GMEM_BASE + offset


def lmem_address(laddr: int) -> int:
    """GDMA lmem address of local-memory byte offset `laddr`."""
    return LMEM_BASE + laddr
