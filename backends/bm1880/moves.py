"""Emission of the BM1880 layers that run as units of their own: copies, nearest upsample, products.

Each works item by item and in row tiles that fit a lane (inputs, output and temporaries together):
- copy (slice/split/transpose): S2S GDMAs straight from the input's bytes to the output's, with the
  source strides scaled by the steps and permuted (single bytes when the last axis moves); no local memory;
- upsample: load the input rows, one TIU copy per (dy, dx) of the factor into the output tile read with
  strides (sh·W_out, sw), store the tile;
- interleave (a transposed conv's phases): per phase, load its rows and TIU-copy them into the output tile
  read with strides (sh·W_out, sw) from the phase's offset, store the tile;
- mul: a 16-bit product BD (the per-channel factor read with h/w strides 0), then a multiply-shift BD to int8.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from npuc.compiler.errors import UnsupportedError

from . import isa
from .emit import Emitter, LTensor, align, tile_bytes
from .kernels import arith
from .layers import Layer, LoweredNet, Shape4

COPY_LIMIT = isa.NPU_NUM * isa.LMEM_SIZE  # elements per S2S GDMA: the size a simulator operand may have


class Target(Protocol):
    """What the emitters need of codegen.Program."""

    net: LoweredNet
    offsets: dict[str, int]
    em: Emitter

    def neuron(self, load: bool, name: str, t: LTensor, n0: int, c0: int, h0: int, w0: int = 0) -> None: ...


def _gstrides(shape: Shape4) -> tuple[int, int, int]:
    _, c, h, w = shape
    return (c * h * w, h * w, w)


def row_tiles(h: int, lane_bytes: Callable[[int], int], what: str):
    """(first row, rows) tiles of the largest row count whose lane bytes fit local memory."""
    rows = h
    while rows > 1 and lane_bytes(rows) > isa.LMEM_SIZE:
        rows = max(1, min(rows - 1, rows * isa.LMEM_SIZE // max(1, lane_bytes(rows))))
    if lane_bytes(rows) > isa.LMEM_SIZE:
        raise UnsupportedError(f"{what}: one row does not fit the BM1880 local memory")
    return [(h0, min(rows, h - h0)) for h0 in range(0, h, rows)]


def copy(p: Target, layer: Layer) -> None:
    """The strided source region to the packed output, in pieces of whole rows. GDMA reads W contiguously, so a
    transpose that moves the last axis copies single bytes: the output's W walks on the GDMA's N axis."""
    src, out = layer.inputs[0], layer.output
    n, c, h, w = p.net.shapes[out]
    sstr, dstr = _gstrides(p.net.shapes[src]), _gstrides(p.net.shapes[out])
    full = (*sstr, 1)
    base = p.offsets[p.net.storage[src]] + sum(o * s for o, s in zip(layer.offsets, full, strict=True))
    walk = [full[a] * layer.steps[a] for a in layer.perm]  # the input stride output axis k walks
    rows = max(1, min(h, COPY_LIMIT // max(1, c * w)))
    for n0 in range(n):
        for h0 in range(0, h, rows):
            count = min(rows, h - h0)
            s_off = base + n0 * walk[0] + h0 * walk[2]
            d_off = p.offsets[p.net.storage[out]] + n0 * dstr[0] + h0 * dstr[2]
            if layer.perm[3] == 3:
                p.em.copy((1, c, count, w), (s_off, tuple(walk[:3])), (d_off, dstr))
            else:
                p.em.copy((w, c, count, 1), (s_off, (walk[3], walk[1], walk[2])), (d_off, (1, dstr[1], dstr[2])))


def _spread(p: Target, layer: Layer, pieces: list[tuple[str, int, int]]) -> None:
    """Output tiles of sh x sw blocks: per row tile, each (source, dy, dx) piece's rows (loaded once per source)
    TIU-copied into the output tile read with strides (sh·W_out, sw) from offset (dy, dx)."""
    n, c, h, w = p.net.shapes[pieces[0][0]]
    _, _, sh, sw = layer.steps
    wo = w * sw

    def lane(rows: int) -> int:
        return align(tile_bytes((1, c, rows, w))) + tile_bytes((1, c, rows * sh, wo))

    for n0 in range(n):
        for h0, rows in row_tiles(h, lane, f"{layer.kind} '{layer.name}'"):
            x = LTensor(0, (1, c, rows, w))
            y = LTensor(align(x.lane_bytes), (1, c, rows * sh, wo))
            ys, loaded = y.strides, None
            for source, dy, dx in pieces:
                if source != loaded:
                    p.neuron(True, source, x, n0, 0, h0)
                    loaded = source
                view = LTensor(y.addr + dy * wo + dx, x.shape, fixed=(ys[0], ys[1], sh * wo, sw))
                arith(p.em, "mul", view, x, 1)
            p.neuron(False, layer.output, y, n0, 0, h0 * sh)


def upsample(p: Target, layer: Layer) -> None:
    """Nearest upsample: the input copied to every (dy, dx) of its block."""
    _, _, sh, sw = layer.steps
    _spread(p, layer, [(layer.inputs[0], dy, dx) for dy in range(sh) for dx in range(sw)])


def interleave(p: Target, layer: Layer) -> None:
    """A transposed conv's s x s phase maps, phase k at (dy, dx) = divmod(k, sw) of each block."""
    sw = layer.steps[3]
    _spread(p, layer, [(phase, *divmod(k, sw)) for k, phase in enumerate(layer.inputs)])


def mul(p: Target, layer: Layer) -> None:
    x_name, s_name = layer.inputs
    n, c, h, w = p.net.shapes[layer.output]
    per_channel = p.net.shapes[s_name][2:] == (1, 1) and (h, w) != (1, 1)
    (m,) = layer.multipliers

    def lane(rows: int) -> int:
        tile = align(tile_bytes((1, c, rows, w)))
        return tile * (2 if per_channel else 3) + 2 * tile + (align(tile_bytes((1, c, 1, 1))) if per_channel else 0)

    for n0 in range(n):
        for h0, rows in row_tiles(h, lane, f"mul '{layer.name}'"):
            x = LTensor(0, (1, c, rows, w))
            step = align(x.lane_bytes)
            if per_channel:
                s_tile = LTensor(step, (1, c, 1, 1))
                p.neuron(True, s_name, s_tile, n0, 0, 0)
                s = LTensor(s_tile.addr, x.shape, fixed=(s_tile.strides[0], s_tile.strides[1], 0, 0))
                top = step + align(s_tile.lane_bytes)
            else:
                s = LTensor(step, x.shape)
                p.neuron(True, s_name, s, n0, 0, h0)
                top = 2 * step
            wide = LTensor(top, x.shape)  # 16-bit: two planes of x's size
            y = LTensor(top + 2 * step, x.shape)
            p.neuron(True, x_name, x, n0, 0, h0)
            arith(p.em, "mul", wide, x, s, opt_res0_int8=0)
            arith(p.em, "mul", y, wide, m, layer.rshift, const_signed=0, opt_opd0_int8=0)
            p.neuron(False, layer.output, y, n0, 0, h0)


MOVE_EMITTERS: dict[str, Callable[[Target, Layer], None]] = {
    "copy": copy,
    "upsample": upsample,
    "interleave": interleave,
    "mul": mul,
}
