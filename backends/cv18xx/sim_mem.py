"""Memories of the CV18xx simulator: global memory regions and the per-lane local memory.

Both are byte arrays; tensors are gathered and scattered with vectorized index arithmetic. A local tensor's
channel c lives in lane (start_lane + c) % lanes at (start_lane + c) // lanes * c_stride inside that lane
(specs/cv18xx.md §3.3); global tensors are plain strided byte ranges inside one region.
"""

from __future__ import annotations

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
    total = int(np.prod(shape, dtype=np.int64)) * esz
    partial = int(np.prod([max(d, 1) for d in shape], dtype=np.int64)) * esz
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

    def read(self, addr: int, shape: Shape, strides: Strides, fmt: str) -> np.ndarray:
        esz, dtype = FORMATS[fmt]
        lane, off = self._index(addr, shape, strides, esz)
        return np.ascontiguousarray(self.data[lane, off]).view(dtype).reshape(shape)

    def write(self, addr: int, shape: Shape, strides: Strides, fmt: str, values: np.ndarray) -> None:
        esz, dtype = FORMATS[fmt]
        lane, off = self._index(addr, shape, strides, esz)
        raw = np.ascontiguousarray(np.asarray(values).astype(dtype).reshape(shape)).view(np.uint8)
        self.data[lane, off] = raw.reshape(off.shape)


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

    def read(self, region: int, addr: int, shape: Shape, strides: Strides, fmt: str) -> np.ndarray:
        esz, dtype = FORMATS[fmt]
        off = self._index(region, addr, shape, strides, esz)
        return np.ascontiguousarray(self.regions[region][off]).view(dtype).reshape(shape)

    def read_bytes(self, region: int, addr: int, size: int) -> np.ndarray:
        """`size` contiguous bytes (a compressed stream), checked to lie inside the region."""
        mem = self.regions.get(region)
        if mem is None or addr < 0 or size > MAX_ACCESS_BYTES or addr + size > len(mem):
            have = "missing" if mem is None else f"{len(mem)} bytes"
            raise CorruptFileError(f"global read of {size} bytes in region {region} at {addr:#x} is outside ({have})")
        return mem[addr : addr + size]

    def write(self, region: int, addr: int, shape: Shape, strides: Strides, fmt: str, values: np.ndarray) -> None:
        esz, dtype = FORMATS[fmt]
        off = self._index(region, addr, shape, strides, esz)
        raw = np.ascontiguousarray(np.asarray(values).astype(dtype).reshape(shape)).view(np.uint8)
        self.regions[region][off] = raw.reshape(off.shape)
