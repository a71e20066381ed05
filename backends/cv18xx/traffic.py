"""Global-memory (DDR) traffic of a .cvimodel, counted from its TDMA descriptors.

Every TDMA descriptor of every cmdbuf is decoded and the bytes it reads from or writes to global memory are
summed per region kind (weights / shared / private / io, specs/cv18xx.md §2.2). The global side of a
transfer moves its element count times its element size (int8 1 byte, bf16 2); a matrix-mode move
(`sys_dtype`) moves rows x columns; a decompressing load reads its VLC buffer (header + k-map + stream,
sized from the header stored in the weight section); a constant fill reads nothing. A cmdbuf has no
branches, so this static count is exactly what a run moves.

`lower_bound` is the traffic no schedule can avoid: every weight read once and every TPU routine's input
and output tensors moved once. It is taken at the TPU routines' edges because CPU routines (tpu-mlir's
input `quant`) touch memory without TDMA.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npuc.backends.cv18xx import compression, isa
from npuc.backends.cv18xx.chips import CHIPS, ChipSpec
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf
from npuc.backends.cv18xx.container import CviModel
from npuc.compiler.errors import CorruptFileError

REGION_KINDS = ("weights", "shared", "private", "io")
_REGION_KIND = {0: "shared", 1: "weights", 2: "private", **{i: "io" for i in range(3, 8)}}
_ELEMENT_BYTES = {1: 1, 2: 2}  # TDMA src_fmt/dst_fmt: 1 int8, 2 bf16
_REGION_BITS = 40
_WEIGHT_REGION = 1
_FILL = 4  # spec_func of a constant fill: the source is `const_val`, not memory
_GENERAL_COPY = 1  # trans_fmt of a plain byte copy of src_n_stride bytes
# Which sides of each direction are global memory: trans_dir -> (src, dst).
_GLOBAL_SIDES = {0: (True, False), 1: (False, True), 2: (True, True), 3: (False, False)}


@dataclass(frozen=True)
class Transfer:
    """The global-memory bytes one TDMA descriptor moves on one side."""

    offset: int  # byte offset of the descriptor's cmd_hdr in its cmdbuf
    kind: str  # "load" (global read) or "store" (global write)
    region: int
    nbytes: int
    estimated: bool = False  # a compressed source outside the weight section: counted at its maximum size


@dataclass(frozen=True)
class _Where:
    section: str
    offset: int

    def fail(self, what: str) -> CorruptFileError:
        return CorruptFileError(f"cmdbuf {self.section!r}: TDMA descriptor at byte {self.offset} {what}")


def _element_bytes(f: dict[str, int], side: str, where: _Where) -> int:
    code = f[f"{side}_fmt"]
    if code not in _ELEMENT_BYTES:
        raise where.fail(f"has {side}_fmt={code}; only 1 (int8) and 2 (bf16) are defined")
    return _ELEMENT_BYTES[code]


def _elements(f: dict[str, int], side: str) -> int:
    """Element count of one side: matrix mode moves rows x columns (src_n rows; columns in src_w / dst_w)."""
    if f["sys_dtype"]:
        return f["src_n"] * f[f"{side}_w"]
    return f["src_n"] * f[f"{side}_c"] * f[f"{side}_h"] * f[f"{side}_w"]


def _global_address(f: dict[str, int], side: str, chip: ChipSpec) -> tuple[int, int]:
    addr = (f[f"{side}_base_addr_high"] << 32) | f[f"{side}_base_addr_low"]
    return f[f"{side}_base_reg_sel"], addr - chip.gmem_base


def _compressed_read(f: dict[str, int], chip: ChipSpec, weight: bytes, where: _Where) -> tuple[int, bool]:
    """(bytes, estimated) of a decompressing load's VLC source buffer."""
    region, addr = _global_address(f, "src", chip)
    elements = _elements(f, "src")
    if region != _WEIGHT_REGION:  # activation buffers are not in the file: count the largest valid buffer
        largest = compression.max_stream_bytes(elements, bf16=f["src_fmt"] == 2)
        return compression.HEADER_BYTES + compression.kmap_bytes(elements) + largest, True
    if not 0 <= addr <= len(weight) - compression.HEADER_BYTES:
        raise where.fail(f"reads a compressed header at weight offset {addr:#x} outside the {len(weight)}-byte section")
    header = compression.VlcHeader.unpack(weight[addr : addr + compression.HEADER_BYTES])
    size = compression.compressed_size(header, elements)
    if addr + size > len(weight):
        raise where.fail(f"reads {size} compressed bytes at weight offset {addr:#x}, past the weight section")
    return size, False


def _read(f: dict[str, int], chip: ChipSpec, weight: bytes, where: _Where) -> Transfer | None:
    if f["spec_func"] == _FILL:
        return None
    region = _global_address(f, "src", chip)[0]
    if f["trans_fmt"] == _GENERAL_COPY:
        return Transfer(where.offset, "load", region, f["src_n_stride"])
    if f["compress_en"]:
        nbytes, estimated = _compressed_read(f, chip, weight, where)
        return Transfer(where.offset, "load", region, nbytes, estimated)
    return Transfer(where.offset, "load", region, _elements(f, "src") * _element_bytes(f, "src", where))


