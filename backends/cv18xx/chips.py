"""Per-chip parameters of the CV18xx family (specs/cv18xx.md §3.3)."""

from __future__ import annotations

from dataclasses import dataclass

from npuc.compiler.errors import UserError


@dataclass(frozen=True)
class ChipSpec:
    name: str
    kernel_name: str
    lanes: int  # NPU lanes; channel c lives in lane c % lanes
    eu_bytes: int  # bytes per lane per EU step (16 on every chip)
    lmem_size: int  # local memory bytes per lane
    cmd_magic: int  # cmd_hdr_t.magic of every descriptor
    tiu_layout: str  # which TIU register table the chip uses ("cv183x" or "cv182x")
    gmem_base: int  # added to region offsets in TDMA global addresses


CHIPS: dict[str, ChipSpec] = {
    c.name: c
    for c in (
        ChipSpec("cv183x", "bm1880v2", 32, 16, 32 * 1024, 0xA5, "cv183x", 1 << 32),
        ChipSpec("cv182x", "bm1822", 8, 16, 32 * 1024, 0xA6, "cv182x", 0),
        ChipSpec("cv181x", "cv181x", 8, 16, 32 * 1024, 0xA7, "cv182x", 0),
        ChipSpec("cv180x", "cv180x", 2, 16, 32 * 1024, 0xA8, "cv182x", 0),
    )
}


def pairs_channels(ic: int, bf16: bool, ifmap_addr: int, filter_addr: int) -> bool:
    """Whether a conv may take two input channels a cycle (double_conv): int8, an even ic of at least 4, both
    operands at even addresses (specs/cv18xx.md; tpu-mlir sets it on every such conv)."""
    return not bf16 and ic % 2 == 0 and ic >= 4 and ifmap_addr % 2 == 0 and filter_addr % 2 == 0


def chip_spec(name: str) -> ChipSpec:
    try:
        return CHIPS[name]
    except KeyError:
        raise UserError(f"unknown CV18xx chip {name!r}; use one of {', '.join(CHIPS)}") from None
