"""Lookup-table activations: the TIU table lookup (tsk_typ 3, eu 12) over int8 tensors.

cvikernel's `tiu_lookup_table` (specs/cv18xx.md §3.4, §4): every lane holds its own copy of a 256-entry
table, (1, lanes, 16, 16) int8 in local memory; each int8 element, read as an unsigned byte, picks the entry
at that byte offset of its lane's table. The TIU reads all three operands unsigned with strides derived from
the shapes (`short_*_str` 0) and no shift or ReLU. cv183x raises its `tens_lookup` bit and keeps eu 0 for
int8 (12 only for bf16); the cv182x family has no such bit and selects the lookup with eu 12 alone.

Per op: the table goes into the weight area already replicated per lane, is loaded once, then the tensor is
tiled load -> lookup (in place) -> store, as tpu-mlir's `cvi_backend_tg_lut_kernel` does.

bf16 sigmoid/tanh/erf/GELU interpolate between two bf16 tables, (1, lanes, 32, 8) each, indexed by the low byte of each
bf16 element (compiler/kernels/quantized/bf16_lut.py has the arithmetic and the tables). Per tile, with three
bf16 tiles X, S and Y: X = x * scale, clamped to [-128, 127]; a local TDMA converts X to int8 rounding toward
zero, writing each code into the low byte of Y's element; a second one turns the codes back into bf16 in S;
X -= S (the fraction); S = slope[Y]; Y = base[Y] (in place); Y += X * S. GELU's table holds GELU(x) / x, so
its input stays in a fourth tile for a last Y = x * Y.
"""

from __future__ import annotations

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.chips import ChipSpec
from npuc.backends.cv18xx.codegen import Codegen, quant_of
from npuc.backends.cv18xx.kernels.elementwise import _part, tiles
from npuc.backends.cv18xx.lmem import LTensor
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op
from npuc.compiler.kernels.quantized.bf16_lut import INDEX_HI, INDEX_LO, PRODUCT_KINDS, slope_table, table_kind

TABLE_ENTRIES = 256
TABLE_HW = {"i8": (16, 16), "bf16": (32, 8)}  # per-lane table shape the TIU insists on
LOOKUP_EU = 12
# The table takes 256 bytes of each lane; reserving half of local memory for it (tiles sized as if two
# fit) keeps the arithmetic simple and costs nothing on these activation-sized layers.
TILE_SLOTS = 2


def table_shape(chip: ChipSpec, fmt: str = "i8") -> tuple[int, int, int, int]:
    h, w = TABLE_HW[fmt]
    return (1, chip.lanes, h, w)


def lookup(chip: ChipSpec, out: LTensor, x: LTensor, table: LTensor) -> dict[str, int]:
    """TIU fields (cv182x names) of out = table[x] with every operand in the default local layout."""
    bf16 = x.fmt == "bf16"
    sign = int(bf16)
    f = {
        "tsk_typ": 3,
        "tsk_eu_typ": LOOKUP_EU,
        "tsk_opd_num": 2,
        "opd_typ": sign,
        "opt_shift_typ": 0,
        "opt_res_shift": 0,
        "opt_relu_typ": 0,
        **tiu.operand("res0", out, explicit=False),
        **tiu.operand("opd0", x, explicit=False),
        **tiu.operand("opd1", table, explicit=False),
        "opt_res0_sign": sign,
        "opt_opd0_sign": sign,
        "opt_opd1_sign": sign,
        "opt_res0_seg": 1,
        "opt_opd0_seg": 1,
        "opt_opd1_seg": 1,
    }
    if bf16:
        f["opt_opd2_seg"] = 1  # cvikernel sets it for a hardware check
    if chip.tiu_layout == "cv183x":
        f["tens_lookup"] = 1
        if not bf16:
            f["tsk_eu_typ"] = 0
    return f


def replicated_table(chip: ChipSpec, lut: np.ndarray) -> np.ndarray:
    """(1, lanes, 16, 16) int8: the 256-entry table once per lane, entry i at byte i of the lane's copy."""
    table = np.asarray(lut).reshape(-1)
    if table.size != TABLE_ENTRIES:
        raise UserError(f"an int8 lookup table has {TABLE_ENTRIES} entries, got {table.size}")
    table = table.astype(np.int64).astype(np.int8)
    return np.ascontiguousarray(np.broadcast_to(table, (chip.lanes, TABLE_ENTRIES)).reshape(table_shape(chip)))


