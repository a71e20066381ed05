"""Split a CV18xx cmdbuf into descriptors and print them one per line.

A cmdbuf is a run of `[cmd_hdr_t (8 bytes)][body]` records (specs/cv18xx.md §3.1): TIU bodies are 112 bytes
and TDMA bodies 64, each decoded with the chip's field table from `isa`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from npuc.backends.cv18xx import isa
from npuc.backends.cv18xx.chips import ChipSpec
from npuc.compiler.errors import CorruptFileError

BODY_BYTES = {isa.ENGINE_TIU: isa.TIU_BYTES, isa.ENGINE_TDMA: isa.TDMA_BYTES}

# TIU opcode names by (tsk_typ, tsk_eu_typ); None matches any eu type.
TIU_OPS: dict[tuple[int, int | None], str] = {
    (0, None): "conv",
    (1, 0): "max_pool",
    (1, 1): "avg_pool",
    (1, 2): "depthwise",
    (1, 3): "min_pool",
    (2, None): "matmul",
    **{
        (3, i): op
        for i, op in enumerate(
            ["mul", "mac", "add", "sub", "max", "min", "shift", "and", "or", "xor", "copy", "ge", "lookup"]
        )
    },
}
TDMA_DIRS = {0: "load", 1: "store", 2: "g2g", 3: "l2l"}
TDMA_FUNCS = {0: "", 1: ".transpose", 4: ".fill"}
_FMT_NAMES = {1: "i8", 2: "bf16"}
# Which side of each TDMA direction is global memory: (src, dst).
_GLOBAL_SIDES = {0: (True, False), 1: (False, True), 2: (True, True), 3: (False, False)}


@dataclass
class Instruction:
    offset: int  # byte offset of the cmd_hdr inside the cmdbuf
    engine: int
    header: dict[str, int]
    fields: dict[str, int]  # decoded body (empty for CPU descriptors, which have no table)
    body: bytes

    @property
    def engine_name(self) -> str:
        return isa.ENGINE_NAMES[self.engine]


def body_table(engine: int, chip: ChipSpec) -> isa.FieldTable:
    return isa.tiu_table(chip.tiu_layout) if engine == isa.ENGINE_TIU else isa.tdma_table()


def split_cmdbuf(data: bytes, chip: ChipSpec, where: str = "cmdbuf") -> list[Instruction]:
    """Decode every descriptor; raises CorruptFileError on a bad magic, engine, length or truncation."""
    out: list[Instruction] = []
    pos = 0
    while pos < len(data):
        if pos + isa.CMD_HDR_BYTES > len(data):
            raise CorruptFileError(f"{where}: truncated cmd_hdr at byte {pos} of {len(data)}")
        hdr = isa.decode(isa.cmd_hdr_table(), data[pos : pos + isa.CMD_HDR_BYTES])
        if hdr["magic"] != chip.cmd_magic:
            raise CorruptFileError(
                f"{where}: descriptor at byte {pos} has magic {hdr['magic']:#04x}, "
                f"expected {chip.cmd_magic:#04x} for {chip.name}; the cmdbuf was built for another chip"
            )
        engine, length = hdr["engine_id"], hdr["len"] or hdr["mask"]
        if engine not in isa.ENGINE_NAMES:
            raise CorruptFileError(f"{where}: descriptor at byte {pos} has unknown engine id {engine}")
        expected = BODY_BYTES.get(engine)
        if expected is not None and length != expected:
            raise CorruptFileError(
                f"{where}: {isa.ENGINE_NAMES[engine]} descriptor at byte {pos} is {length} bytes, expected {expected}"
            )
        start = pos + isa.CMD_HDR_BYTES
        if start + length > len(data):
            raise CorruptFileError(f"{where}: descriptor at byte {pos} ({length} bytes) runs past the end")
        body = data[start : start + length]
        fields = isa.decode(body_table(engine, chip), body) if expected is not None else {}
        out.append(Instruction(pos, engine, hdr, fields, body))
        pos = start + length
    return out


def join_cmdbuf(instructions: list[Instruction], chip: ChipSpec) -> bytes:
    """Re-encode headers and bodies from their fields (the inverse of split_cmdbuf)."""
    parts = []
    for ins in instructions:
        parts.append(isa.encode(isa.cmd_hdr_table(), ins.header))
        parts.append(isa.encode(body_table(ins.engine, chip), ins.fields) if ins.fields else ins.body)
    return b"".join(parts)


def tiu_op_name(f: dict[str, int]) -> str:
    typ, eu = f["tsk_typ"], f["tsk_eu_typ"]
    if f.get("tens_lookup"):
        return "lookup"
    return TIU_OPS.get((typ, None)) or TIU_OPS.get((typ, eu)) or f"tiu{typ}.{eu}"


def _shape(f: dict[str, int], prefix: str) -> str:
    return "x".join(str(f.get(f"{prefix}_{d}", "?")) for d in "nchw")


def _tiu_line(f: dict[str, int]) -> str:
    op = tiu_op_name(f)
    dtype = "bf16" if f["opd_typ"] else "i8"
    parts = [
        f"res0=L{f['res0_addr']:#x}[{_shape(f, 'res0')}]",
        f"opd0=L{f['opd0_addr']:#x}[{_shape(f, 'opd0')}]",
    ]
    if f["opt_opd1_const"]:
        parts.append(f"opd1=#{f['opd1_addr']}")
    elif op not in ("max_pool", "min_pool", "copy"):
        parts.append(f"opd1=L{f['opd1_addr']:#x}")
    if op in ("conv", "depthwise", "max_pool", "min_pool", "avg_pool"):
        parts.append(f"k={f['opd1_h']}x{f['opd1_w']} s={f['conv_op_y_str']}x{f['conv_op_x_str']}")
        pads = [f[f"conv_opd0_{p}_pad"] for p in ("up", "dn", "lf", "rt")]
        if any(pads):
            parts.append("pad=" + ",".join(map(str, pads)))
    if f["opt_chl_quan"] or f["tsk_opd_num"] == 3:
        parts.append(f"opd2=L{f['opd2_addr']:#x}")
    shift = f.get("opt_res_shift", f.get("opt_right_shift", 0))
    if shift and not f["opt_chl_quan"]:
        parts.append(f"rshift={shift}")
    if f.get("opt_relu_typ", f.get("opt_relu", 0)):
        parts.append("relu")
    if f["opt_res_add"]:
        parts.append("acc")
    sync = f"TIU#{f['cmd_id_tpu']:<5} wait TDMA#{f['cmd_id_gdma']:<5}"
    return f"{sync} {op + '.' + dtype:<14} " + " ".join(parts)


def _tdma_addr(f: dict[str, int], side: str, is_global: bool, chip: ChipSpec) -> str:
    addr = (f[f"{side}_base_addr_high"] << 32) | f[f"{side}_base_addr_low"]
    if is_global:
        return f"G{f[f'{side}_base_reg_sel']}+{addr - chip.gmem_base:#x}"
    return f"L{addr:#x}"


def _tdma_line(f: dict[str, int], chip: ChipSpec) -> str:
    direction = f["trans_dir"]
    op = TDMA_DIRS[direction] + TDMA_FUNCS.get(f["spec_func"], f".func{f['spec_func']}")
    op += ".vlc" if f["compress_en"] else ""  # the source is a VLC buffer (compression.py)
    fmts = [_FMT_NAMES.get(f[k], f"fmt{f[k]}") for k in ("src_fmt", "dst_fmt")]
    fmt = fmts[0] if fmts[0] == fmts[1] else ">".join(fmts)
    src_g, dst_g = _GLOBAL_SIDES[direction]
    src_shape = f"{f['src_n']}x{f['src_c']}x{f['src_h']}x{f['src_w']}"
    dst_shape = f"{f['src_n']}x{f['dst_c']}x{f['dst_h']}x{f['dst_w']}"
    src = "#" + str(f["const_val"]) if f["spec_func"] == 4 else f"{_tdma_addr(f, 'src', src_g, chip)}[{src_shape}]"
    sync = f"TDMA#{f['cmd_id']:<4} wait TIU#{f['wait_id_tpu']:<6}"
    return f"{sync} {op + '.' + fmt:<14} {_tdma_addr(f, 'dst', dst_g, chip)}[{dst_shape}] <- {src}"


def disassemble(instructions: list[Instruction], chip: ChipSpec) -> list[str]:
    """One readable line per descriptor: byte offset, engine, sync ids, opcode and its key operands."""
    lines = []
    for ins in instructions:
        if ins.engine == isa.ENGINE_TIU:
            text = _tiu_line(ins.fields)
        elif ins.engine == isa.ENGINE_TDMA:
            text = _tdma_line(ins.fields, chip)
        else:
            text = f"CPU  {len(ins.body)}-byte descriptor"
        lines.append(f"{ins.offset:06x}  {text}")
    return lines


def decode_summary(instructions: list[Instruction]) -> dict[str, Any]:
    """Counts per engine and per opcode, for reports and tests."""
    counts: dict[str, int] = {}
    for ins in instructions:
        key = ins.engine_name
        if ins.engine == isa.ENGINE_TIU:
            key += "." + tiu_op_name(ins.fields)
        elif ins.engine == isa.ENGINE_TDMA:
            key += "." + TDMA_DIRS[ins.fields["trans_dir"]]
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
