"""Near copies among calibration samples (a picture and its mirror image): found, and said aloud when the
held-out report judges on them."""

from __future__ import annotations

import numpy as np

from npuc.models.images import model_inputs
from npuc.passes.calibration.near_copies import copies_note, copy_groups


def _pictures(count: int, shape: tuple[int, int] = (64, 64)) -> list[np.ndarray]:
    """Distinct smooth pictures (1, 3, H, W): random low-frequency patterns, as photos differ."""
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]] / max(shape)
    out = []
    for _ in range(count):
        f = rng.uniform(1, 4, size=(3, 2, 1, 1))
        phase = rng.uniform(0, 6.28, size=(3, 1, 1))
        out.append(np.sin(6.28 * (f[:, 0] * yy + f[:, 1] * xx) + phase)[None].astype(np.float32))
    return out


def test_mirrored_and_rotated_copies_share_a_group_distinct_pictures_do_not() -> None:
    a, b, c = _pictures(3)
    noisy = a + np.random.default_rng(1).normal(0, 1e-3, a.shape).astype(np.float32)  # re-encoded
    feeds = [{"x": v} for v in (a, b, a[..., ::-1], c, np.rot90(b, 1, axes=(2, 3)), noisy, b[..., ::-1, ::-1])]
    assert copy_groups(feeds) == [0, 1, 0, 2, 1, 0, 1]
    # a non-square input: only its own flips and the 180-degree turn are views of it
    wide = _pictures(2, (32, 96))
    assert copy_groups([{"x": wide[0]}, {"x": wide[1]}, {"x": wide[0][..., ::-1]}]) == [0, 1, 0]
    # channels last, and inputs npuc cannot picture (a token sequence) leave every sample alone
    assert copy_groups([{"x": np.moveaxis(v, 1, -1)} for v in (a, a[..., ::-1], b)]) == [0, 0, 1]
    assert copy_groups([{"ids": np.arange(32)[None]}, {"ids": np.arange(32)[None]}]) == [0, 1]


def test_real_sets_group_only_their_mirror_images() -> None:
    """model_inputs holds each face crop beside its mirror image; its text lines are all distinct."""
    faces = copy_groups(model_inputs("mtcnn_onet", 40))
    assert len(set(faces)) < 40
    lines = copy_groups(model_inputs("ppocrv6_rec_tiny", 48))
    assert lines == list(range(48))


def test_calibrate_says_when_held_out_samples_are_copies_of_calibration_samples() -> None:
    a, b, c = _pictures(3)
    feeds = {"a": a, "b": b, "c": c, "a-mirror": a[..., ::-1], "b-turned": b[..., ::-1, ::-1]}
    note = copies_note(["a-mirror", "c", "b-turned"], ["a", "b"], lambda name: {"x": feeds[name]})
    assert note.startswith("2 of the 3 held-out samples are near copies")
    assert copies_note(["c"], ["a", "b"], lambda name: {"x": feeds[name]}) == ""
