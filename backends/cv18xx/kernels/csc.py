"""YUV frame -> uint8 RGB planes (backends/cv18xx/preprocess.py), the colour conversion of fused preprocessing.

tpu-mlir's YUV kernel (TgYuv420Kernel) in facts: BT.601 limited range,
    R = 1.164 (Y - 16) + 1.596 (V - 128)
    G = 1.164 (Y - 16) - 0.813 (V - 128) - 0.391 (U - 128)
    B = 1.164 (Y - 16) + 2.018 (U - 128)
computed in bf16 with each 2x2 block of pixels sharing its chroma, the result stored as uint8 (the store's TDMA
rounds and saturates to 0..255). Frames: Y plane h x w, then for nv12/nv21 h/2 rows of w bytes of interleaved
chroma (u v / v u), for yuv420_planar a U plane then a V plane of h/2 x w/2.

A tile is P row pairs, row pair p on lane p: Y (1, P, 2, w), the chroma row (1, P, 1, w/2) each. The
interleaved chroma row is loaded whole and split by two TIU copies reading every other element; chroma is
widened to 2x2 blocks by four strided TIU copies; R, G, B are a multiply by a constant and an add each.
"""

from __future__ import annotations

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, does_not_fit, kernel, op_where
from npuc.backends.cv18xx.kernels.tiling import largest_fit
from npuc.backends.cv18xx.lmem import GTensor, LTensor, local_bytes
from npuc.backends.cv18xx.preprocess import CSC_KIND, FusedCsc
from npuc.backends.cv18xx.weights import bf16_bits
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op

MAX_TIU_DIM = 4095
# the formulas' constants: (Y offset, Y gain), chroma offset, and per output plane the (U, V) gains
Y_OFFSET, Y_GAIN, UV_OFFSET = -16.0, 1.164, -128.0
GAINS = {"r": (0.0, 1.596), "g": (-0.391, -0.813), "b": (2.018, 0.0)}
FULL_TILES = 5  # Y, U widened, V widened, the plane being made, a product


def _bits(value: float) -> int:
    return int(bf16_bits(np.float32(value)))


def _rows(g: GTensor, start: int, shape: tuple[int, int, int, int], row: int) -> GTensor:
    """`shape` bytes of a frame plane from byte `start`, lane stride `shape[2] * row` (a row pair or row)."""
    _, p, r, w = shape
    return GTensor(g.region, g.offset + start, shape, "u8", (p * r * row, r * row, row, 1))


def _chroma(cg: Codegen, a: FusedCsc, frame: GTensor, local, p0: int, p: int, w: int) -> tuple:  # noqa: ANN001
    """The tile's U and V (1, p, 1, w/2) bf16, loaded and split as the frame format lays them out."""
    s, f = cg.stream, a.frame
    half = (1, p, 1, w // 2)
    u, v = local.tensor(half, "bf16"), local.tensor(half, "bf16")
    if a.layout == "yuv420":
        dma.load(s, _rows(frame, f.u_offset + p0 * f.chroma_row, half, f.chroma_row), u)
        dma.load(s, _rows(frame, f.v_offset + p0 * f.chroma_row, half, f.chroma_row), v)
        return u, v
    uv = local.tensor((1, p, 1, w), "bf16")
    dma.load(s, _rows(frame, f.u_offset + p0 * f.chroma_row, (1, p, 1, w), f.chroma_row), uv)
    first, second = (v, u) if a.layout == "nv21" else (u, v)
    for k, dst in enumerate((first, second)):  # every other element, from the first or the second
        src = LTensor(uv.addr + 2 * k, half, "bf16", (uv.strides[0], uv.strides[1], uv.strides[2], 4))
        s.tiu(tiu.copy(dst, src))
    return u, v


def _widen(cg: Codegen, dst: LTensor, src: LTensor) -> None:
    """dst (1, p, 2, w) = each element of src (1, p, 1, w/2) repeated over a 2x2 block."""
    w = dst.shape[3]
    for i in range(2):
        for j in range(2):
            view = LTensor(dst.addr + (i * w + j) * 2, src.shape, "bf16", (dst.strides[0], dst.strides[1], 4 * w, 4))
            cg.stream.tiu(tiu.copy(view, src))


@kernel(CSC_KIND)
def yuv_to_rgb(cg: Codegen, op: Op) -> None:
    a: FusedCsc = op.attrs
    place = cg.plan.places[op.inputs[0]]
    rgb = cg.gtensor(op.outputs[0])
    n, c, h, w = rgb.shape
    if n != 1 or h % 2 or w % 2 or w > MAX_TIU_DIM:
        raise UserError(f"op '{op.name}': a YUV frame must be one picture with even height and width up to "
                        f"{MAX_TIU_DIM}, not {n}x{h}x{w}")  # fmt: skip
    frame = GTensor(place.region, place.offset, (1, 1, 1, 1), "u8")
    s = cg.stream
    local = cg.local(op)
    per_pair = FULL_TILES * local_bytes(cg.chip, (1, 1, 2, w), "bf16") + 4 * local_bytes(cg.chip, (1, 1, 1, w), "bf16")
    pairs = largest_fit(h // 2, lambda p: -(-p // cg.chip.lanes) * per_pair <= cg.chip.lmem_size)
    if pairs == 0:
        raise does_not_fit(op_where(op), f"one row pair of its {h}x{w} frame", cg.chip)
    for p0 in range(0, h // 2, pairs):
        p = min(pairs, h // 2 - p0)
        local.reset()
        full = (1, p, 2, w)
        y = local.tensor(full, "bf16")
        dma.load(s, _rows(frame, p0 * 2 * a.frame.row, full, a.frame.row), y)
        u, v = _chroma(cg, a, frame, local, p0, p, w)
        for t in (u, v):
            s.tiu(tiu.add(t, t, _bits(UV_OFFSET)))
        s.tiu(tiu.add(y, y, _bits(Y_OFFSET)))
        s.tiu(tiu.mul(y, y, _bits(Y_GAIN)))
        wide_u, wide_v = local.tensor(full, "bf16"), local.tensor(full, "bf16")
        _widen(cg, wide_u, u)
        _widen(cg, wide_v, v)
        out, product = local.tensor(full, "bf16"), local.tensor(full, "bf16")
        for k, plane in enumerate(a.planes):
            s.tiu(tiu.copy(out, y))
            for wide, gain in zip((wide_u, wide_v), GAINS[plane]):
                if gain:
                    s.tiu(tiu.mul(product, wide, _bits(gain)))
                    s.tiu(tiu.add(out, out, product))
            dst = GTensor(rgb.region, rgb.offset + k * h * w + p0 * 2 * w, full, "u8", (p * 2 * w, 2 * w, w, 1))
            dma.store(s, out, dst)  # bf16 -> uint8: rounded, saturated to 0..255
