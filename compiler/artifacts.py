"""Artifact registry: recognise a file or folder (ONNX model, cvimodel, bmodel, output tree) and inspect or
run it. Each frontend/backend registers an `ArtifactKind` from a module listed in ARTIFACT_MODULES."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UserError

ARTIFACT_MODULES = (
    "npuc.backends.onnx_artifact",
    "npuc.backends.cv18xx.artifact",
    "npuc.backends.bm1880.artifact",
    "npuc.backends.lyngor.artifact",
    "npuc.backends.dmp.artifact",
    "npuc.backends.bpu.artifact",
)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    pixel_format: str | None = None  # a raw camera frame the artifact preprocesses itself (its runtime's name)
    aligned_for: str | None = None  # such a frame with padded rows/planes: the chip whose alignment it follows


@dataclass
class ArtifactOptions:
    """Options `inspect` and `run` pass through; each kind reads what it understands."""

    disasm: bool = False
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    output_names: tuple[str, ...] = ()  # an ONNX model ended at these tensors (--output-names)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ArtifactKind:
    name: str
    matches: Callable[[Path], bool]  # cheap check: suffix, magic bytes, marker file
    describe: Callable[[Path, ArtifactOptions], str]
    inputs: Callable[[Path, ArtifactOptions], list[TensorSpec]] | None = None
    run: Callable[[Path, dict[str, np.ndarray], ArtifactOptions], dict[str, np.ndarray]] | None = None


_KINDS: dict[str, ArtifactKind] = {}


def register_artifact(kind: ArtifactKind) -> ArtifactKind:
    _KINDS[kind.name] = kind
    return kind


def _import(module: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not (exc.name and module.startswith(exc.name)):  # a missing module is fine; a broken one is not
            raise


def detect(path: Path) -> ArtifactKind:
    """The kind of artifact at `path`, or a UserError saying what npuc accepts. The modules are imported in
    order until a kind recognises the file (the first kind registered that matches, as if all were loaded):
    running a cvimodel does not import the other backends."""
    if not path.exists():
        raise UserError(f"file not found: {path}; check the path")
    for module in ARTIFACT_MODULES:
        _import(module)
        for kind in _KINDS.values():
            if kind.matches(path):
                return kind
    raise UserError(
        f"{path}: not a format npuc reads ({', '.join(sorted(_KINDS))}); pass an .onnx model or an npuc artifact"
    )


def check_options(kind: ArtifactKind, path: Path, options: ArtifactOptions) -> None:
    """Options only an ONNX model takes are an error for an artifact, not ignored."""
    if options.output_names and kind.name != "onnx":
        raise UserError(f"--output-names cuts an ONNX model; {path} is a {kind.name} artifact: drop the option")