def _write(f: dict[str, int], chip: ChipSpec, weight: bytes, where: _Where) -> Transfer:
    region = _global_address(f, "dst", chip)[0]
    if f["trans_fmt"] == _GENERAL_COPY:
        return Transfer(where.offset, "store", region, f["src_n_stride"])
    return Transfer(where.offset, "store", region, _elements(f, "dst") * _element_bytes(f, "dst", where))


# One counter per global side; a g2g copy both reads and writes.
_SIDE_COUNTERS: tuple[Callable[[dict[str, int], ChipSpec, bytes, _Where], Transfer | None], ...] = (_read, _write)


def descriptor_transfers(
    fields: dict[str, int], chip: ChipSpec, weight: bytes, section: str, offset: int
) -> list[Transfer]:
    """The global-memory transfers of one decoded TDMA descriptor (none for a local-to-local move)."""
    where = _Where(section, offset)
    sides = _GLOBAL_SIDES[fields["trans_dir"]]
    out = [
        count(fields, chip, weight, where) for count, is_global in zip(_SIDE_COUNTERS, sides, strict=True) if is_global
    ]
    return [t for t in out if t is not None]


def model_transfers(model: CviModel) -> list[tuple[str, Transfer]]:
    """(cmdbuf section, transfer) for every global-memory transfer of every cmdbuf, in stream order."""
    chip = CHIPS[model.chip]
    weight = model.weight
    out = []
    for section, data in model.cmdbufs().items():
        for ins in split_cmdbuf(data, chip, f"section {section!r}"):
            if ins.engine == isa.ENGINE_TDMA:
                out += [(section, t) for t in descriptor_transfers(ins.fields, chip, weight, section, ins.offset)]
    return out


def _by_kind(transfers: list[Transfer], kind: str) -> dict[str, int]:
    totals = dict.fromkeys(REGION_KINDS, 0)
    for t in transfers:
        if t.kind == kind:
            totals[_REGION_KIND[t.region]] += t.nbytes
    return totals


def tdma_traffic(model: CviModel) -> dict[str, Any]:
    """Bytes the TDMA engine moves to/from global memory: {"load": {region kind: bytes}, "store": {...},
    "region": loads + stores per kind, "total", "transfers" (count), "estimated" (compressed non-weight
    sources counted at their maximum size)}."""
    transfers = [t for _, t in model_transfers(model)]
    load, store = _by_kind(transfers, "load"), _by_kind(transfers, "store")
    region = {k: load[k] + store[k] for k in REGION_KINDS}
    return {
        "load": load,
        "store": store,
        "region": region,
        "total": sum(region.values()),
        "transfers": len(transfers),
        "estimated": sum(t.estimated for t in transfers),
    }


def lower_bound(model: CviModel) -> dict[str, int]:
    """The unavoidable traffic: the weight section read once, each TPU routine's input tensors read once and
    its output tensors written once (a tensor shared by several routines counts once per direction)."""
    inputs: dict[str, int] = {}
    outputs: dict[str, int] = {}
    for prog in model.body.programs:
        sizes = {t.name: t.size for t in prog.tensor_map if (t.offset >> _REGION_BITS) != _WEIGHT_REGION}
        for r in prog.routines:
            if r.tpu_routine is None:
                continue
            inputs.update((n, sizes[n]) for n in r.in_tensors or [] if n in sizes)
            outputs.update((n, sizes[n]) for n in r.out_tensors or [] if n in sizes)
    bound = {"weights": len(model.weight), "inputs": sum(inputs.values()), "outputs": sum(outputs.values())}
    return {**bound, "total": sum(bound.values())}


def describe_traffic(model: CviModel) -> str:
    """Lines for `npuc inspect`: bytes moved per region, the lower bound and the ratio to it."""
    traffic, bound = tdma_traffic(model), lower_bound(model)

    def row(counts: dict[str, int]) -> str:
        return ", ".join(f"{k} {counts[k]}" for k in REGION_KINDS)

    ratio = traffic["total"] / bound["total"] if bound["total"] else float("nan")
    lines = [
        f"DDR traffic (TDMA, {traffic['transfers']} transfers): {traffic['total']} bytes",
        f"  loads:  {row(traffic['load'])}",
        f"  stores: {row(traffic['store'])}",
        f"  lower bound {bound['total']} bytes (weights {bound['weights']}, inputs {bound['inputs']}, "
        f"outputs {bound['outputs']}); traffic / bound = {ratio:.3f}",
    ]
    if traffic["estimated"]:
        lines.append(f"  ({traffic['estimated']} compressed activation loads counted at their maximum size)")
    return "\n".join(lines) + "\n"
