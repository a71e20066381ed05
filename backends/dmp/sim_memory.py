"""The simulated DV700 io buffer: a byte array with bounds-checked typed views, and fp16 rounding."""

from __future__ import annotations

import numpy as np

from npuc.compiler.errors import CorruptFileError

from .layout import whc8_decode

MAX_IO_BYTES = 1 << 30  # the boards carry 1-2 GiB of DRAM for everything; no io buffer comes near it


def f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


class Memory:
    """The io buffer with bounds-checked typed views."""

    def __init__(self, size: int) -> None:
        if not 0 <= size <= MAX_IO_BYTES:
            raise CorruptFileError(
                f"io size {size} is out of range (a DV700 io buffer holds at most {MAX_IO_BYTES}); regenerate it"
            )
        self.data = np.zeros(size, np.uint8)

    def read(self, offs: int, count: int, dtype: str) -> np.ndarray:
        n = count * np.dtype(dtype).itemsize
        if offs < 0 or offs + n > self.data.size:
            raise CorruptFileError(f"io read [{offs}, {offs + n}) is outside the {self.data.size}-byte io buffer")
        return self.data[offs : offs + n].view(dtype).copy()

    def write(self, offs: int, values: np.ndarray) -> None:
        raw = np.ascontiguousarray(values).view(np.uint8).reshape(-1)
        if offs < 0 or offs + raw.size > self.data.size:
            raise CorruptFileError(
                f"io write [{offs}, {offs + raw.size}) is outside the {self.data.size}-byte io buffer"
            )
        self.data[offs : offs + raw.size] = raw

    def read_hwc(self, offs: int, dims: list[int] | tuple[int, ...], whc8: bool, dtype: str = "float16") -> np.ndarray:
        w, h, c = dims
        flat = self.read(offs, w * h * c, dtype)
        return whc8_decode(flat, w, h, c) if whc8 else flat.reshape(h, w, c)
