"""First-fit allocation of aligned byte ranges: gmem plans and local-memory slots of every target use it."""

from __future__ import annotations


class FreeList:
    """Ranges above `base`, each size rounded up to `alignment`; freed neighbours merge, and freeing the top
    range lowers `top` (the high-water mark callers read is the largest `top` they saw)."""

    def __init__(self, base: int = 0, alignment: int = 16) -> None:
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted
        self.top = base
        self.alignment = alignment

    def _align(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        size = self._align(size)
        for i, (off, sz) in enumerate(self.free):
            if sz >= size:
                self.free[i : i + 1] = [(off + size, sz - size)] if sz > size else []
                return off
        off, self.top = self.top, self.top + size
        return off

    def release(self, off: int, size: int) -> None:
        merged: list[tuple[int, int]] = []
        for o, s in sorted([*self.free, (off, self._align(size))]):
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        if merged and merged[-1][0] + merged[-1][1] == self.top:
            self.top = merged.pop()[0]
        self.free = merged
