"""BMKernel cmdbuf: split into instructions, decode/encode descriptors, relocate, disassemble.

A cmdbuf is back-to-back `cmd_hdr_t` (8 bytes) + descriptor. GDMA gmem operands are written as
GMEM_BASE + offset; the header flag says whether the offset is into the neuron area or the weight blob,
and the runtime adds the real base by direction (specs/bm1880.md §2.3–2.4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npuc.compiler.errors import CorruptFileError

from . import isa

# Which GDMA operands live in gmem, by direction: S2L loads (src), L2S stores (dst), S2S both, L2L none.
GMEM_OPERANDS: dict[str, tuple[str, ...]] = {
    "S2L": ("src_addr",),
    "L2S": ("dst_addr",),
    "S2S": ("src_addr", "dst_addr"),
    "L2L": (),
}
AREA_FLAGS = {isa.FLAG_NEURON: "neuron", isa.FLAG_WEIGHT: "weight"}


@dataclass(frozen=True)
class Instruction:
    """One cmdbuf command: header fields plus the decoded descriptor (or raw payload for CPU ops)."""

    offset: int  # byte offset of the header in the cmdbuf
    engine: int
    flags: int
    payload: bytes
    header: dict[str, int] = field(default_factory=dict)
    fields: dict[str, int] | None = None  # None for engines without a field table (CPU)

    @property
    def mnemonic(self) -> str:
        return isa.ENGINES[self.engine].mnemonic

    def encode(self) -> bytes:
        """Header + descriptor bytes, re-encoded from the decoded fields."""
        table = isa.ENGINES[self.engine].table
        payload = table.encode(self.fields) if table is not None and self.fields is not None else self.payload
        return isa.CMD_HDR.encode(self.header) + payload


def make_instruction(engine: int, fields: dict[str, int], flags: int = 0) -> Instruction:
    """A new BD/GDMA instruction (header magic and length filled in) from descriptor field values."""
    table = isa.ENGINES[engine].table
    if table is None:
        raise ValueError(f"engine {engine} has no descriptor table; build its payload directly")
    payload = table.encode(fields)
    header = {"magic": isa.CMD_HDR_MAGIC, "len": table.size, "engine_id": engine, "flags": flags}
    return Instruction(0, engine, flags, payload, header, table.decode(payload))


def encode_cmdbuf(instructions: list[Instruction]) -> bytes:
    return b"".join(instruction.encode() for instruction in instructions)


def decode_cmdbuf(cmdbuf: bytes, source: str = "cmdbuf") -> list[Instruction]:
    """Split and decode; unknown magic/engine, wrong descriptor length or truncation -> CorruptFileError."""
    out: list[Instruction] = []
    pos = 0
    while pos < len(cmdbuf):
        if pos + isa.CMD_HDR_SIZE > len(cmdbuf):
            raise CorruptFileError(
                f"{source}: offset {pos}: truncated command header ({len(cmdbuf) - pos} of {isa.CMD_HDR_SIZE} bytes)"
            )
        header = isa.CMD_HDR.decode(cmdbuf[pos : pos + isa.CMD_HDR_SIZE])
        if header["magic"] != isa.CMD_HDR_MAGIC:
            raise CorruptFileError(
                f"{source}: offset {pos}: command header magic 0x{header['magic']:02X}, "
                f"expected 0x{isa.CMD_HDR_MAGIC:02X}; the cmdbuf is corrupt"
            )
        length = header["len"] or header["mask"]  # len 0 = long command, length in `mask`
        engine = isa.ENGINES.get(header["engine_id"])
        if engine is None:
            raise CorruptFileError(
                f"{source}: offset {pos}: unknown engine id {header['engine_id']}; "
                "the cmdbuf is corrupt or not for BM1880"
            )
        if engine.table is not None and length != engine.table.size:
            raise CorruptFileError(
                f"{source}: offset {pos}: {engine.mnemonic} command of {length} bytes, "
                f"expected {engine.table.size}; the cmdbuf is corrupt"
            )
        end = pos + isa.CMD_HDR_SIZE + length
        if end > len(cmdbuf):
            raise CorruptFileError(
                f"{source}: offset {pos}: {engine.mnemonic} command of {length} bytes "
                f"runs past the end of the {len(cmdbuf)}-byte cmdbuf"
            )
        payload = cmdbuf[pos + isa.CMD_HDR_SIZE : end]
        fields = engine.table.decode(payload) if engine.table is not None else None
        out.append(Instruction(pos, header["engine_id"], header["flags"], payload, header, fields))
        pos = end
    return out


@dataclass(frozen=True)
class GmemRef:
    """A GDMA gmem operand: which descriptor field, which area, and the byte offset into that area."""

    operand: str  # "src_addr" | "dst_addr"
    area: str  # "neuron" | "weight"
    offset: int


def gdma_direction(instruction: Instruction) -> str:
    return isa.GDMA_DIRECTIONS[instruction.fields["direction"]]


def gmem_refs(instruction: Instruction, source: str = "cmdbuf") -> list[GmemRef]:
    """The relocatable gmem operands of a GDMA instruction (empty for other engines and L2L)."""
    if instruction.engine != isa.ENGINE_GDMA:
        return []
    operands = GMEM_OPERANDS[gdma_direction(instruction)]
    if not operands:
        return []
    area = AREA_FLAGS.get(instruction.flags)
    if area is None:
        raise CorruptFileError(
            f"{source}: offset {instruction.offset}: GDMA with gmem operand has flags "
            f"{instruction.flags}, expected 1 (neuron) or 2 (weight)"
        )
    refs = []
    for operand in operands:
        address = instruction.fields[operand]
        if address < isa.GMEM_BASE:
            raise CorruptFileError(
                f"{source}: offset {instruction.offset}: GDMA {operand} 0x{address:X} is "
                f"not a relocatable gmem address (>= 0x{isa.GMEM_BASE:X})"
            )
        refs.append(GmemRef(operand, area, address - isa.GMEM_BASE))
    return refs


def relocate(cmdbuf: bytes, neuron_base: int, weight_base: int, source: str = "cmdbuf") -> bytes:
    """What the runtime does at load time: add the area bases to every GDMA gmem operand."""
    bases = {"neuron": neuron_base, "weight": weight_base}
    out = []
    for instruction in decode_cmdbuf(cmdbuf, source):
        refs = gmem_refs(instruction, source)
        if refs:
            fields = dict(instruction.fields)
            for ref in refs:
                fields[ref.operand] = bases[ref.area] + ref.offset
            instruction = Instruction(
                instruction.offset, instruction.engine, instruction.flags, b"", instruction.header, fields
            )
        out.append(instruction.encode())
    return b"".join(out)


# ---------------------------------------------------------------------------------------------------
# disassembly: a short summary per engine, then every other non-zero field


def _dims(fields: dict[str, int], prefix: str, names: str = "nchw") -> str:
    return "x".join(str(fields[f"{prefix}_{d}"]) for d in names)


def _bd_summary(fields: dict[str, int]) -> tuple[str, set[str]]:
    task = isa.BD_TASK_TYPES.get(fields["tsk_typ"], f"task{fields['tsk_typ']}")
    if task == "arith":
        task += "." + isa.ARITH_EU_TYPES.get(fields["tsk_eu_typ"], str(fields["tsk_eu_typ"]))
    text = (
        f"{task:<10} id={fields['cmd_id_tpu']} wait_gdma={fields['cmd_id_gdma']} "
        f"res0={_dims(fields, 'res0')}@0x{fields['res0_addr']:X} "
        f"opd0={_dims(fields, 'opd0')}@0x{fields['opd0_addr']:X} rshift={fields['opt_right_shift']}"
    )
    used = {"tsk_typ", "cmd_id_tpu", "cmd_id_gdma", "res0_addr", "opd0_addr", "opt_right_shift"}
    used |= {f"res0_{d}" for d in "nchw"} | {f"opd0_{d}" for d in "nchw"}
    if task.startswith("arith"):
        used.add("tsk_eu_typ")
    return text, used


def _gdma_operand(fields: dict[str, int], operand: str, area: str | None) -> str:
    address = fields[operand]
    if address >= isa.GMEM_BASE and area:
        return f"{area}+0x{address - isa.GMEM_BASE:X}"
    if isa.LMEM_BASE <= address < isa.GMEM_BASE:
        return f"lmem:0x{address - isa.LMEM_BASE:X}"
    return f"0x{address:X}"


def _gdma_summary(fields: dict[str, int], flags: int) -> tuple[str, set[str]]:
    direction = isa.GDMA_DIRECTIONS[fields["direction"]]
    area = AREA_FLAGS.get(flags)
    src = _gdma_operand(fields, "src_addr", area)
    dst = _gdma_operand(fields, "dst_addr", area)
    text = (
        f"{direction:<10} id={fields['cmd_id']} wait_bd={fields['wait_bd_id']} "
        f"{src} {fields['src_n']}x{_dims(fields, 'src', 'chw')} -> {dst} {_dims(fields, 'dst', 'chw')}"
    )
    used = {"direction", "cmd_id", "wait_bd_id", "src_addr", "dst_addr", "src_n"}
    used |= {f"{side}_{d}" for side in ("src", "dst") for d in "chw"}
    return text, used


def format_instruction(instruction: Instruction) -> str:
    """One line: offset, engine, summary, then the remaining non-zero fields as name=value."""
    head = f"{instruction.offset:06X}  {instruction.mnemonic:<4}"
    if instruction.fields is None:
        name = instruction.payload[28:60].split(b"\0", 1)[0].decode("ascii", "replace")
        return f"{head} {'cpu':<10} {len(instruction.payload)} bytes op={name!r} flags={instruction.flags}"
    if instruction.engine == isa.ENGINE_BD:
        summary, used = _bd_summary(instruction.fields)
    else:
        summary, used = _gdma_summary(instruction.fields, instruction.flags)
    rest = " ".join(f"{k}={v}" for k, v in instruction.fields.items() if v and k not in used)
    return f"{head} {summary}" + (f" | {rest}" if rest else "")


def disassemble(cmdbuf: bytes, source: str = "cmdbuf") -> str:
    """One line per instruction (newline-terminated)."""
    return "".join(format_instruction(i) + "\n" for i in decode_cmdbuf(cmdbuf, source))
