"""Near copies among calibration samples: the same picture mirrored, rotated by 180° (or by 90° for a square
input) or re-encoded, which augmented sets and model test sets (a photo beside its mirror image) hold.

`--method auto` sets every fifth sample apart for its closing report and --target-cos; a report sample that is a
mirror image of a table sample is not unseen, and the held-out figures then overstate what unseen pictures get,
so calibrate says how many report samples are copies (`copies_note`). Measured on PP-LCNet (bench/accuracy.py's
cross-photo halves: the four rotations of each photo, mirrored, calibrate; the other half's photos judge, mean /
worst output cosine): half 1's report samples were rotations of its calibration photos, --target-cos 0.99 was met
on them and no bf16 layer kept: 0.976 / 0.784 on unseen photos. Dealing each picture's copies to one side of
the split (report and folds) gave 0.984 / 0.889 there (KL chosen instead of MSE, six bf16 layers), half 0 0.9925 /
0.935 -> 0.9922 / 0.892, but O-Net's box output on unseen faces 0.99849 -> 0.99757 (tpu-mlir's file 0.99833) and
one of issue 19's unseen photo rotations misread: with fewer distinct pictures per fold the choices get noisier,
so the split itself stays per sample.

A sample's signature is its 4-D inputs averaged down to SIGNATURE x SIGNATURE cells per channel, centred and
normalised; two samples are near copies when one's signature and a mirrored / rotated view of the other's have
cosine COPY_COSINE or more. Distinct pictures measured here stay well below: 19 photos at most 0.85, 48 cropped
text lines 0.988, 30 face crops 0.79; a mirror image 1.0, a rotated and resized photo 0.999+.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

SIGNATURE = 16  # cells per spatial axis
COPY_COSINE = 0.995
MAX_COMPARED = 2000  # samples compared pairwise (the similarity matrix is this squared); later ones stand alone


def signature(feed: dict[str, np.ndarray]) -> tuple[np.ndarray, bool] | None:
    """The sample's 4-D inputs as (channels, SIGNATURE, SIGNATURE) cell means, stacked, and whether their spatial
    axes are equal (90° rotations then count); None without any such input."""
    cells, square = [], True
    for value in feed.values():
        a = np.asarray(value, np.float64)
        if a.ndim != 4 or a.shape[0] != 1:
            continue
        a = a[0] if not (a.shape[-1] <= 4 < a.shape[1]) else np.moveaxis(a[0], -1, 0)  # channels first
        if min(a.shape[1:]) < SIGNATURE:
            continue
        rows = np.linspace(0, a.shape[1], SIGNATURE + 1).astype(int)[:-1]
        cols = np.linspace(0, a.shape[2], SIGNATURE + 1).astype(int)[:-1]
        cells.append(np.add.reduceat(np.add.reduceat(a, rows, axis=1), cols, axis=2))
        square &= a.shape[1] == a.shape[2]
    return (np.concatenate(cells), square) if cells else None


def _views(sig: np.ndarray, square: bool) -> np.ndarray:
    """The signature's mirrored and rotated views (8 for a square input, else 4), centred and unit length."""
    views = [sig, sig[:, ::-1], sig[:, :, ::-1], sig[:, ::-1, ::-1]]
    if square:
        views += [np.swapaxes(v, 1, 2) for v in views]
    flat = np.stack([v.reshape(-1) for v in views])
    flat = flat - flat.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(flat, axis=1, keepdims=True)
    return np.divide(flat, norm, out=np.zeros_like(flat), where=norm > 0)


def copy_groups(feeds: Iterable[dict[str, np.ndarray]]) -> list[int]:
    """A group number per sample (numbered in order of first member): near copies share one, every other sample
    has its own. Reads the feeds one at a time (a generator keeps one sample in memory)."""
    sigs = [signature(feed) for feed in feeds]
    groups = list(range(len(sigs)))
    if not sigs or sigs[0] is None:
        return groups
    usable = [i for i, s in enumerate(sigs) if s is not None and s[0].shape == sigs[0][0].shape]
    if len(usable) < 2:
        return groups
    views = np.stack([_views(*sigs[i]) for i in usable])  # samples, views, cells
    similar = np.einsum("id,jvd->ijv", views[:, 0], views).max(axis=2) >= COPY_COSINE
    parent = list(range(len(usable)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in zip(*np.nonzero(np.triu(similar, 1))):
        a, b = root(int(i)), root(int(j))
        parent[max(a, b)] = min(a, b)
    for k, i in enumerate(usable):
        groups[i] = usable[root(k)]
    first: dict[int, int] = {}
    return [first.setdefault(g, len(first)) for g in groups]


def copies_note(report: Sequence[Any], used: Sequence[Any], load: Callable[[Any], dict[str, np.ndarray]]) -> str:
    """What calibrate says when report samples are near copies of table samples (`load`: a sample's feed)."""
    both = [*report, *used][:MAX_COMPARED]
    groups = copy_groups(load(f) for f in both)
    seen = {g for g in groups[len(report) :]}
    copied = sum(g in seen for g in groups[: len(report)])
    if not copied:
        return ""
    return (f"{copied} of the {len(report)} held-out samples are near copies (mirrored, rotated) of calibration "
            "samples: the held-out report and --target-cos judge partly on pictures the table saw; calibrate on "
            "distinct pictures to measure unseen ones")  # fmt: skip
