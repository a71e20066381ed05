"""Memories of the CV18xx simulator: global memory regions and the per-lane local memory.

Both are byte arrays. A local tensor's channel c lives in lane (start_lane + c) % lanes at
(start_lane + c) // lanes * c_stride inside that lane (specs/cv18xx.md §3.3); global tensors are plain strided
byte ranges inside one region. Accesses are numpy views with the access's strides over those bytes (a local
tensor as at most three: the channels in its first lane group, the whole groups after it, the rest), bounds
checked from the extremes of the strides; a write whose elements could share bytes goes through per-byte
index arrays instead, which keep the last value of each byte as the element order gives it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from npuc.compiler.errors import CorruptFileError

Shape = tuple[int, int, int, int]
MAX_ACCESS_BYTES = 1 << 26  # no real descriptor moves more; guards against absurd shapes in damaged files
Strides = tuple[int, int, int, int]  # bytes per step of n, c, h, w


def _check_size(shape: Shape, esz: int) -> None:
    # each dimension on its own too: the index arithmetic broadcasts partial sums before an empty w makes the
    # total 0 (a (1024, 2570, 16384, 0) access would allocate 321 GiB on the way)
    total = partial = esz
    for d in shape:
        total *= d
        partial *= max(d, 1)
    if total > MAX_ACCESS_BYTES or partial > MAX_ACCESS_BYTES or min(shape, default=0) < 0:
        raise CorruptFileError(f"memory access of shape {shape} ({total} bytes) is larger than any memory")


# Element formats the hardware moves: name -> (bytes, numpy dtype).
FORMATS = {"i8": (1, np.int8), "u8": (1, np.uint8), "bf16": (2, np.uint16), "i16": (2, np.int16)}


def default_strides(shape: Shape, esz: int, lanes: int, eu_bytes: int, eu_align: bool = True) -> Strides:
    """cvikernel's default local layout: w packed, h rows, channel blocks (EU-aligned), n over channel groups."""
    n, c, h, w = shape
    c_str = h * w * esz
    if eu_align:
        c_str = -(-c_str // eu_bytes) * eu_bytes
    return (c_str * -(-c // lanes), c_str, w * esz, esz)


_INDEX_CACHE: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
INDEX_CACHE_BYTES = 64 << 20  # kernels touch the same tiles again and again; this bounds what that costs
_index_cache_bytes = 0


def _local_index(lanes: int, size: int, addr: int, shape: Shape, strides: Strides, esz: int
                 ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(lane, byte offset) of every byte of a local-memory operand, read-only; recently used ones are kept
    (least recently used dropped first) within INDEX_CACHE_BYTES."""
    global _index_cache_bytes
    key = (lanes, size, addr, shape, strides, esz)
    hit = _INDEX_CACHE.get(key)
    if hit is not None:
        _INDEX_CACHE.move_to_end(key)
        return hit
    found = _compute_local_index(lanes, size, addr, shape, strides, esz)
    cost = found[1].nbytes
    if cost <= INDEX_CACHE_BYTES // 8:
        _INDEX_CACHE[key] = found
        _index_cache_bytes += cost
        while _index_cache_bytes > INDEX_CACHE_BYTES:
            _, (_, dropped) = _INDEX_CACHE.popitem(last=False)
            _index_cache_bytes -= dropped.nbytes
    return found


def _compute_local_index(lanes: int, size: int, addr: int, shape: Shape, strides: Strides, esz: int
                         ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    n, c, h, w = shape
    start_lane, local = divmod(addr, size)
    chans = start_lane + np.arange(c)
    lane = (chans % lanes)[None, :, None, None, None]
    off = (
        local
        + (chans // lanes)[None, :, None, None, None] * strides[1]
        + np.arange(n)[:, None, None, None, None] * strides[0]
        + np.arange(h)[None, None, :, None, None] * strides[2]
        + np.arange(w)[None, None, None, :, None] * strides[3]
        + np.arange(esz)[None, None, None, None, :]
    )
    if start_lane >= lanes or off.size and (off.min() < 0 or off.max() >= size):
        raise CorruptFileError(
            f"local memory access at {addr:#x} shape {shape} strides {strides} leaves the {size}-byte lane"
        )
    off.setflags(write=False)
    return np.broadcast_to(lane, off.shape), off


def _span(shape: Shape, strides: Strides) -> tuple[int, int]:
    """(lowest, highest) offset of an element's first byte relative to the base, for a non-empty shape."""
    steps = [(d - 1) * s for d, s in zip(shape, strides)]
    return sum(x for x in steps if x < 0), sum(x for x in steps if x > 0)


def _disjoint(counts: tuple[int, ...], strides: tuple[int, ...], esz: int) -> bool:
    """Do the elements of this layout occupy distinct bytes? (sufficient test: each stride, smallest first, steps
    over everything the smaller ones span)"""
    extent = esz
    for stride, count in sorted((abs(s), d) for d, s in zip(counts, strides) if d > 1):
        if stride < extent:
            return False
        extent += stride * (count - 1)
    return True


def _view(buffer: np.ndarray, dtype: type, offset: int, shape: tuple, strides: tuple) -> np.ndarray:
    return np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offset, strides=strides)


@dataclass
class LocalMemory:
    lanes: int
    size: int  # bytes per lane
    data: np.ndarray  # (lanes, size) uint8

    @classmethod
    def create(cls, lanes: int, size: int) -> LocalMemory:
        return cls(lanes, size, np.zeros((lanes, size), np.uint8))

    def _index(self, addr: int, shape: Shape, strides: Strides, esz: int) -> tuple[np.ndarray, np.ndarray]:
        _check_size(shape, esz)
        return _local_index(self.lanes, self.size, addr, tuple(shape), tuple(strides), esz)

    def _pieces(self, addr: int, shape: Shape, strides: Strides, fmt: str) -> list[tuple[int, int, np.ndarray]]:
        """(first channel, channel count, view) covering the access, checked to stay inside the lanes; [] when
        it is empty."""
        esz, dtype = FORMATS[fmt]
        _check_size(shape, esz)
        n, c, h, w = shape
        ns, cs, hs, ws = strides
        lanes, size = self.lanes, self.size
        start_lane, local = divmod(addr, size)
        groups = (start_lane + c - 1) // lanes + 1  # lane groups the channels run through
        empty = n * c * h * w == 0
        if not empty:
            low, high = _span((n, groups, h, w), (ns, cs, hs, ws))
        if start_lane >= lanes or not empty and (local + low < 0 or local + high + esz > size):
            raise CorruptFileError(
                f"local memory access at {addr:#x} shape {shape} strides {strides} leaves the {size}-byte lane"
            )
        if empty:
            return []
        flat = self.data  # (lanes, size) C-contiguous: lane L's byte b at L * size + b
        first = min(lanes - start_lane, c)
        pieces = [(0, first, _view(flat, dtype, start_lane * size + local, (n, first, h, w), (ns, size, hs, ws)))]
        whole, rest = divmod(c - first, lanes)
        if whole:
            view = _view(flat, dtype, local + cs, (n, whole, lanes, h, w), (ns, cs, size, hs, ws))
            pieces.append((first, whole * lanes, view))
        if rest:
            view = _view(flat, dtype, local + (1 + whole) * cs, (n, rest, h, w), (ns, size, hs, ws))
            pieces.append((first + whole * lanes, rest, view))
        return pieces

    def read(self, addr: int, shape: Shape, strides: Strides, fmt: str) -> np.ndarray:
        pieces = self._pieces(addr, shape, strides, fmt)
        if len(pieces) == 1:
            return np.array(pieces[0][2])
        out = np.zeros(shape, FORMATS[fmt][1])
        for first, count, view in pieces:
            out[:, first : first + count].reshape(view.shape)[...] = view  # splitting an axis keeps a view
        return out

    def write(self, addr: int, shape: Shape, strides: Strides, fmt: str, values: np.ndarray) -> None:
        esz, dtype = FORMATS[fmt]
        pieces = self._pieces(addr, shape, strides, fmt)
        values = np.asarray(values).astype(dtype).reshape(shape)
        n, c, h, w = shape
        groups = (addr // self.size + c - 1) // self.lanes + 1
        if not _disjoint((n, groups, h, w), tuple(strides), esz):
            lane, off = self._index(addr, shape, strides, esz)
            self.data[lane, off] = np.ascontiguousarray(values).view(np.uint8).reshape(off.shape)
            return
        for first, count, view in pieces:
            view[...] = values[:, first : first + count].reshape(view.shape)


@dataclass
class GlobalMemory:
    """The 8 gmem regions (0 shared, 1 weight, 2 private, 3..7 io) as separate byte arrays."""

    regions: dict[int, np.ndarray]

    def _index(self, region: int, addr: int, shape: Shape, strides: Strides, esz: int) -> np.ndarray:
        _check_size(shape, esz)
        n, c, h, w = shape
        off = (
            addr
            + np.arange(n)[:, None, None, None, None] * strides[0]
            + np.arange(c)[None, :, None, None, None] * strides[1]
            + np.arange(h)[None, None, :, None, None] * strides[2]
            + np.arange(w)[None, None, None, :, None] * strides[3]
            + np.arange(esz)[None, None, None, None, :]
        )
        mem = self.regions.get(region)
        if mem is None or off.size and (off.min() < 0 or off.max() >= len(mem)):
            size = "missing" if mem is None else f"{len(mem)} bytes"
            raise CorruptFileError(f"global access region {region} at {addr:#x} shape {shape} is outside ({size})")
        return off

    def _view(self, region: int, addr: int, shape: Shape, strides: Strides, fmt: str) -> np.ndarray | None:
        """The access as a view of its region, checked to lie inside it; None when it is empty."""
        esz, dtype = FORMATS[fmt]
        _check_size(shape, esz)
        mem = self.regions.get(region)
        empty = math.prod(shape) == 0
        if not empty:
            low, high = _span(shape, strides)
        if mem is None or not empty and (addr + low < 0 or addr + high + esz > len(mem)):
            size = "missing" if mem is None else f"{len(mem)} bytes"
            raise CorruptFileError(f"global access region {region} at {addr:#x} shape {shape} is outside ({size})")
        return None if empty else _view(mem, dtype, addr, tuple(shape), tuple(strides))

    def read(self, region: int, addr: int, shape: Shape, strides: Strides, fmt: str) -> np.ndarray:
        view = self._view(region, addr, shape, strides, fmt)
        return np.zeros(shape, FORMATS[fmt][1]) if view is None else np.array(view)

    def read_bytes(self, region: int, addr: int, size: int) -> np.ndarray:
        """`size` contiguous bytes (a compressed stream), checked to lie inside the region."""
        mem = self.regions.get(region)
        if mem is None or addr < 0 or size > MAX_ACCESS_BYTES or addr + size > len(mem):
            have = "missing" if mem is None else f"{len(mem)} bytes"
            raise CorruptFileError(f"global read of {size} bytes in region {region} at {addr:#x} is outside ({have})")
        return mem[addr : addr + size]

    def write(self, region: int, addr: int, shape: Shape, strides: Strides, fmt: str, values: np.ndarray) -> None:
        esz, dtype = FORMATS[fmt]
        view = self._view(region, addr, shape, strides, fmt)
        values = np.asarray(values).astype(dtype).reshape(shape)
        if view is None:
            return
        if _disjoint(shape, strides, esz):
            view[...] = values
            return
        off = self._index(region, addr, shape, strides, esz)
        self.regions[region][off] = np.ascontiguousarray(values).view(np.uint8).reshape(off.shape)
