"""The WEIGHT section: constant tensors packed in the layouts the TIU reads, deduplicated and 16-byte aligned.

Conv filters and fully-connected weights may be stored VLC-compressed (compression.py), one buffer per slice
a kernel loads (a filter slice, a weight column tile): the TDMA decodes them on the way into local memory, so
the file and the DDR traffic shrink by what the coding saves. A slice is compressed only where its buffer is
smaller than its raw bytes.

Layouts (specs/cv18xx.md §3.4, §4): conv filters (oc, ic, kh, kw) -> (1, oc, kh*kw, ic); int8 per-channel
records of 9 bytes (int32 bias, uint32 multiplier, uint8 shift; 5 without a bias); bf16 conv bias as an fp32
split into a high-16 plane and a low-16 plane; FC bias as 4 (int32) or 2 (bf16 hi/lo) row planes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import numpy as np

from npuc.backends.cv18xx import compression
from npuc.backends.cv18xx.lmem import ALIGN, GTensor, align
from npuc.compiler.numformats.bf16_fp16 import float32_to_bf16_bits

REGION_WEIGHT = 1
DTYPE_CODES = {np.dtype(np.int8): 6, np.dtype(np.uint8): 7, np.dtype(np.uint16): 3, np.dtype(np.int32): 1}


@dataclass
class WeightEntry:
    name: str
    offset: int
    size: int
    shape: tuple[int, ...]
    dtype: int  # cvimodel DType code


@dataclass
class WeightArea:
    data: bytearray = field(default_factory=bytearray)
    entries: list[WeightEntry] = field(default_factory=list)
    _by_digest: dict[bytes, int] = field(default_factory=dict)
    _placed: dict[str, GTensor] = field(default_factory=dict)  # add_once / add_compressed results by name

    def _place(self, raw: bytes) -> int:
        digest = hashlib.md5(raw).digest()
        offset = self._by_digest.get(digest)
        if offset is None:
            offset = len(self.data)
            self.data += raw + bytes(align(len(raw)) - len(raw))
            self._by_digest[digest] = offset
        return offset

    def add(self, name: str, array: np.ndarray, fmt: str = "i8") -> GTensor:
        """Place `array` (any shape) and return it as a contiguous 4-D GTensor view; identical bytes share."""
        raw = np.ascontiguousarray(array).tobytes()
        offset = self._place(raw)
        shape4 = tuple([1] * (4 - array.ndim) + list(array.shape))[-4:] if array.ndim <= 4 else (1, 1, 1, array.size)
        self.entries.append(WeightEntry(name, offset, len(raw), shape4, DTYPE_CODES.get(array.dtype, 7)))
        esize = 2 if fmt == "bf16" else 1
        n, c, h, w = shape4
        if esize == 2 and array.dtype.itemsize == 1:
            w //= 2
        return GTensor.contiguous(REGION_WEIGHT, offset, (n, c, h, w), fmt)

    def add_once(self, name: str, array: np.ndarray, fmt: str = "i8") -> GTensor:
        """`add`, with one weight-map entry however often a kernel asks for the same named constant."""
        if name not in self._placed:
            self._placed[name] = self.add(name, array, fmt)
        return self._placed[name]

    def add_compressed(self, name: str, array: np.ndarray, fmt: str) -> GTensor:
        """Place the 4-D int8 (or bf16-bit) `array` as one VLC buffer when that is smaller than its bytes,
        else raw. The weight map lists a buffer as the uint8 bytes it is (the runtime maps entries only for
        CPU routines). A name asked for again gets the same placement."""
        if name in self._placed:
            return self._placed[name]
        blob = compression.compress(array)
        if len(blob) >= array.nbytes:
            placed = self.add(name, array, fmt)
        else:
            offset = self._place(blob)
            self.entries.append(
                WeightEntry(f"{name}_vlc", offset, len(blob), (1, 1, 1, len(blob)), DTYPE_CODES[np.dtype(np.uint8)])
            )
            placed = replace(GTensor.contiguous(REGION_WEIGHT, offset, array.shape, fmt), compressed=True)
        self._placed[name] = placed
        return placed

    def section(self) -> bytes:
        """At least one aligned block: a zero-size weight region is not safe on every runtime."""
        return bytes(self.data) if self.data else bytes(ALIGN)


@dataclass(frozen=True)
class StagedWeight:
    """Constant data a kernel slices like a GTensor before it is stored. `place()` stores what a load takes:
    with `compress`, the slice itself as one VLC buffer (a filter loaded in pieces is stored as those
    pieces); without, the whole constant once, viewed at the slice."""

    area: WeightArea
    name: str
    whole: np.ndarray  # 4-D, in the layout the TIU reads (bf16 as uint16 bits)
    fmt: str
    compress: bool
    ranges: tuple[tuple[int, int], ...] | None = None  # the slice's (n, c, h) ranges; None: all of it

    @property
    def shape(self) -> tuple[int, int, int, int]:
        n, c, h = self.ranges or [(0, size) for size in self.whole.shape[:3]]
        return (n[1] - n[0], c[1] - c[0], h[1] - h[0], self.whole.shape[3])

    def slice(self, n: tuple[int, int] = None, c: tuple[int, int] = None, h: tuple[int, int] = None) -> StagedWeight:
        base = self.ranges or tuple((0, size) for size in self.whole.shape[:3])
        ranges = tuple((b[0] + r[0], b[0] + r[1]) if r else b for r, b in zip((n, c, h), base))
        return replace(self, ranges=None if ranges == tuple((0, s) for s in self.whole.shape[:3]) else ranges)

    def place(self) -> GTensor:
        if not self.compress:
            whole = self.area.add_once(self.name, self.whole, self.fmt)
            return whole if self.ranges is None else whole.slice(*self.ranges)
        if self.ranges is None:
            return self.area.add_compressed(self.name, self.whole, self.fmt)
        (n0, n1), (c0, c1), (h0, h1) = self.ranges
        part = np.ascontiguousarray(self.whole[n0:n1, c0:c1, h0:h1])
        return self.area.add_compressed(f"{self.name}@{n0},{c0},{h0}", part, self.fmt)


def conv_filter(weight: np.ndarray) -> np.ndarray:
    """(oc, ic, kh, kw) -> (1, oc, kh*kw, ic), the per-lane [kh][kw][ic] order the TIU reads."""
    oc, ic, kh, kw = weight.shape
    return weight.transpose(0, 2, 3, 1).reshape(1, oc, kh * kw, ic)


def channel_records(bias: np.ndarray | None, multiplier: np.ndarray, rshift: np.ndarray) -> np.ndarray:
    """(1, oc, 1, 9) uint8 per-channel quantization records (5 bytes each without a bias)."""
    oc = multiplier.size
    parts = []
    if bias is not None:
        parts.append(np.asarray(bias, "<i4").reshape(oc, 1).view(np.uint8))
    parts.append(np.asarray(multiplier, np.int64).astype("<u4").reshape(oc, 1).view(np.uint8))
    parts.append(np.asarray(rshift, np.int64).astype(np.uint8).reshape(oc, 1))
    records = np.concatenate(parts, axis=1)
    return records.reshape(1, oc, 1, records.shape[1])


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return float32_to_bf16_bits(np.asarray(x, np.float32)).astype(np.uint16)


def fp32_planes(x: np.ndarray) -> np.ndarray:
    """(2, n) uint16: the high halves of the fp32 values, then their low halves."""
    bits = np.asarray(x, np.float32).reshape(-1).view(np.uint32)
    return np.stack([(bits >> 16).astype(np.uint16), (bits & 0xFFFF).astype(np.uint16)])


def int32_planes(x: np.ndarray) -> np.ndarray:
    """(4, n) uint8: byte p of every int32, plane by plane."""
    raw = np.asarray(x, "<i4").reshape(-1, 1).view(np.uint8)
    return np.ascontiguousarray(raw.T)
