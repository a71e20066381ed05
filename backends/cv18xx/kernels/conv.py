"""Convolution kernels: plain and grouped conv (TIU conv), depthwise conv (TIU depthwise), and transposed conv
(the same, over an input the TIU spreads with zeros), int8 and bf16.

Weights and per-channel parameters of an output-channel tile are loaded once; the output is produced in row
tiles whose input rows (with the halo the kernel needs) are loaded for each tile. A fused ReLU6 adds a TIU
min against its int8 bound.
"""

from __future__ import annotations

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, fused_relu, kernel, no_kernel, op_where, quant_of
from npuc.backends.cv18xx.kernels.tiling import Geometry, largest_fit, pipeline, stream_rows
from npuc.backends.cv18xx.lmem import GTensor, LocalAllocator, LTensor, channel_view, local_bytes
from npuc.backends.cv18xx.timing import TDMA_BYTES_PER_CYCLE, TDMA_SETUP_CYCLES, TIU_SETUP_CYCLES
from npuc.backends.cv18xx.weights import StagedWeight, bf16_bits, channel_records, conv_filter, fp32_planes
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op
from npuc.compiler.kernels.quantized.bf16_conv import conv_transpose_pads, transposed_conv_filter

Window = tiu.Window
MAX_FILTER_TILES = 8  # double-buffered filter tiles of an input-resident conv may be this many at least


def geometry(op: Op, x: GTensor, y: GTensor, kh: int, kw: int) -> Geometry:
    a = op.attrs
    top, left, bottom, right = a.pads
    return Geometry(kh, kw, *a.strides, *a.dilations, (top, left, bottom, right), x.shape[2], x.shape[3],
                    y.shape[2], y.shape[3])  # fmt: skip


def check_window(op: Op, g: Geometry) -> None:
    if max(g.pads) >= 16 or max(g.sh, g.sw) >= 16 or max(g.dh, g.dw) > 16:
        raise UserError(
            f"op '{op.name}': pads {g.pads}, strides ({g.sh}, {g.sw}) or dilations exceed the TIU fields "
            "(pad < 16, stride < 16, dilation <= 16); pad the input explicitly or use another target"
        )


class ConvParams:
    """The packed per-channel parameters (int8 records or bf16 bias planes) of one conv in gmem."""

    def __init__(self, cg: Codegen, op: Op, oc: int, bf16: bool) -> None:
        q = quant_of(op)
        has_bias = len(op.inputs) > 2 and bool(op.inputs[2])
        bias = cg.const(op.inputs[2]) if has_bias else None
        self.has_bias = has_bias
        self.bf16 = bf16
        if bf16:
            self.g = (
                None
                if bias is None
                else cg.weights.add(f"{op.name}_bias_fp32", fp32_planes(bias).reshape(2, oc, 1, 1), "bf16")
            )
        else:
            rec = channel_records(bias, np.broadcast_to(q.multiplier, (oc,)), np.broadcast_to(q.rshift, (oc,)))
            self.g = cg.weights.add(f"{op.name}_bias_packed", rec)

    def tile(self, c0: int, c1: int) -> GTensor | None:
        return None if self.g is None else self.g.slice(c=(c0, c1))


def conv_weights(cg: Codegen, op: Op, bf16: bool, depthwise: bool, w: np.ndarray | None = None) -> StagedWeight:
    """The (oc, ic/group, kh, kw) filters of `op` (its weight input unless `w` is given) in the TIU's layout,
    stored slice by slice as the kernel loads them."""
    w = cg.const(op.inputs[1]) if w is None else w
    packed = w.reshape(1, w.shape[0], w.shape[2], w.shape[3]) if depthwise else conv_filter(w)
    data = bf16_bits(packed) if bf16 else np.asarray(packed, np.int8)
    return StagedWeight(cg.weights, f"{op.name}_filter", data, "bf16" if bf16 else "i8", cg.compress_weights)


