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


def chip_spec(name: str) -> ChipSpec:
    try:
        return CHIPS[name]
    except KeyError:
        raise UserError(f"unknown CV18xx chip {name!r}; use one of {', '.join(CHIPS)}") from None
