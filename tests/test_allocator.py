"""Byte-range allocation: first-fit as code is emitted, and offline placement by size for gmem plans."""

from __future__ import annotations

import numpy as np
import pytest

from npuc.compiler.allocator import place_blocks, place_by_size, place_first_fit


def test_a_small_early_block_does_not_strand_a_hole() -> None:
    # resnet18 on cv181x: the quantized input (3x224x224 int8) feeds the first group, whose 64x56x56 output
    # feeds the next group
    blocks = [(150_528, 0, 1), (200_704, 1, 2), (200_704, 2, 3)]
    offsets, total = place_by_size(blocks)
    assert total == 401_408
    assert offsets == [200_704, 0, 200_704]
    assert place_first_fit(blocks)[1] == 551_936  # the input at 0 leaves a hole too small for the third block
    assert place_blocks(blocks) == (offsets, total)


@pytest.mark.parametrize("place", [place_by_size, place_first_fit, place_blocks])
@pytest.mark.parametrize("seed", range(6))
def test_random_blocks_never_share_live_bytes(seed: int, place) -> None:  # noqa: ANN001
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(40):
        first = int(rng.integers(0, 30))
        blocks.append((int(rng.integers(1, 5000)), first, first + int(rng.integers(0, 6))))
    offsets, total = place(blocks, alignment=16)
    assert all(o % 16 == 0 for o in offsets)
    for i, (si, fi, li) in enumerate(blocks):
        assert offsets[i] + si <= total
        for j, (sj, fj, lj) in enumerate(blocks[:i]):
            if fi <= lj and fj <= li:  # live at a common step
                assert offsets[i] + si <= offsets[j] or offsets[j] + sj <= offsets[i], (i, j)
    live_peak = max(sum(-(-s // 16) * 16 for s, f, last in blocks if f <= step <= last) for step in range(36))
    assert live_peak <= total
    assert place(list(blocks)) == (offsets, total)  # deterministic
    if place is place_blocks:
        assert total == min(place_by_size(blocks)[1], place_first_fit(blocks)[1])


def test_no_blocks() -> None:
    assert place_blocks([]) == ([], 0)
