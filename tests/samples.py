"""Seeded random calibration samples for generated models: one .npy per sample in a folder of their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def random_samples(folder: Path, shape: tuple[int, ...], count: int) -> Path:
    """`folder` holding `count` standard-normal float32 arrays of `shape` (sample i from seed i)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        np.save(folder / f"{i}.npy", np.random.default_rng(i).standard_normal(shape).astype(np.float32))
    return folder
