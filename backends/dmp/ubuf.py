"""DV700 unified buffer (UBUF) arithmetic: how many tiles a run needs, and the peak UBUF bytes of a multi-run
command kept in one tile. The driver refuses a run that does not fit even when split into tiles, a run whose
output stays in the UBUF but needs more than one tile, and a multi-run command whose single-tile peak exceeds
the UBUF (spec §1.7; the arithmetic follows the dv-kernel-driver `uapi/dimensions.h` helpers
`calc_num_tiles_conv_lrn`, `calc_num_tiles_pool` and `ubuf_get_single_tile_usage`, read for the facts).

Sizes are counted as the hardware does: an 8-channel block of a tile is stored in 16-byte lines, the line
count raised to 2 modulo 16, and all blocks together rounded up to 16 lines. Division truncates toward zero
like the C code.
"""

from __future__ import annotations

from dataclasses import dataclass

from .layers import CONV_DECONV_BIT, CONV_DW_BIT, CONV_OFF, POOL_AVG, POOL_MAX, POOL_UPSAMPLE, ConvConf, Run, unpack2

CHANNEL_BLOCK = 8
POOL_UNIT_ELEMS = 131072 * 1024 // 2  # the pooling unit's own limit, in fp16 elements


@dataclass(frozen=True)
class Tiles:
    """A run's tile count (0: it does not fit at all) and the UBUF bytes of one input and output tile."""

    count: int
    in_bytes: int
    out_bytes: int


def _cdiv(a: int, b: int) -> int:
    """C integer division (toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _ceil8(n: int) -> int:
    return -(-n // 8)


def _lines(elems_per_block: int, blocks: int) -> tuple[int, int]:
    """(16-byte lines of one 8-channel block, lines of all blocks) for `elems_per_block` fp16 values."""
    block = _ceil8(elems_per_block)
    block += (2 - block) % 16
    total = block * blocks
    return block, total + (-total) % 16


def _out_width(size: int, k: int, pad0: int, pad1: int, stride: int, deconv: bool) -> int:
    if deconv:
        return pad0 + (size - 1) * stride + 1 + pad1 - k + 1
    return _cdiv(pad0 + size + pad1 - k, stride) + 1


def conv_tiles(
    dims: tuple[int, int, int],
    m: int,
    kernel: tuple[int, int],
    pads: tuple[int, int, int, int],
    strides: tuple[int, int],
    dilation: tuple[int, int],
    ub_size: int,
    *,
    is_conv: bool = True,
    deconv: bool = False,
) -> Tiles:
    """Tiles of a 2-D conv run (or, with is_conv=False, an LRN run) over input (W, H, C)."""
    w, h, c = dims
    dilated = max(dilation) > 1
    kx, ky = kernel
    if not dilated:
        kx = ky = max(kx, ky) | 1
    span_x, span_y = (kx - 1) * dilation[0] + 1, (ky - 1) * dilation[1] + 1
    if not dilated:
        span_x = span_y = kx
    if is_conv and not dilated and kx <= 7 and c <= 8 and m <= 8:
        return Tiles(1, 0, 0)  # streamed without the UBUF
    no_out_buf = is_conv and not dilated and c <= (8 if kx <= 7 else 4 if kx <= 11 else 1)
    capacity = (ub_size >> 10) * 1024 // 2
    blocks = -(-c // CHANNEL_BLOCK)
    in_elems = out_elems = 0
    for t in range(1, w + 1):
        tile_w = -(-w // t) + span_x - 1
        if tile_w < span_x:
            break
        ow = _out_width(tile_w, span_x, pads[0], pads[1], strides[0], deconv)
        oh = _out_width(h, span_y, pads[2], pads[3], strides[1], deconv)
        out_elems = ow * oh * min(m, CHANNEL_BLOCK)
        in_elems = _lines(tile_w * h * min(c, CHANNEL_BLOCK), blocks)[1] * 8
        if in_elems + (0 if no_out_buf else out_elems) <= capacity:
            return Tiles(t, 2 * in_elems, 0 if no_out_buf else 2 * out_elems)
    return Tiles(0, 2 * in_elems, 0 if no_out_buf else 2 * out_elems)


def pool_tiles(dims: tuple[int, int, int]) -> Tiles:
    """Tiles of a run without 2-D conv that pools (limited by the pooling unit, not the UBUF size)."""
    w, h, c = dims
    for t in range(1, w + 1):
        if w * h * min(c, CHANNEL_BLOCK) // t <= POOL_UNIT_ELEMS:
            return Tiles(t, 0, 0)
    return Tiles(0, 0, 0)


def run_tiles(run: Run, dims: tuple[int, int, int], ub_size: int) -> Tiles:
    """Tiles of one run reading (W, H, C), dispatched like the driver: LRN, pool-only/depthwise, 2-D conv."""
    if run.lrn & 1:
        return conv_tiles(dims, dims[2], (1, 1), (0, 0, 0, 0), (1, 1), (1, 1), ub_size, is_conv=False)
    if run.conv_enable == CONV_OFF or run.conv_enable & CONV_DW_BIT:
        return pool_tiles(dims) if run.pool_enable else Tiles(1, 0, 0)
    kx, ky = unpack2(run.p)
    pads = _pads(run.conv_pad)
    dil = tuple(max(d, 1) for d in unpack2(run.conv_dilation))
    strides = tuple(max(s, 1) for s in unpack2(run.conv_stride))  # 0 is reported by the stride rule
    deconv = bool(run.conv_enable & CONV_DECONV_BIT)
    return conv_tiles(dims, run.m, (kx, ky or kx), pads, strides, dil, ub_size, deconv=deconv)


def _pads(packed: int, left_top_mask: int = 0x7F) -> tuple[int, int, int, int]:
    """Pads as the driver reads them: conv pads have 7-bit left and top fields, pool pads 8-bit ones."""
    return packed & left_top_mask, (packed >> 8) & 0xFF, (packed >> 16) & left_top_mask, (packed >> 24) & 0xFF


@dataclass(frozen=True)
class _Geometry:
    """A run as the UBUF sees it: average pooling slides its window like a conv kernel."""

    conv: bool
    pool: bool  # max pooling (a second window after the conv)
    upsample: bool
    square: bool
    k: int
    pads: tuple[int, int, int, int]
    strides: tuple[int, int]
    pool_size: tuple[int, int]
    pool_stride: tuple[int, int]


def _run_geometry(run: Run) -> _Geometry:
    conv = bool(run.conv_enable & 1)
    upsample = run.pool_enable == POOL_UPSAMPLE
    pool = bool(run.pool_enable & POOL_MAX)
    p, conv_pad, conv_stride = run.p, run.conv_pad, run.conv_stride
    pool_size, pool_stride, pool_pad = unpack2(run.pool_size), unpack2(run.pool_stride), _pads(run.pool_pad, 0xFF)
    avg = run.pool_enable == POOL_AVG
    if avg:
        conv, p, conv_pad, conv_stride = True, run.pool_size & 0xFF, run.pool_pad, run.pool_stride
        pool_size, pool_stride, pool_pad = (0, 0), (1, 1), (0, 0, 0, 0)
    px, py = unpack2(p)
    py = py or px
    k = max(px, py) | 1
    pl, pr, pt, pb = _pads(conv_pad)
    pr, pt = pr + k - px, pt + k - py  # a smaller kernel is padded to k x k at the right and top
    sx, sy = unpack2(conv_stride)
    if not avg and not conv:
        pl = pr = pt = pb = 0
        sx = sy = 1
    if not avg and (pool or upsample):  # the pool's padding, seen through the conv stride
        pl, pr, pt, pb = pl + sx * pool_pad[0], pr + sx * pool_pad[1], pt + sy * pool_pad[2], pb + sy * pool_pad[3]
    strides = (max(sx, 1), max(sy, 1))
    return _Geometry(conv, pool, upsample, px == py, k, (pl, pr, pt, pb), strides, pool_size, pool_stride)


@dataclass
class _Region:
    """A run's output kept in the UBUF: its offset, its size in 16-byte lines and its (W, H, C)."""

    offset: int
    lines: int
    dims: tuple[int, int, int]


