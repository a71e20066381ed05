"""Makefile dependency files (`--depfile`): `targets: prerequisites`, every file a command read, so `make`
reruns it when any of them changes. Paths are escaped for make (spaces, '#', '$'); the line is written
atomically."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .fileio import atomic_write_bytes


def make_escape(path: str | Path) -> str:
    """A path as one make word: backslash before spaces and '#', '$' doubled."""
    return str(path).replace("$", "$$").replace("#", "\\#").replace(" ", "\\ ")


def onnx_external_files(model: Path) -> list[Path]:
    """The external-data files an ONNX model's initializers name (beside the model), in first-use order."""
    if model.suffix.lower() != ".onnx" or not model.is_file():
        return []
    import onnx
    from onnx.external_data_helper import uses_external_data

    proto = onnx.load(str(model), load_external_data=False)
    found: dict[Path, None] = {}
    for tensor in proto.graph.initializer:
        if uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), None)
            if location:
                found[model.parent / location] = None
    return list(found)


def write_depfile(path: str | Path, targets: Iterable[str | Path], prerequisites: Iterable[str | Path | None]) -> None:
    """One rule: every target depends on every prerequisite (None entries and repeats dropped)."""
    deps = list(dict.fromkeys(str(p) for p in prerequisites if p is not None))
    line = f"{' '.join(make_escape(t) for t in targets)}: {' '.join(make_escape(d) for d in deps)}\n"
    atomic_write_bytes(Path(path), line.encode())
