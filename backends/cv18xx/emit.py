"""The instruction stream of one TPU routine: TIU and TDMA descriptors in issue order, encoded to a cmdbuf.

Kernels describe descriptors with the cv182x field names (`isa.TIU_CV182X_LAYOUT`); `encode_tiu` translates
them to the cv183x table where that chip spells or sizes a field differently. Sync ids are assigned when the
stream is encoded (sync.py): by default each descriptor waits only for what it truly depends on, so TDMA
transfers overlap TIU work, and first every load moves up the stream past what it does not depend on
(reorder.hoist_loads: prefetch); `sync="serial"` gives cvikernel's fully ordered scheme, in emission order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npuc.backends.cv18xx import isa
from npuc.backends.cv18xx.chips import ChipSpec
from npuc.backends.cv18xx.reorder import LastTouch, hoist_loads
from npuc.backends.cv18xx.sync import assign_sync

# Non-zero reset values of cvikernel's TIU registers that the arithmetic depends on.
TIU_DEFAULTS = {
    "cmd_en": 1,
    "cmd_id_en": 1,
    "opt_shift_typ": 1,
    "opt_rshift_typ": 1,
    "opt_left_shift": 2,
    "opt_res0_sign": 1,
    "opt_opd0_sign": 1,
    "opt_opd1_sign": 1,
    "opt_opd2_sign": 1,
    "opt_res0_seg": 1,
    "opt_opd0_seg": 1,
    "opt_opd1_seg": 1,
    "conv_op_x_str": 1,
    "conv_op_y_str": 1,
    **{f"{p}_w_str": 1 for p in ("res0", "opd0", "opd1", "opd2")},
    **{f"{p}_b_str": 16 for p in ("res0", "opd0", "opd1", "opd2")},  # the simulator rejects a zero opd2_b_str
}

# cv183x names of fields the cv182x family calls differently (specs/cv18xx.md §3.4).
_CV183X_NAMES = {
    "opt_res_shift": "opt_right_shift",
    "opt_relu_typ": "opt_relu",
    "opt_res0_seg": "opt_res0_int8",
    "opt_opd0_seg": "opt_opd0_int8",
    "opt_opd1_seg": "opt_opd1_int8",
    "opt_opd2_seg": "opt_opd2_int8",
}
_CV182X_ONLY = ("opt_relu_value", "cmd_pre_exe_typ", "cmd_pre_exe")


def encode_tiu(chip: ChipSpec, fields: dict[str, int]) -> bytes:
    """A TIU body for `chip` from cv182x-named fields; `pad_value` (a signed int8 or raw bf16 pad) is placed
    where the chip keeps it (cv183x: an 8-bit int8 field and a separate bf16 field)."""
    f = dict(fields)
    pad = f.pop("pad_value", 0)
    bf16 = bool(f.get("opd_typ"))
    if chip.tiu_layout == "cv183x":
        f = {_CV183X_NAMES.get(k, k): v for k, v in f.items() if k not in _CV182X_ONLY}
        f["opd0_ins_fp" if bf16 else "opd0_ins_val"] = pad & (0xFFFF if bf16 else 0xFF)
    else:
        f["opd0_ins_val"] = pad & 0xFFFF
    return isa.encode(isa.tiu_table(chip.tiu_layout), f)


@dataclass
class CmdStream:
    chip: ChipSpec
    records: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    layer: int = 0  # debug tag written into every descriptor (layer_info / layer_ID)
    sync: str = "parallel"  # see sync.SYNC_MODES
    touched: LastTouch = None  # type: ignore[assignment]  # where earlier records touch local memory

    def __post_init__(self) -> None:
        if self.touched is None:
            self.touched = LastTouch(self.chip)

    def tiu(self, fields: dict[str, int]) -> None:
        f = {**TIU_DEFAULTS, **fields, "layer_info": self.layer & 0xFFFF}
        self.records.append((isa.ENGINE_TIU, f))

    def tdma(self, fields: dict[str, int]) -> None:
        f = {"vld": 1, "bar_en": 1, **fields, "layer_ID": self.layer & 0xFFFF}
        self.records.append((isa.ENGINE_TDMA, f))

    def counts(self) -> dict[str, int]:
        tiu = sum(1 for engine, _ in self.records if engine == isa.ENGINE_TIU)
        vlc = sum(1 for engine, f in self.records if engine == isa.ENGINE_TDMA and f.get("compress_en"))
        return {"tiu": tiu, "tdma": len(self.records) - tiu, "tdma_decompressing": vlc}

    def to_bytes(self) -> bytes:
        """The cmdbuf, with the sync ids assigned in `self.sync` mode (parallel: loads moved up first)."""
        if self.sync == "parallel":
            self.records = hoist_loads(self.records, self.chip)
        assign_sync(self.records, self.chip, self.sync)
        return self.encode()

    def encode(self) -> bytes:
        """The cmdbuf with the ids the records carry now."""
        hdr_table, tdma_table = isa.cmd_hdr_table(), isa.tdma_table()
        parts = []
        for engine, f in self.records:
            body = encode_tiu(self.chip, f) if engine == isa.ENGINE_TIU else isa.encode(tdma_table, f)
            hdr = {"magic": self.chip.cmd_magic, "len": len(body), "engine_id": engine}
            parts += [isa.encode(hdr_table, hdr), body]
        return b"".join(parts)
