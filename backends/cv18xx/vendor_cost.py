"""The vendor compiler's own per-descriptor cost formulas, as a second cost model for timing.schedule_model.

tpu-mlir ranks its CV18xx layer groups with an estimate computed from the cmdbuf (its CV18xx profiling
source, public); the formulas are facts about the chip as the vendor models it, written here from that
description. timing.py's nominal model is npuc's own; scoring the same files with both is how the bench checks
that npuc's choices rank the same way under the vendor's costs (the vendor simulator reports no timing).

TIU, in TPU cycles (lanes = chip.lanes, EU = chip.eu_bytes, half the EUs for bf16; `tiles` = n x
ceil((start lane + c) / lanes) x ceil(h*w / EUs); start lane = res0_addr >> log2(lmem bytes per lane)):
- conv: 41 + tiles x (kh*kw*ceil(ic / (2 if double_conv and int8 else 1)) + bubble + bias 2 (3 operands, not
  per-channel) + rounding shift (bf16 2, per-channel 1, else 4) + partial-sum 0/4/4/8 by ps32_md) + post
  (per-channel 31, else 12); bubble = kh*kw*(fetch - ic) when the fetch of one EU row, ceil(((EU-1)*stride_x
  / (ins_x+1) + 1) / EU) + 1, exceeds ic; per-channel int8 loops take at least EU cycles;
- max pool (and min pool, which the source leaves out): tiles x (kh*kw*m + 2); avg pool: tiles x
  (max(kh*kw*m, EU if per-channel) + shift) + post, with m the fetch ratio of a row of EUs (>= 1; 1 for a 1x1
  output); depthwise: tiles x (kh*kw*m' + bias + shift') + post, m' counting the output rows one EU row spans,
  shift' 3 for int8 or a non-per-channel 1x1;
- matmul: 41 + n x ceil(c / lanes) x ceil(w / EUs) x (k + bias + shift + partial-sum + 2 if accumulating)
  + post (lanes from 0: its output starts at lane 0);
- element-wise: tiles x latency x write factor (1, or 30/16 when res0's c stride is not 16-aligned) + 26 +
  post; latency by kind (int8 / 16-bit): mul 2.5 / 4.5 (+3 with an int8 result), mac 9 / 11, add and sub 5 / 7,
  max, min, and, or, xor, ge 3 / 5, shift 4, copy 2 / 4, +1 for a 16-bit result; a lookup takes 3 + the
  table's height, a sum over H*W (mdsum) 3. 8-bit operands and results are read from opt_*_seg (cv183x:
  opt_*_int8), bf16 from opd_typ on every chip (the source infers it from a 16-bit result on the cv182x family).
TDMA, in nanoseconds then TPU cycles: the larger of DDR time (bytes / (1886 MHz x 4 bytes)) and local-memory
time (16-byte rows / (TPU MHz x 16)). DDR bytes are counted per contiguous run of a transfer, in bursts of 16 x
16 bytes (8 x 16 for a CW-transposed store) cut at a 4 KB boundary, each burst rounded out to 64-byte beats
(one more when it starts off a 64-byte line). A run is the whole tensor when its rows and channels follow on
within 16 bytes (loads; stores: 0), a channel when only rows do, else a row. The source sums the runs inside
one assignment that keeps only the last run's count; the runs are summed here, as the loops intend.
TPU clocks: cv183x 650 MHz, cv182x 750, cv181x and cv180x 500.
"""

from __future__ import annotations

from math import ceil

import numpy as np

from npuc.backends.cv18xx.chips import ChipSpec
from npuc.backends.cv18xx.cmdbuf import tiu_op_name
from npuc.backends.cv18xx.sim_tiu import normalize_tiu_fields
from npuc.backends.cv18xx.timing import CostModel, ZeroFields

TPU_MHZ = {"cv183x": 650, "cv182x": 750, "cv181x": 500, "cv180x": 500}
DRAM_MHZ, DRAM_BYTES = 1886, 4
BURST_BEATS, CW_STORE_BURST_BEATS, BEAT = 16, 8, 16  # AXI beats of 16 bytes
LINE, PAGE = 64, 4096
LOAD_GAP, STORE_GAP = 16, 0  # bytes between rows (channels) that still make one run
SYNC_LATENCY, CMD_LATENCY = 41, 26
ELTWISE_LATENCY = {  # kind -> (int8, 16-bit) cycles per EU step
    "mul": (2.5, 4.5), "mac": (9, 11), "add": (5, 7), "sub": (5, 7), "max": (3, 5), "min": (3, 5),
    "shift": (4, 4), "and": (3, 5), "or": (3, 5), "xor": (3, 5), "copy": (2, 4), "ge": (3, 5),
}  # fmt: skip


