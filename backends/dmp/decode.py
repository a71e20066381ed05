"""The YOLOv8 detection decode that npuc's `yolo_decode` CPU custom layer computes (Ultralytics' DFL head):
per anchor, a softmax over `reg_max` bins for each of the 4 box sides, its expectation as the distance, the
box (centre x, centre y, width, height) around the cell centre scaled by the level's stride, and sigmoid
class scores. The lowering checks a graph's decode against it; the simulator runs it."""

from __future__ import annotations

import numpy as np

from npuc.compiler.kernels.activation import apply_activation
from npuc.compiler.kernels.elementwise import softmax
from npuc.compiler.ops import Activation


def anchor_grid(levels: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """((2, N) cell centres in grid units, (N,) strides) for levels of (W, H, stride), row-major per level."""
    centres, strides = [], []
    for w, h, stride in levels:
        ys, xs = np.meshgrid(np.arange(h, dtype=np.float32), np.arange(w, dtype=np.float32), indexing="ij")
        centres.append(np.stack([xs.reshape(-1), ys.reshape(-1)]) + np.float32(0.5))
        strides.append(np.full(w * h, stride, np.float32))
    return np.concatenate(centres, axis=1), np.concatenate(strides)


def yolo_decode(x: np.ndarray, levels: list[tuple[int, int, int]], reg_max: int, sigmoid: bool = True) -> np.ndarray:
    """(4 + classes, N) boxes and scores from the (4·reg_max + classes, N) head output, in float32; `sigmoid`
    False: the class rows already hold scores (the DV700 applied the sigmoid)."""
    x = np.asarray(x, np.float32)
    n = x.shape[1]
    bins = softmax(x[: 4 * reg_max].reshape(4, reg_max, n), 1)
    dist = np.einsum("srn,r->sn", bins, np.arange(reg_max, dtype=np.float32))
    centre, stride = anchor_grid(levels)
    top_left, bottom_right = centre - dist[:2], centre + dist[2:]
    box = np.concatenate([(top_left + bottom_right) / 2, bottom_right - top_left]) * stride
    scores = apply_activation(x[4 * reg_max :], Activation("sigmoid")) if sigmoid else x[4 * reg_max :]
    return np.concatenate([box, scores]).astype(np.float32)
