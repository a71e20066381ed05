"""Target registry: what each vendor backend is, what it can build today, and how to build it.

A backend registers one `Target` from its `target.py` module; this file only lists those modules, so adding
a target touches nothing else in the compiler.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError
from .ir import Graph

TARGET_MODULES = (
    "npuc.backends.cv18xx.target",
    "npuc.backends.bm1880.target",
    "npuc.backends.lyngor.target",
    "npuc.backends.dmp.target",
    "npuc.backends.bpu.target",
)


@dataclass
class BuildRequest:
    """Everything a backend needs: the canonical float graph and the user's choices."""

    graph: Graph  # canonicalized float IR, input shapes pinned
    model_path: Path
    output: Path
    chip: str | None = None
    quant: str | None = None
    calib_table: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)  # target-specific flags


@dataclass
class BuildResult:
    artifacts: list[Path]
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # for the user: printed as `note:` lines


@dataclass(frozen=True)
class Target:
    name: str
    chips: tuple[str, ...]
    number_formats: tuple[str, ...]
    artifact: str
    status: str  # one honest sentence: what works today
    build: Callable[[BuildRequest], BuildResult] | None = None  # None: the target cannot build yet


_TARGETS: dict[str, Target] = {}


def register_target(target: Target) -> Target:
    _TARGETS[target.name] = target
    return target


def _load() -> None:
    for module in TARGET_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not (exc.name and module.startswith(exc.name)):  # a missing module is fine; a broken one is not
                raise


def all_targets() -> list[Target]:
    _load()
    return [_TARGETS[name] for name in sorted(_TARGETS)]


def get_target(name: str) -> Target:
    _load()
    if name not in _TARGETS:
        raise UserError(f"unknown target '{name}'; choose one of: {', '.join(sorted(_TARGETS))} (see `npuc targets`)")
    return _TARGETS[name]