def single_tile_usage(conf: ConvConf, ub_size: int) -> int:
    """Peak UBUF bytes of the command when every run is one tile (checked for multi-run commands)."""
    outputs = bin(conf.topo).count("1")
    peak, written = 0, 0
    prev: _Region | None = None  # None: the run reads the layer input from memory
    for r, run in enumerate(conf.runs[: conf.topo.bit_length()]):
        to_memory = bool(conf.topo >> r & 1)
        w, h, c = (conf.w, conf.h, conf.c) if prev is None else prev.dims
        g = _run_geometry(run)
        (pl, pr, pt, pb), (sx, sy), k = g.pads, g.strides, g.k
        core_w, core_h = pl + w + pr, pt + h + pb
        conv_w, conv_h = (_cdiv(core_w - k, sx) + 1, _cdiv(core_h - k, sy) + 1) if g.conv else (core_w, core_h)
        if g.upsample:
            pooled = (2 * conv_w, 2 * conv_h)
        else:
            pooled = tuple(
                _cdiv(size - win, max(step, 1)) + 1
                for size, win, step in zip((conv_w, conv_h), g.pool_size, g.pool_stride)
            )
        if prev is None:
            in_offset = 0
            in_bytes = _lines(w * h * min(c, CHANNEL_BLOCK), -(-c // CHANNEL_BLOCK))[1] << 4
        else:
            in_offset, in_bytes = prev.offset, prev.lines << 4
        last_column = written == outputs - 1 and not g.conv
        out_offset = in_offset + (0 if last_column else in_bytes)
        out_elems = conv_w * conv_h if g.conv else pooled[0] * pooled[1]
        block, total = _lines(out_elems * min(run.m, CHANNEL_BLOCK), -(-run.m // CHANNEL_BLOCK))
        used = (block if to_memory else total) << 4
        if outputs == 1:  # one chain: ping-pong between the two ends of the UBUF
            out_offset = 0 if r & 1 else ub_size - used
            peak = max(peak, in_bytes + used)
        else:
            peak = max(peak, out_offset + used)
        if to_memory:
            written += 1
            prev = None
        else:
            next_dims = pooled if g.pool or g.upsample else (conv_w, conv_h)
            prev = _Region(out_offset, total, (next_dims[0], next_dims[1], run.m))
    return peak