def _up(x: int, n: int) -> int:
    return -(-x // n)


def _span(f: dict[str, int], width: int) -> float:
    """Input columns a row of `width` outputs reads (stride, inserted zeros)."""
    return (width - 1) * f["conv_op_x_str"] / (f["conv_opd0_x_ins0"] + 1) + 1


def _fetch_ratio(f: dict[str, int], eus: int, width: int) -> float:
    """EU fetches per kernel tap of a pooling row `width` outputs wide (>= 1)."""
    span = _span(f, width)
    tail = (eus - 1) / eus if span >= eus else (span - 1) / eus
    return max(1.0, span / eus + tail)


def tiu_cost(fields: dict[str, int], chip: ChipSpec) -> int:
    """TPU cycles of one TIU descriptor under the vendor's formulas (module docstring)."""
    f = ZeroFields(normalize_tiu_fields(fields))
    op = tiu_op_name(f)
    bf16 = bool(f["opd_typ"])
    per_channel = bool(f["opt_chl_quan"])
    eu = chip.eu_bytes
    eus = eu // 2 if bf16 else eu
    lane0 = f["res0_addr"] >> (chip.lmem_size.bit_length() - 1)
    n, c, h, w = (f[f"res0_{d}"] for d in "nchw")
    tiles = n * _up(lane0 + c, chip.lanes) * _up(h * w, eus)
    kh, kw = f["opd1_h"], f["opd1_w"]
    post = 31 if per_channel else 12
    bias = 2 if f["tsk_opd_num"] == 3 and not per_channel else 0
    shift = 2 if bf16 else 1 if per_channel else 4
    psum = (0, 4, 4, 8)[f["ps32_md"] & 3]
    if op == "conv":
        ic = f["opd0_c"]
        per_cycle = 2 if f["double_conv"] and not bf16 else 1
        fetch = ceil(_span(f, eu) / eu) + 1
        bubble = kh * kw * (fetch - ic) if fetch > ic else 0
        loop = kh * kw * _up(ic, per_cycle) + bubble + bias + shift + psum
        if per_channel and not bf16:
            loop = max(loop, eu)
        return SYNC_LATENCY + tiles * loop + post
    if op == "max_pool" or op == "min_pool":
        ratio = 1.0 if h * w == 1 else _fetch_ratio(f, eu, eu)
        return int(tiles * (kh * kw * ratio + 2))
    if op == "avg_pool":
        ratio = 1.0 if h * w == 1 else _fetch_ratio(f, eus, eus)
        loop = int(kh * kw * ratio)
        loop = max(loop, eu) if per_channel else loop
        return tiles * (loop + shift) + post
    if op == "depthwise":
        shift = 3 if (kh * kw == 1 and not per_channel) or not bf16 else shift
        width = min(w, eu)
        rows = 1 if w >= eu else eu / w
        ratio = 1.0 if kh * kw == 1 else _span(f, width) / eu * rows + (eu - 1) / eu
        loop = int(kh * kw * ratio)
        loop = max(loop, eu) if per_channel else loop
        return tiles * (loop + bias + shift) + post
    if op == "matmul":
        accumulate = 2 if f["opt_res_add"] else 0
        rows = n * _up(c, chip.lanes) * _up(w, eus)
        return SYNC_LATENCY + rows * (f["opd1_n"] + bias + shift + psum + accumulate) + post
    int8_in, int8_out = bool(f["opt_opd0_seg"]), bool(f["opt_res0_seg"])
    if op == "lookup":
        return tiles * (3 + kh) + CMD_LATENCY + post
    if f["tens_mdsum"]:
        return tiles * 3 + CMD_LATENCY + post
    if op not in ELTWISE_LATENCY:
        raise ValueError(f"TIU op {op!r} has no vendor cost formula")
    latency = ELTWISE_LATENCY[op][0 if int8_in else 1]
    latency += 3 if op == "mul" and int8_out else 0  # an 8-bit product is rounded and shifted
    latency += 0 if int8_out else 1
    write = 1.0 if f["res0_c_str"] % 16 == 0 else 30 / 16
    return int(tiles * latency * write) + CMD_LATENCY + post


def _beats64(start16: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Bytes of one burst from the 16-aligned `start16`, in whole 64-byte beats (+1 off a line)."""
    first = -(-start16 // LINE) * LINE
    last = -(-(start16 + size) // LINE) * LINE
    return ((start16 != first).astype(np.int64) + (last - first) // LINE) * LINE


def _bursts(start: np.ndarray, length: np.ndarray, burst: int, from16: bool) -> np.ndarray:
    """Bytes of `length` bytes from `start` cut into bursts; `from16`: measured from start's 16-byte line."""
    start16 = start // BEAT * BEAT
    span = start + length - start16 if from16 else length
    full, rest = span // burst, -(-(span % burst) // BEAT) * BEAT
    each = np.where(start16 % LINE != 0, burst + LINE, burst)
    tail = np.where(rest > 0, _beats64(start16 + full * burst, rest), 0)
    return full * each + tail


def run_bytes(start: np.ndarray, length: np.ndarray, burst_beats: int = BURST_BEATS) -> np.ndarray:
    """DDR bytes of contiguous runs [start, start + length) (module docstring)."""
    start, length = np.asarray(start, np.int64), np.asarray(length, np.int64)
    burst = burst_beats * BEAT
    low = start & 0xFFFFFFFF
    crosses = (low & ~(PAGE - 1)) != ((low + length) & ~(PAGE - 1))
    within = _bursts(low, length, burst, from16=True)
    page = -(-low // PAGE) * PAGE
    head = np.where(page != low, _bursts(low, page - low, burst, from16=False), 0)
    tail = _bursts(page, low + length - page, burst, from16=False)
    return np.where(crosses, head + tail, within)


def _runs(f: dict[str, int], side: str, gap: int, size: int, transposed: bool) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the contiguous runs of a transfer's global side."""
    n, c, h, w = f["src_n"], f[f"{side}_c"], f[f"{side}_h"], f[f"{side}_w"]
    c_stride = (f[f"{side}_c_stride_high"] << 16) | f[f"{side}_c_stride_low"]
    h_stride, n_stride = f[f"{side}_h_stride"], f[f"{side}_n_stride"]
    if f["sys_dtype"]:  # matrix: one row per channel
        h, h_stride, n = 1, c_stride, 1
    if side == "dst" and f["spec_func"] == 1 and f["transpose_md"] == 0:
        n = f["src_c"]  # an NC-transposed store writes src_c images
    if side == "src" and f["spec_func"] == 1 and f["transpose_md"] in (1, 2):  # HWC load: c and w trade places
        c, w, h_stride = w, c, c
        c_stride = h_stride * h
    base = (f[f"{side}_base_addr_high"] << 32) | f[f"{side}_base_addr_low"]
    row = w * size
    h_last = h_stride * (h - 1) + row
    c_last = c_stride * (c - 1) + h_last
    width = w if side == "src" else row  # the source compares strides with elements, the store with bytes
    rows_follow = not transposed and h_stride - width <= gap
    ns, cs, hs = np.arange(n) * n_stride, np.arange(c) * c_stride, np.arange(h) * h_stride
    if rows_follow and c_stride - width * h <= gap:
        return base + ns, np.full(n, c_last)
    if rows_follow:
        return base + (ns[:, None] + cs).ravel(), np.full(n * c, h_last)
    if transposed and side == "src":  # a transposed matrix load: 8 rows x 128 bytes at a time
        cols = np.arange(0, f["src_w"], 8 * 16)
        starts = (np.arange(f["src_c"])[:, None] * c_stride + cols).ravel()
        return base + starts, np.minimum(f["src_w"] - cols, 8 * 16)[None].repeat(f["src_c"], 0).ravel()
    return base + (ns[:, None, None] + cs[:, None] + hs).ravel(), np.full(n * c * h, row)


def _lmem_rows(f: dict[str, int], side: str, size: int) -> int:
    """16-byte local-memory rows one side of a transfer touches (whole when its rows follow on, else per row)."""
    w, h, stride, c = f[f"{side}_w"], f[f"{side}_h"], f[f"{side}_h_stride"], f[f"{side}_c"]
    if stride - w == 0:
        return f["src_n"] * c * _up(stride * (h - 1) + w * size, 16)
    return f["src_n"] * c * h * _up(w * size, 16)


def tdma_cost(fields: dict[str, int], chip: ChipSpec, weight: bytes, section: str, offset: int) -> int:
    """TPU cycles of one TDMA descriptor under the vendor's formulas (module docstring)."""
    f = ZeroFields(fields)
    direction = f["trans_dir"]
    src_size, dst_size = (2 if f[f"{s}_fmt"] == 2 else 1 for s in ("src", "dst"))
    if direction == 3:  # local to local: the wider side's 16-byte rows, priced at the DDR rate
        ddr, rows = 16 * max(_lmem_rows(f, "src", src_size), _lmem_rows(f, "dst", dst_size)), 0
    elif direction in (0, 1, 2):
        store = direction == 1
        cw_store = store and f["transpose_md"] == 3  # a CW-transposed store: row by row, shorter bursts
        s, size = ("dst", dst_size) if store else ("src", src_size)
        if f["trans_fmt"]:  # a general copy of src_n_stride bytes
            address = (f[f"{s}_base_addr_high"] << 32) | f[f"{s}_base_addr_low"]
            starts, lengths = np.array([address]), np.array([f["src_n_stride"]])
        else:
            transposed = f["sys_dtype"] == 1 and f["spec_func"] == 1 and f["transpose_md"] == 0 and not store
            starts, lengths = _runs(f, s, STORE_GAP if store else LOAD_GAP, size, transposed or cw_store)
        ddr = int(run_bytes(starts, lengths, CW_STORE_BURST_BEATS if cw_store else BURST_BEATS).sum())
        rows = _lmem_rows(f, "dst", dst_size)
    else:
        raise ValueError(f"TDMA direction {direction} has no vendor cost formula")
    mhz = TPU_MHZ[chip.name]
    ns = max(ddr * 1000 / (DRAM_MHZ * DRAM_BYTES), rows * 1000 / (mhz * 16))
    return ceil(ns * mhz / 1000)


VENDOR_COSTS = CostModel("vendor formulas", tiu_cost, tdma_cost)
