"""The cv18xx weight area: staged filters are stored whole when raw, slice by slice when compressed."""

from __future__ import annotations

import numpy as np

from npuc.backends.cv18xx import compression
from npuc.backends.cv18xx.weights import StagedWeight, WeightArea


def _filters(oc: int = 64, ic: int = 32, scale: float = 6.0) -> np.ndarray:
    """(1, oc, 9, ic) int8 filters with small magnitudes, which code in well under 8 bits."""
    rng = np.random.default_rng(0)
    return np.clip(np.round(rng.standard_normal((1, oc, 9, ic)) * scale), -127, 127).astype(np.int8)


def test_raw_filters_are_stored_once_and_sliced() -> None:
    area = WeightArea()
    staged = StagedWeight(area, "f", _filters(), "i8", compress=False)
    a, b = staged.slice(c=(0, 24)).place(), staged.slice(c=(24, 64)).place()
    assert [e.name for e in area.entries] == ["f"] and len(area.data) == 64 * 9 * 32
    assert not a.compressed and b.offset - a.offset == 24 * 9 * 32 and b.shape == (1, 40, 9, 32)


def test_compressed_slices_are_their_own_buffers_and_decode_to_the_slice() -> None:
    area = WeightArea()
    data = _filters()
    staged = StagedWeight(area, "f", data, "i8", compress=True)
    nested = staged.slice(c=(16, 64)).slice(c=(8, 24))  # channels 24..40 of the whole
    placed = nested.place()
    assert placed.compressed and placed.shape == (1, 16, 9, 32)
    assert [e.name for e in area.entries] == ["f@0,24,0_vlc"]
    start, size = placed.offset, area.entries[0].size
    decoded = compression.decompress(bytes(area.data[start : start + size]), 16 * 9 * 32, bf16=False)
    assert np.array_equal(decoded.view(np.int8).reshape(1, 16, 9, 32), data[:, 24:40])
    assert size < 16 * 9 * 32
    assert nested.place() == placed and len(area.entries) == 1  # asked again: the same buffer


def test_a_slice_that_does_not_shrink_stays_raw() -> None:
    area = WeightArea()
    noise = np.random.default_rng(1).integers(-128, 128, (1, 8, 9, 16)).astype(np.int8)  # 8 bits of entropy
    placed = StagedWeight(area, "n", noise, "i8", compress=True).place()
    assert not placed.compressed and bytes(area.data[: noise.nbytes]) == noise.tobytes()
