"""Shared pytest fixtures: cached real third-party models and the vendor golden files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from golden import GOLDEN_ROOT
from npuc.models.fetch import fetch_model

# tests/ -> repo root -> its parent holds shared/golden (the same layout in CI).
GOLDEN_DIR = GOLDEN_ROOT


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """Path to the vendor-made golden files (read in place, never copied into the repo)."""
    return GOLDEN_DIR


@pytest.fixture(scope="session")
def real_model() -> Callable[[str], Path]:
    """``real_model(name)``: the verified cached ONNX file of a model in ``npuc.models.fetch.REAL_MODELS``."""
    fetched: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in fetched:
            fetched[name] = fetch_model(name)
        return fetched[name]

    return get