def _oc_tile(cg: Codegen, per_channel_bytes: int, oc: int) -> int:
    """Output channels per tile: all of them if their weights take at most half of a lane."""
    lanes, budget = cg.chip.lanes, cg.chip.lmem_size // 2
    blocks = max(1, budget // max(1, per_channel_bytes))
    return min(oc, blocks * lanes) if blocks * lanes < oc else oc


@kernel("conv2d")
def conv2d(cg: Codegen, op: Op) -> None:
    q = quant_of(op)
    if q.mode not in ("int8", "bf16"):
        raise no_kernel(op, f"conv in {q.mode} mode")
    bf16 = q.mode == "bf16"
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    w = cg.const(op.inputs[1])
    g = geometry(op, x, y, *w.shape[2:])
    check_window(op, g)
    _convolve(cg, op, x, y, w, g, bf16)


@kernel("conv_transpose2d")
def conv_transpose2d(cg: Codegen, op: Op) -> None:
    """A stride-1 conv over the input spread by the TIU (stride - 1 zeros inserted between pixels) with the
    flipped, channel-swapped filters and padding dilation·(k-1) - pad (+ output_padding at the end)."""
    q = quant_of(op)
    if q.mode not in ("int8", "bf16"):
        raise no_kernel(op, f"conv_transpose in {q.mode} mode")
    a = op.attrs
    x, y = cg.gtensor(op.inputs[0]), cg.gtensor(op.outputs[0])
    w = transposed_conv_filter(cg.const(op.inputs[1]), a.group)
    oc, _, kh, kw = w.shape
    (sh, sw), (dh, dw) = a.strides, a.dilations
    pads = conv_transpose_pads(a, kh, kw)
    if min(pads) < 0 or max(sh, sw) > 16 or (kh - 1) * dh + 1 < sh or (kw - 1) * dw + 1 < sw:
        raise UserError(
            f"{op_where(op)}: pads {a.pads} larger than dilation*(kernel-1), a stride over 16 or a kernel "
            "narrower than its stride has no cv18xx insertion form; crop or resize explicitly instead"
        )
    g = Geometry(kh, kw, 1, 1, dh, dw, pads, x.shape[2], x.shape[3], y.shape[2], y.shape[3], sh - 1, sw - 1)
    check_window(op, g)
    _convolve(cg, op, x, y, w, g, q.mode == "bf16")


def _convolve(cg: Codegen, op: Op, x: GTensor, y: GTensor, w: np.ndarray, g: Geometry, bf16: bool) -> None:
    """Emit the conv of `x` with filters `w` (oc, ic/group, kh, kw) over geometry `g` into `y`."""
    oc, icg = w.shape[:2]
    group = op.attrs.group
    params = ConvParams(cg, op, oc, bf16)
    if group > 1 and group == x.shape[1] == oc and icg == 1:
        _depthwise(cg, op, x, y, conv_weights(cg, op, bf16, True, w), params, g)
        return
    weights = conv_weights(cg, op, bf16, False, w)
    ocg = oc // group
    for gi in range(group):
        cs = (gi * icg, (gi + 1) * icg)
        os = (gi * ocg, (gi + 1) * ocg)
        _conv(cg, op, x.slice(c=cs), y.slice(c=os), weights.slice(c=os), params, os[0], g)


def _conv(cg: Codegen, op: Op, x: GTensor, y: GTensor, w: StagedWeight, params: ConvParams, oc_base: int,
          g: Geometry) -> None:  # fmt: skip
    s = cg.stream
    fmt = x.fmt
    ic, oc = x.shape[1], y.shape[1]
    relu, relu_max = fused_relu(op)
    e = 2 if fmt == "bf16" else 1
    rec = 9 if params.has_bias else 5
    per_oc = g.kh * g.kw * ic * e + (4 * e if fmt == "bf16" else rec)
    local = cg.local(op)
    resident_oc = _input_resident_oc(cg, op, x, y, g, per_oc, rec)
    double_oc = _input_resident_oc(cg, op, x, y, g, per_oc, rec, copies=2)
    if double_oc and -(-oc // double_oc) <= 2 * -(-oc // resident_oc):
        # two filter sets: the next tile's filters load while this tile computes; of the tile sizes giving
        # at most twice the single-set tiles (or MAX_FILTER_TILES), the one the cost model finds fastest (a
        # small first tile lets the TIU start early; more, smaller ones add descriptors and compress worse)
        most = max(2 * -(-oc // resident_oc), MAX_FILTER_TILES)
        sizes = [t for t in range(cg.chip.lanes, double_oc + 1, cg.chip.lanes) if -(-oc // t) <= most]
        resident_oc = min(sizes, key=lambda t: (_pipelined_cycles(cg, x, g, oc, t), -t), default=double_oc)
    if resident_oc:
        _conv_input_resident(cg, op, x, y, w, params, oc_base, g, resident_oc)
        return
    tile_oc = _oc_tile(cg, per_oc, oc)
    for o0 in range(0, oc, tile_oc):
        o1 = min(oc, o0 + tile_oc)
        local.reset()
        lw, lp = _load_filter_tile(cg, local, w, params, oc_base, (o0, o1), g, ic)

        def compute(ly: LTensor, lx: LTensor, win: tiu.Window, _row: int, lw: LTensor = lw,
                    lp: LTensor | None = lp) -> None:  # fmt: skip
            s.tiu(tiu.conv(ly, lx, lw, lp, win, relu, params.has_bias))
            if relu_max is not None:
                s.tiu(tiu.minimum(ly, ly, relu_max))

        stream_rows(cg, op, local, g, x, y.slice(c=(o0, o1)), compute)


def _load_filter_tile(cg: Codegen, local: LocalAllocator, w: StagedWeight, params: ConvParams, oc_base: int,
                      oc: tuple[int, int], g: Geometry, ic: int) -> tuple[LTensor, LTensor | None]:  # fmt: skip
    """Load the filters (and per-channel parameters) of output channels [oc[0], oc[1]) into local memory."""
    lw = local.tensor((1, oc[1] - oc[0], g.kh * g.kw, ic), w.fmt, eu_align=False)
    dma.load(cg.stream, w.slice(c=oc).place(), lw)
    ptile = params.tile(oc_base + oc[0], oc_base + oc[1])
    if ptile is None:
        return lw, None
    lp = local.tensor(ptile.shape, ptile.fmt, eu_align=False)
    dma.load(cg.stream, ptile, lp)
    return lw, lp


def _input_resident_oc(cg: Codegen, op: Op, x: GTensor, y: GTensor, g: Geometry, per_oc: int, rec: int,
                       copies: int = 1) -> int:  # fmt: skip
    """Output channels per tile when one batch item's whole input stays in local memory while the filters
    stream past it in `copies` alternating buffer sets; 0 when it does not fit, or when the filters fit at
    once (then no input row is loaded twice anyway)."""
    chip, fmt = cg.chip, x.fmt
    oc, ic = y.shape[1], x.shape[1]
    if x.shape[0] != 1 or _oc_tile(cg, per_oc, oc) >= oc:
        return 0
    bf16 = fmt == "bf16"  # bf16 bias planes load with each tile, int8 records once (_conv_input_resident)
    free = chip.lmem_size - local_bytes(chip, (1, ic, g.ih, g.iw), fmt)
    free -= 0 if bf16 else local_bytes(chip, (1, oc, 1, rec), fmt, False)

    def fits(blocks: int) -> bool:
        t = min(oc, blocks * chip.lanes)
        need = local_bytes(chip, (1, t, g.kh * g.kw, ic), fmt, False) + local_bytes(chip, (1, t, g.oh, g.ow), fmt)
        need += local_bytes(chip, (2, t, 1, 1), fmt, False) if bf16 else 0
        return copies * need <= free

    return min(oc, largest_fit(-(-oc // chip.lanes), fits) * chip.lanes)


def _pipelined_cycles(cg: Codegen, x: GTensor, g: Geometry, oc: int, tile_oc: int) -> int:
    """Cycles (timing.py's cost model) of the input-resident conv in double-buffered tiles of `tile_oc`
    output channels: the first filters load, then each tile's compute runs under the next filters' load and
    the previous output's store, then the last store."""
    chip, ic, e = cg.chip, x.shape[1], 2 if x.fmt == "bf16" else 1
    tiles = [min(tile_oc, oc - o0) for o0 in range(0, oc, tile_oc)]
    load = [TDMA_SETUP_CYCLES + -(-t * g.kh * g.kw * ic * e // TDMA_BYTES_PER_CYCLE) for t in tiles] + [0]
    store = [TDMA_SETUP_CYCLES + -(-t * g.oh * g.ow * e // TDMA_BYTES_PER_CYCLE) for t in tiles]
    per_cycle = chip.eu_bytes // e
    macs = g.oh * g.ow * g.kh * g.kw * ic  # per lane and channel row
    compute = [TIU_SETUP_CYCLES + -(-(-(-t // chip.lanes) * macs) // per_cycle) for t in tiles]
    steps = (max(c, load[j + 1] + (store[j - 1] if j else 0)) for j, c in enumerate(compute))
    return load[0] + sum(steps) + store[-1]


def _conv_input_resident(cg: Codegen, op: Op, x: GTensor, y: GTensor, w: StagedWeight, params: ConvParams,
                         oc_base: int, g: Geometry, tile_oc: int) -> None:  # fmt: skip
    """Load the input (and int8 per-channel records) once; per output-channel tile (a whole number of lanes)
    load its filters (and bf16 bias planes), convolve every row, store. Tiles alternate between two buffer
    sets where both fit."""
    s, fmt = cg.stream, x.fmt
    relu, relu_max = fused_relu(op)
    oc = y.shape[1]
    local = cg.local(op)
    lx = local.tensor((1, x.shape[1], g.ih, g.iw), fmt)  # loaded after the first filters (see load below)
    # int8 records load once for every tile; bf16 bias planes load per tile, because the TIU finds the low
    # plane one plane of the tile's own channel count after the high one (sim_tiu._bf16_bias)
    all_params = None if params.bf16 else params.tile(oc_base, oc_base + oc)
    lp_all = None
    if all_params is not None:
        lp_all = local.tensor(all_params.shape, all_params.fmt, eu_align=False)
        dma.load(s, all_params, lp_all)
    top = local.top
    pads = (g.pads[0], _pad_bottom(g), g.pads[1], _pad_right(g))
    win = Window(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, pads, g.ins_h, g.ins_w)
    tiles = [(o0, min(oc, o0 + tile_oc)) for o0 in range(0, oc, tile_oc)]
    set_bytes = 0

    def buffers(j: int, load: bool = False) -> tuple[LTensor, LTensor, LTensor | None]:
        o0, o1 = tiles[j]
        local.reset(top + (j % 2) * set_bytes)
        lw = local.tensor((1, o1 - o0, g.kh * g.kw, x.shape[1]), w.fmt, eu_align=False)
        if load:
            dma.load(s, w.slice(c=(o0, o1)).place(), lw)
        planes = params.tile(oc_base + o0, oc_base + o1) if params.bf16 else None
        lp = None if planes is None else local.tensor(planes.shape, planes.fmt, eu_align=False)
        if load and lp is not None:
            dma.load(s, planes, lp)
        return lw, local.tensor((1, o1 - o0, g.oh, g.ow), fmt), lp

    if len(tiles) > 1:  # the first tile is the largest: its buffers size a set
        buffers(0)
        set_bytes = local.top - top if top + 2 * (local.top - top) <= cg.chip.lmem_size else 0

    def work(j: int) -> None:
        (o0, o1), (lw, ly, lp) = tiles[j], buffers(j)
        if lp_all is not None:  # this tile's channels start o0 / lanes rows into every lane
            lp = channel_view(cg.chip, lp_all, o0, o1)
        s.tiu(tiu.conv(ly, lx, lw, lp, win, relu, params.has_bias))
        if relu_max is not None:
            s.tiu(tiu.minimum(ly, ly, relu_max))
        dma.store(s, ly, y.slice(c=(o0, o1)))

    def load(j: int) -> None:
        """Tile j's filters; the input after the first tile's: the constants come first in the TDMA stream, so
        they can be fetched under the previous layer's compute (reorder.py), which the input must wait for."""
        buffers(j, load=True)
        if j == 0:
            dma.load(s, x, lx)

    pipeline(len(tiles), 2 if set_bytes else 1, load, work)


def _pad_bottom(g: Geometry) -> int:
    return max(0, (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1 - g.spread_hw()[0] - g.pads[0])


def _pad_right(g: Geometry) -> int:
    return max(0, (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1 - g.spread_hw()[1] - g.pads[1])


def _depthwise(cg: Codegen, op: Op, x: GTensor, y: GTensor, w: StagedWeight, params: ConvParams, g: Geometry) -> None:
    chip, s = cg.chip, cg.stream
    fmt = x.fmt
    c = x.shape[1]
    relu, relu_max = fused_relu(op)
    local = cg.local(op)
    tile_c = c
    while True:  # channel tiles whose weights, parameters and one output row fit
        need = local_bytes(chip, (1, tile_c, g.kh, g.kw), fmt) + local_bytes(chip, (2, tile_c, 1, 9), fmt, False)
        need += local_bytes(chip, (1, tile_c, min(g.ih, g.rows_needed(1)), g.iw), fmt)
        need += local_bytes(chip, (1, tile_c, 1, g.ow), fmt)
        if need <= chip.lmem_size or tile_c <= chip.lanes:
            break
        tile_c = max(chip.lanes, (tile_c // 2 + chip.lanes - 1) // chip.lanes * chip.lanes)
    for c0 in range(0, c, tile_c):
        c1 = min(c, c0 + tile_c)
        t = c1 - c0
        local.reset()
        lw = local.tensor((1, t, g.kh, g.kw), fmt)
        dma.load(s, w.slice(c=(c0, c1)).place(), lw)
        ptile = params.tile(c0, c1)
        lp = None
        if ptile is not None:
            lp = local.tensor(ptile.shape, ptile.fmt, eu_align=False)
            dma.load(s, ptile, lp)

        def compute(ly: LTensor, lx: LTensor, win: tiu.Window, _row: int, lw: LTensor = lw,
                    lp: LTensor | None = lp) -> None:  # fmt: skip
            s.tiu(tiu.depthwise(ly, lx, lw, lp, win, relu, params.has_bias))
            if relu_max is not None:
                s.tiu(tiu.minimum(ly, ly, relu_max))

        stream_rows(cg, op, local, g, x.slice(c=(c0, c1)), y.slice(c=(c0, c1)), compute)
