"""Instruction emission for BM1880 codegen: local tensors, BD operand fields, GDMA moves, sync ids.

Forms follow the vendor's production cmdbufs (see `npuc inspect --disasm` on golden/bm1880): GDMA int8 tensor
moves with src_fmt 4 / dst_fmt 1 / chw_share, gmem operands as GMEM_BASE + offset with the NEURON or WEIGHT
header flag; BD activations in the EU-aligned default layout. Sync: every BD waits for the newest GDMA and
every GDMA for the newest BD, so the two engines run in program order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import isa
from .cmdbuf import Instruction, make_instruction

Shape4 = tuple[int, int, int, int]
ID_MASK = 0xFFFF  # 16-bit sync ids; they wrap on very long programs


def align(value: int, to: int = isa.EU_NUM) -> int:
    return -(-value // to) * to


def lane_blocks(c: int) -> int:
    return -(-c // isa.NPU_NUM)


@dataclass(frozen=True)
class LTensor:
    """A tensor in local memory: channel c in lane c % 32; `aligned` = EU-aligned channel stride.
    `fixed`: the strides of a larger tensor this one is a view of (rows of a tile that holds more)."""

    addr: int
    shape: Shape4
    aligned: bool = True
    fixed: Shape4 | None = None

    @property
    def strides(self) -> Shape4:
        if self.fixed is not None:
            return self.fixed
        n, c, h, w = self.shape
        c_str = align(h * w) if self.aligned else h * w
        return (lane_blocks(c) * c_str, c_str, w, 1)

    def rows(self, held_from: int, rows: tuple[int, int]) -> LTensor:
        """Rows `rows` of this tensor, which holds rows from `held_from` on, as a view with its strides."""
        n, c, h, w = self.shape
        if rows == (held_from, held_from + h):
            return self
        offset = (rows[0] - held_from) * self.strides[2]
        return LTensor(self.addr + offset, (n, c, rows[1] - rows[0], w), self.aligned, self.strides)

    @property
    def lane_bytes(self) -> int:
        return self.shape[0] * self.strides[0]


def tile_bytes(shape: Shape4, aligned: bool = True) -> int:
    """Bytes per lane of an int8 tensor of this shape."""
    return LTensor(0, shape, aligned).lane_bytes


BD_COMMON = dict(cmd_en=1, cmd_id_en=1, opt_left_shift=2, opt_shift_typ=1, opt_rshift_typ=1)
GDMA_COMMON = dict(valid=1, stride_en=1, src_fmt=4, dst_fmt=1, chw_share=1)


def operand(prefix: str, t: LTensor, explicit: bool = False) -> dict[str, int]:
    """BD fields of one tensor operand (addr, n/c/h/w); explicit = stride mode 3 with the strides written."""
    fields = {f"{prefix}_addr": t.addr} | {f"{prefix}_{d}": v for d, v in zip("nchw", t.shape, strict=True)}
    if explicit:
        fields[f"short_{prefix}_str"] = 3
        fields |= {f"{prefix}_{d}_str": v for d, v in zip("nchw", t.strides, strict=True)}
    return fields


@dataclass
class Emitter:
    """The instruction stream of one command with its sync ids and DDR traffic count."""

    instructions: list[Instruction] = field(default_factory=list)
    bd_id: int = 0
    gdma_id: int = 0
    ddr_bytes: int = 0

    def bd(self, fields: dict[str, int]) -> None:
        self.bd_id += 1
        ids = dict(cmd_id_tpu=self.bd_id & ID_MASK, cmd_id_gdma=self.gdma_id & ID_MASK)
        self.instructions.append(make_instruction(isa.ENGINE_BD, BD_COMMON | fields | ids))

    def gdma(self, load: bool, area: int, offset: int, gstrides: tuple[int, int, int], t: LTensor) -> None:
        """Move `t.shape` bytes between gmem area `area` (at `offset`, strides n/c/h) and local tensor `t`."""
        self.gdma_id += 1
        n, c, h, w = t.shape
        lstr = t.strides
        gaddr, laddr = isa.gmem_address(offset), isa.lmem_address(t.addr)
        src, dst = (gaddr, laddr) if load else (laddr, gaddr)
        sstr, dstr = (gstrides, lstr) if load else (lstr, gstrides)
        fields = GDMA_COMMON | dict(
            direction=0 if load else 1, cmd_id=self.gdma_id & ID_MASK, wait_bd_id=self.bd_id & ID_MASK,
            src_addr=src, dst_addr=dst, src_n=n, src_c=c, src_h=h, src_w=w, dst_c=c, dst_h=h, dst_w=w,
            src_n_stride=sstr[0], src_c_stride=sstr[1], src_h_stride=sstr[2],
            dst_n_stride=dstr[0], dst_c_stride=dstr[1], dst_h_stride=dstr[2],
        )  # fmt: skip
        self.instructions.append(make_instruction(isa.ENGINE_GDMA, fields, area))
        self.ddr_bytes += n * c * h * w

    def copy(self, shape: Shape4, src: tuple[int, tuple[int, int, int]], dst: tuple[int, tuple[int, int, int]]) -> None:
        """S2S: `shape` bytes from one neuron-area place to another, each given as (offset, n/c/h strides); w is
        contiguous on both sides. No CHW-share bit, as in the vendor's S2S copies (specs/bm1880.md §2.6)."""
        self.gdma_id += 1
        n, c, h, w = shape
        (soff, sstr), (doff, dstr) = src, dst
        fields = GDMA_COMMON | dict(
            direction=2, chw_share=0, cmd_id=self.gdma_id & ID_MASK, wait_bd_id=self.bd_id & ID_MASK,
            src_addr=isa.gmem_address(soff), dst_addr=isa.gmem_address(doff),
            src_n=n, src_c=c, src_h=h, src_w=w, dst_c=c, dst_h=h, dst_w=w,
            src_n_stride=sstr[0], src_c_stride=sstr[1], src_h_stride=sstr[2],
            dst_n_stride=dstr[0], dst_c_stride=dstr[1], dst_h_stride=dstr[2],
        )  # fmt: skip
        self.instructions.append(make_instruction(isa.ENGINE_GDMA, fields, isa.FLAG_NEURON))
        self.ddr_bytes += 2 * n * c * h * w

    def load_weight(self, offset: int, gstrides: tuple[int, int, int], t: LTensor) -> None:
        self.gdma(True, isa.FLAG_WEIGHT, offset, gstrides, t)
