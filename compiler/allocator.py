"""Allocation of aligned byte ranges: first-fit as ops are emitted (FreeList, local-memory slots of every
target), and offline placement when every lifetime is known beforehand (place_by_size, gmem plans)."""

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


def place_by_size(blocks: list[tuple[int, int, int]], alignment: int = 16) -> tuple[list[int], int]:
    """Offsets of blocks (size, first step, last step) such that blocks live at a common step never share
    bytes, and the size of the region they need. Greedy by size: the largest block first, each at the lowest
    aligned offset clear of the placed blocks it meets in time. Unlike first-fit in time order, a small
    early block cannot strand a hole too small for the large blocks after it."""

    def align(size: int) -> int:
        return -(-size // alignment) * alignment

    offsets = [0] * len(blocks)
    placed: list[int] = []
    order = sorted(range(len(blocks)), key=lambda i: (-blocks[i][0], blocks[i][1], i))
    for i in order:
        size, first, last = blocks[i]
        size = align(size)
        busy = sorted(
            (offsets[j], offsets[j] + align(blocks[j][0]))
            for j in placed
            if blocks[j][1] <= last and first <= blocks[j][2]
        )
        at = 0
        for start, end in busy:
            if start - at >= size:
                break
            at = max(at, end)
        offsets[i] = at
        placed.append(i)
    total = max((offsets[i] + align(blocks[i][0]) for i in range(len(blocks))), default=0)
    return offsets, total


def place_first_fit(blocks: list[tuple[int, int, int]], alignment: int = 16) -> tuple[list[int], int]:
    """place_by_size's contract, by first-fit in time order: at each step the blocks born there are
    allocated, then those whose last step it is are freed."""
    offsets = [0] * len(blocks)
    free, top = FreeList(alignment=alignment), 0
    born: dict[int, list[int]] = {}
    dying: dict[int, list[int]] = {}
    for i, (_, first, last) in enumerate(blocks):  # indexed by step once: a scan per step was quadratic
        born.setdefault(first, []).append(i)
        dying.setdefault(last, []).append(i)
    for step in sorted(born.keys() | dying.keys()):
        for i in born.get(step, ()):
            offsets[i] = free.alloc(blocks[i][0])
        top = max(top, free.top)
        for i in dying.get(step, ()):
            free.release(offsets[i], blocks[i][0])
    return offsets, top


def place_blocks(blocks: list[tuple[int, int, int]], alignment: int = 16) -> tuple[list[int], int]:
    """The smaller of the two placements (neither heuristic wins on every lifetime pattern)."""
    by_size = place_by_size(blocks, alignment)
    first_fit = place_first_fit(blocks, alignment)
    return by_size if by_size[1] <= first_fit[1] else first_fit
