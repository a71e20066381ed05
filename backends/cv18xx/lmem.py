"""Tensors in global and local memory as the code generator sees them, and the local-memory allocator.

Local layout (specs/cv18xx.md §3.3): channel c of a tensor starting in lane 0 lives in lane c % lanes at
(c // lanes) * c_stride; c_stride is H*W*esz, rounded up to the 16-byte EU width when `eu_align`. Global
tensors are strided byte ranges in one region (0 shared, 1 weight, 2 private, 3.. io).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from npuc.backends.cv18xx.chips import ChipSpec
from npuc.compiler.errors import UserError

ESIZE = {"i8": 1, "u8": 1, "bf16": 2}
TDMA_FMT = {"i8": 1, "u8": 1, "bf16": 2}  # u8 is int8 with int8_sign clear (dma.py)
ALIGN = 16


def align(value: int, to: int = ALIGN) -> int:
    return -(-value // to) * to


@dataclass(frozen=True)
class GTensor:
    """A global-memory operand: region, byte offset, NCHW shape and byte strides. A `compressed` one is a VLC
    buffer (compression.py) that decodes to the dense `shape`; a TDMA load takes it whole."""

    region: int
    offset: int
    shape: tuple[int, int, int, int]
    fmt: str
    strides: tuple[int, int, int, int] = (0, 0, 0, 0)
    compressed: bool = False

    @classmethod
    def contiguous(cls, region: int, offset: int, shape: tuple[int, ...], fmt: str) -> GTensor:
        n, c, h, w = shape
        e = ESIZE[fmt]
        return cls(region, offset, (n, c, h, w), fmt, (c * h * w * e, h * w * e, w * e, e))

    def slice(self, n: tuple[int, int] = None, c: tuple[int, int] = None, h: tuple[int, int] = None) -> GTensor:
        """The sub-tensor [n0:n1, c0:c1, h0:h1, :] (None keeps a whole dimension)."""
        if self.compressed:
            raise ValueError("a VLC-compressed tensor is loaded whole; slice its data before compressing")
        ranges = [n or (0, self.shape[0]), c or (0, self.shape[1]), h or (0, self.shape[2])]
        offset = self.offset + sum(r[0] * s for r, s in zip(ranges, self.strides[:3]))
        shape = (ranges[0][1] - ranges[0][0], ranges[1][1] - ranges[1][0], ranges[2][1] - ranges[2][0], self.shape[3])
        return replace(self, offset=offset, shape=shape)

    def reshaped(self, shape: tuple[int, int, int, int]) -> GTensor:
        return GTensor.contiguous(self.region, self.offset, shape, self.fmt)


@dataclass(frozen=True)
class LTensor:
    """A local-memory operand starting in lane 0 at byte `addr` of every lane."""

    addr: int
    shape: tuple[int, int, int, int]
    fmt: str
    strides: tuple[int, int, int, int]

    @property
    def esz(self) -> int:
        return ESIZE[self.fmt]


def channel_view(chip: ChipSpec, t: LTensor, c0: int, c1: int) -> LTensor:
    """Channels [c0, c1) of local tensor `t`, c0 a whole number of lanes in: they start in lane 0,
    c0 / lanes channel strides up every lane, with `t`'s strides."""
    if c0 % chip.lanes:
        raise ValueError(f"a channel view starts at a lane boundary, not at channel {c0}")
    return LTensor(t.addr + (c0 // chip.lanes) * t.strides[1], (t.shape[0], c1 - c0, *t.shape[2:]), t.fmt, t.strides)


def local_strides(
    chip: ChipSpec, shape: tuple[int, int, int, int], fmt: str, eu_align: bool = True
) -> tuple[int, int, int, int]:
    n, c, h, w = shape
    e = ESIZE[fmt]
    c_str = align(h * w * e, chip.eu_bytes) if eu_align else h * w * e
    return (c_str * -(-c // chip.lanes), c_str, w * e, e)


def local_bytes(chip: ChipSpec, shape: tuple[int, int, int, int], fmt: str, eu_align: bool = True) -> int:
    """Bytes one lane needs for the tensor (16-byte rounded so the next tensor starts aligned)."""
    return align(shape[0] * local_strides(chip, shape, fmt, eu_align)[0])


class LocalAllocator:
    """Bump allocation inside one lane's local memory; `reset` frees everything (between tiles/layers)."""

    def __init__(self, chip: ChipSpec, where: str) -> None:
        self.chip = chip
        self.where = where
        self.top = 0

    def reset(self, top: int = 0) -> None:
        """Free everything allocated after `top` (a value of `self.top` saved earlier)."""
        self.top = top

    def free_bytes(self) -> int:
        return self.chip.lmem_size - self.top

    def tensor(self, shape: tuple[int, int, int, int], fmt: str, eu_align: bool = True) -> LTensor:
        size = local_bytes(self.chip, shape, fmt, eu_align)
        if self.top + size > self.chip.lmem_size:
            raise UserError(
                f"{self.where}: a {'x'.join(map(str, shape))} {fmt} tile needs {self.top + size} bytes of local "
                f"memory per lane, the {self.chip.name} has {self.chip.lmem_size}; the layer cannot be tiled to "
                "fit: make it smaller or build for another target"
            )
        t = LTensor(self.top, shape, fmt, local_strides(self.chip, shape, fmt, eu_align))
        self.top += size
        return t

    def raw(self, size: int) -> int:
        """`size` bytes per lane (e.g. a 16-bit plane pair); returns the lane offset."""
        if self.top + align(size) > self.chip.lmem_size:
            raise UserError(f"{self.where}: local memory exhausted ({self.top + size} bytes per lane)")
        addr = self.top
        self.top += align(size)
        return addr


@dataclass(frozen=True)
class Resident:
    """A constant a kernel reads from local memory: its local shape, format and alignment, and `source()`,
    which places it in the weight area (called once, when the code that loads it is emitted)."""

    shape: tuple[int, int, int, int]
    fmt: str
    eu_align: bool
    source: Callable[[], GTensor]
