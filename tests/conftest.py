"""Shared pytest fixtures: cached real third-party models and the vendor golden files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from golden import GOLDEN_ROOT
from qdq_cases import pplcnet, smallcnn, smallcnn_int8  # noqa: F401  (the QDQ export tests' fixtures)

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


@pytest.fixture(scope="session")
def yolo_default(real_model, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:  # noqa: ANN001
    """YOLOv8n, `npuc calibrate`'s default table (and its qtable) from photos 1-7, and the 8 photos' feeds."""
    import numpy as np

    import npuc
    from npuc.models.fetch import REAL_MODELS
    from npuc.models.images import model_inputs

    name = "yolov8n_320"
    model, folder, feeds = real_model(name), tmp_path_factory.mktemp("yolo_default"), model_inputs(name, 8)
    for i, feed in enumerate(feeds[1:]):
        np.savez(folder / f"{i}.npz", **feed)
    table = folder / "table.txt"
    npuc.calibrate(model, [folder], table, input_shapes=REAL_MODELS[name].input_shapes)
    return model, table, feeds


# `make test-fast` (pytest --fast): the inner loop without the vendor simulator and without real models.
SLOW_MARKERS = ("fetch_model(", "model_inputs(")  # module text that reaches the model downloads


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", help="leave out vendor-simulator and real-model tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fast"):
        return
    vendor = Path(__file__).parent / "vendor"
    texts: dict[Path, str] = {}

    def slow(item: pytest.Item) -> bool:
        path = Path(str(item.path))
        if path.is_relative_to(vendor) or "real_model" in getattr(item, "fixturenames", ()):
            return True
        if path not in texts:
            texts[path] = path.read_text()
        return any(marker in texts[path] for marker in SLOW_MARKERS)

    kept = [item for item in items if not slow(item)]
    config.hook.pytest_deselected(items=[item for item in items if slow(item)])
    items[:] = kept
