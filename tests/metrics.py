"""Comparison metrics the tests share."""

from __future__ import annotations

import numpy as np


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays taken as flat vectors, in float64."""
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def yolo_detections(output: np.ndarray, score: float = 0.25, iou: float = 0.45) -> list[tuple[int, np.ndarray]]:
    """(class, box x1 y1 x2 y2) after per-class non-maximum suppression of a YOLOv8 head [1, 4 + classes, N]
    (boxes as centre x, centre y, width, height), best first."""
    rows = output.reshape(output.shape[-2], -1).T.astype(np.float64)
    boxes = np.concatenate([rows[:, :2] - rows[:, 2:4] / 2, rows[:, :2] + rows[:, 2:4] / 2], axis=1)
    scores = rows[:, 4:]
    classes, best = scores.argmax(1), scores.max(1)
    kept = []
    for i in np.argsort(-best):
        if best[i] < score:
            break
        if all(c != classes[i] or box_iou(b, boxes[i]) < iou for c, b in kept):
            kept.append((int(classes[i]), boxes[i]))
    return kept


def box_iou(a: np.ndarray, b: np.ndarray) -> float:
    inter = np.clip(np.minimum(a[2:], b[2:]) - np.maximum(a[:2], b[:2]), 0, None).prod()
    union = np.prod(a[2:] - a[:2]) + np.prod(b[2:] - b[:2]) - inter
    return float(inter / union) if union > 0 else 0.0


def yolov8_head(box_logits: np.ndarray, class_logits: np.ndarray, size: int) -> np.ndarray:
    """What a YOLOv8 export computes after its head's logits, on the host: the DFL (a softmax over 16 distance
    bins per side, their expectation), anchor points at strides 8/16/32 of a `size`² input, sigmoid scores;
    returns [1, 4 + classes, N] as the export's output (centre x, centre y, width, height in pixels)."""
    bins = box_logits.reshape(4, 16, -1).astype(np.float64)
    p = np.exp(bins - bins.max(axis=1, keepdims=True))
    sides = (p / p.sum(axis=1, keepdims=True) * np.arange(16)[None, :, None]).sum(axis=1)  # l, t, r, b
    anchors, strides = [], []
    for stride in (8, 16, 32):
        y, x = np.mgrid[0 : size // stride, 0 : size // stride] + 0.5
        anchors.append(np.stack([x.ravel(), y.ravel()]))
        strides.append(np.full(x.size, stride))
    centre, stride = np.concatenate(anchors, axis=1), np.concatenate(strides)
    top_left, bottom_right = centre - sides[:2], centre + sides[2:]
    box = np.concatenate([(top_left + bottom_right) / 2, bottom_right - top_left]) * stride
    scores = 1.0 / (1.0 + np.exp(-class_logits.reshape(class_logits.shape[-2], -1).astype(np.float64)))
    return np.concatenate([box, scores])[None]
