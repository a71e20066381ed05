"""Extra calibration views for the refinement: small deterministic crops, rescales and tone changes of the
calibration samples themselves, so a per-layer refit sees more than the exact pictures it is given.

Views act on the network's input tensors (N, C, H, W), after the user's preprocessing, so they need no
knowledge of the model's normalisation: a geometric part (a crop box in the picture's own coordinates,
resampled bilinearly back to H × W; boxes reaching outside repeat the edge) and a tonal part (contrast
about, and brightness in units of, each sample's per-channel mean and spread). Inputs that are not 4-D
(or not float) are passed through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class View:
    """A crop box (fractions of height / width: top, left, size) and a tone change (contrast, brightness)."""

    top: float
    left: float
    size: float
    contrast: float = 1.0
    brightness: float = 0.0  # in units of the sample's per-channel standard deviation


# zoom in at the centre, two offset crops, zoom out; each with a different tone change
VIEWS = (
    View(0.06, 0.06, 0.88, contrast=0.8),
    View(0.0, 0.0, 0.9, brightness=0.25),
    View(0.1, 0.1, 0.9, contrast=1.25),
    View(-0.06, -0.06, 1.12, brightness=-0.25),
)


def _axis(n: int, start: float, size: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear source indices (low, high) and weight of the high one for n outputs over [start, start+size)·n."""
    pos = (start + (np.arange(n) + 0.5) * size / n) * n - 0.5
    pos = np.clip(pos, 0.0, n - 1.0)
    low = np.floor(pos).astype(np.intp)
    high = np.minimum(low + 1, n - 1)
    return low, high, (pos - low).astype(np.float32)


def resample(x: np.ndarray, view: View) -> np.ndarray:
    """The view's crop box of every sample of `x` (N, C, H, W) resampled to H × W."""
    h, w = x.shape[2:]
    y0, y1, fy = _axis(h, view.top, view.size)
    x0, x1, fx = _axis(w, view.left, view.size)
    rows = x[:, :, y0] * (1 - fy)[:, None] + x[:, :, y1] * fy[:, None]
    return rows[..., x0] * (1 - fx) + rows[..., x1] * fx


def tone(x: np.ndarray, view: View) -> np.ndarray:
    """Contrast about each sample's per-channel mean, then a brightness shift of `brightness` spreads."""
    mean = x.mean(axis=(2, 3), keepdims=True)
    spread = x.std(axis=(2, 3), keepdims=True)
    return mean + view.contrast * (x - mean) + view.brightness * spread


def apply_view(x: np.ndarray, view: View) -> np.ndarray:
    if x.ndim != 4 or not np.issubdtype(x.dtype, np.floating):
        return x
    return tone(resample(x, view), view).astype(x.dtype)


def augment_feeds(
    feeds: Sequence[Mapping[str, np.ndarray]], views: Sequence[View] = VIEWS
) -> list[dict[str, np.ndarray]]:
    """The samples followed by every view of every sample (len(feeds) · (1 + len(views)) samples)."""
    out = [dict(f) for f in feeds]
    for view in views:
        out += [{name: apply_view(np.asarray(value), view) for name, value in f.items()} for f in feeds]
    return out