def emit_int8_lut(cg: Codegen, op: Op) -> None:
    """An int8 activation/lut op through its 256-entry table (`op.attrs.quant.lut`)."""
    q = quant_of(op)
    if q.mode != "int8" or q.lut is None:
        raise UserError(f"op '{op.name}' ({op.kind}): the cv18xx lookup kernel needs an int8 table")
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    if x.fmt != "i8" or y.fmt != "i8":
        raise UserError(f"op '{op.name}' ({op.kind}): the int8 lookup reads and writes int8 tensors")
    s = cg.stream
    local = cg.local(op)
    gtable = cg.weights.add(f"{op.name}_lut", replicated_table(cg.chip, q.lut), "i8")
    table = local.tensor(table_shape(cg.chip), "i8")
    dma.load(s, gtable, table)
    top = local.top
    for b, cs, hs in tiles(cg, op, y.shape, y.fmt, TILE_SLOTS):
        local.reset(top)
        lt = local.tensor((1, cs[1] - cs[0], hs[1] - hs[0], y.shape[3]), y.fmt)
        dma.load(s, _part(x, b, cs, hs), lt)
        s.tiu(lookup(cg.chip, lt, lt, table))
        dma.store(s, lt, _part(y, b, cs, hs))


# ---- bf16: value and slope tables ------------------------------------------------------------------------

BF16_MINUS_ONE = 0xBF80
BF16_TILES = 4  # X, S, Y and room for the two 512-byte tables


def is_bf16_table_activation(op: Op) -> bool:
    """A bf16 activation this module computes through tables (sigmoid, tanh, erf, GELU)."""
    act = getattr(op.attrs, "act", None)
    return op.kind == "activation" and quant_of(op).mode == "bf16" and act is not None and table_kind(act) is not None


def replicated_bf16_table(chip: ChipSpec, values: np.ndarray) -> np.ndarray:
    """(1, lanes, 32, 8) uint16: the bf16 bits of a 256-entry table once per lane."""
    bits = bf16_bits(np.asarray(values, np.float32).reshape(-1))
    return np.ascontiguousarray(np.broadcast_to(bits, (chip.lanes, TABLE_ENTRIES)).reshape(table_shape(chip, "bf16")))


def _per_element(t: LTensor, fmt: str) -> LTensor:
    """`t` (a default-layout bf16 tile) as (n, c, h*w, 1) elements of `fmt`, one per 2-byte slot: the TDMA has
    no w stride, so an int8 code lands in the low byte of its bf16 slot only as a one-element row."""
    n, c, h, w = t.shape
    return LTensor(t.addr, (n, c, h * w, 1), fmt, (t.strides[0], t.strides[1], 2, 1 if fmt == "i8" else 2))


def emit_bf16_slope_lut(cg: Codegen, op: Op) -> None:
    """A bf16 table activation: both tables loaded once, then tiled as the module docstring describes; a GELU
    keeps its input tile to multiply by the looked-up factor."""
    kind = table_kind(op.attrs.act)
    table = slope_table(kind)
    product = kind in PRODUCT_KINDS
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    if x.fmt != "bf16" or y.fmt != "bf16":
        raise UserError(f"op '{op.name}' ({op.kind}): the bf16 table kernel reads and writes bf16 tensors")
    s = cg.stream
    local = cg.local(op)
    resident = []
    for part, values in (("base", table.base), ("slope", table.slope)):
        g = cg.weights.add(f"{op.name}_{part}_table", replicated_bf16_table(cg.chip, values), "bf16")
        lt = local.tensor(table_shape(cg.chip, "bf16"), "bf16")
        dma.load(s, g, lt)
        resident.append(lt)
    base, slope = resident
    scale = int(bf16_bits(table.scale))
    lo, hi = (int(bf16_bits(np.float32(v))) for v in (INDEX_LO, INDEX_HI))
    top = local.top
    for b, cs, hs in tiles(cg, op, y.shape, "bf16", BF16_TILES + product):
        local.reset(top)
        shape = (1, cs[1] - cs[0], hs[1] - hs[0], y.shape[3])
        tx, ts, ty = (local.tensor(shape, "bf16") for _ in range(3))
        tin = local.tensor(shape, "bf16") if product else tx
        dma.load(s, _part(x, b, cs, hs), tin)
        s.tiu(tiu.mul(tx, tin, scale))
        s.tiu(tiu.maximum(tx, tx, lo))
        s.tiu(tiu.minimum(tx, tx, hi))
        codes = _per_element(ty, "i8")
        dma.copy_local(s, _per_element(tx, "bf16"), codes, round_toward_zero=True)
        dma.copy_local(s, codes, _per_element(ts, "bf16"))
        s.tiu(tiu.mac(tx, ts, BF16_MINUS_ONE, 16, 0, False, True))
        s.tiu(lookup(cg.chip, ts, ty, slope))
        s.tiu(lookup(cg.chip, ty, ty, base))
        s.tiu(tiu.mac(ty, tx, ts, 16, 0, False, True))
        if product:
            s.tiu(tiu.mul(ty, tin, ty))
        dma.store(s, ty, _part(y, b, cs, hs))
