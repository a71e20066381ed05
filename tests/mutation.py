"""Random damage to an artifact's bytes, for the readers' fuzz tests."""

from __future__ import annotations

import random


def mutate(data: bytes, rng: random.Random, hot: int, hot_share: float) -> bytes:
    """A truncation, 1-4 bit flips or an overwrite of 1-8 bytes; a `hot_share` of them land in the first
    `hot` bytes (the headers), the rest anywhere."""
    buf = bytearray(data)
    span = min(len(buf), hot) if rng.random() < hot_share else len(buf)
    kind = rng.randrange(3)
    if kind == 0:
        return bytes(buf[: rng.randrange(span)])
    if kind == 1:
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(span)
            buf[pos] ^= 1 << rng.randrange(8)
        return bytes(buf)
    pos = rng.randrange(span)
    buf[pos : pos + rng.randint(1, 8)] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(buf)
