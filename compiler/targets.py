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
    output_names: tuple[str, ...] = ()  # where the graph was cut (--output-names); a re-import cuts it the same


@dataclass
class BuildResult:
    artifacts: list[Path]
    summary: dict[str, Any] = field(default_factory=dict)  # the target's own figures (`details` in record())
    notes: list[str] = field(default_factory=list)  # for the user: printed as `note:` lines
    target: str = ""  # the target that built it
    chip: str | None = None  # what it was built for (the target's default when none was asked)
    quant: str | None = None
    weight_bytes: int | None = None  # the constants the artifact carries
    host_ops: int = 0  # ops left to the host: runtime CPU functions, CPU custom layers, host tails

    def record(self) -> dict[str, Any]:
        """The machine-readable summary (`npuc build --json`): these keys for every target; what only one target
        has is under `details`."""
        from .version import VERSION

        return {
            "npuc": VERSION,
            "target": self.target,
            "chip": self.chip,
            "quant": self.quant,
            "artifacts": [{"path": str(a), "bytes": _artifact_bytes(a)} for a in self.artifacts],
            "weight_bytes": self.weight_bytes,
            "host_ops": self.host_ops,
            "notes": list(self.notes),
            "details": self.summary,
        }


def _artifact_bytes(path: Path) -> int:
    """A file's size, or the total of a folder's files."""
    if path.is_dir():
        return sum(f.stat().st_size for f in sorted(path.rglob("*")) if f.is_file())
    return path.stat().st_size if path.is_file() else 0


@dataclass(frozen=True)
class Target:
    name: str
    chips: tuple[str, ...]
    number_formats: tuple[str, ...]
    artifact: str
    status: str  # one honest sentence: what works today
    build: Callable[[BuildRequest], BuildResult] | None = None  # None: the target cannot build yet
    quants: tuple[str, ...] = ()  # the --quant values it takes (the first is its default)
    options: tuple[str, ...] = ()  # the option keys it reads (set by flags or --option KEY=VALUE)
    uses_calib: bool = False  # whether it reads a calibration table (--calib)


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


# 1 and 0 find the True and False keys (they hash alike)
BOOLEAN_WORDS = {True: True, False: False, "true": True, "false": False, "on": True, "off": False}


def bool_option(options: dict[str, Any], key: str, default: bool) -> bool:
    """`--option KEY=true|false` (also 1/0, on/off): anything else is an error, never a truthy string."""
    if key not in options:
        return default
    value = options[key]
    word = value.lower() if isinstance(value, str) else value
    if isinstance(word, float) or word not in BOOLEAN_WORDS:
        raise UserError(f"option {key}={value!r}: give true or false, e.g. --option {key}={str(default).lower()}")
    return BOOLEAN_WORDS[word]


def int_option(options: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    """`--option KEY=N` with N an integer in low..high."""
    value = options.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise UserError(f"option {key}={value!r}: give an integer in {low}..{high}, e.g. --option {key}={default}")
    return value


# option key -> the flag that sets it (keys without one come from --option KEY=VALUE)
FLAG_OF_OPTION = {
    "name": "--name", "mean": "--mean", "scale": "--scale", "color": "--color", "convert": "--convert",
    "input_dtype": "--input-dtype", "delegate": "--delegate", "float_layers": "--float-layers",
    "quant_input": "--quant-input", "quant_output": "--quant-output", "layer_group": "--no-layer-group",
    "allow_partial_table": "--allow-partial-table",
    "pixel_format": "--pixel-format", "aligned_input": "--aligned-input",
    "opt": "--opt", "weights": "--weights", "input_shapes_list": "--input-shape (given more than once)",
}  # fmt: skip


def check_request(target: Target, options: dict[str, Any], chip: str | None, quant: str | None,
                  calib: Any) -> None:  # fmt: skip
    """Refuse what `target` would ignore: an option or flag it does not read, a chip or number format it does not
    have, a calibration table it does not use. One line naming the flag and the targets that take it."""
    for key in options:
        if key in target.options:
            continue
        flag = FLAG_OF_OPTION.get(key, f"--option {key}")
        users = [t.name for t in all_targets() if key in t.options]
        where = f" (it is for {', '.join(users)})" if users else ""
        known = ", ".join(k for k in target.options if k not in FLAG_OF_OPTION) or "none"
        raise UserError(f"{flag} is not used by target '{target.name}'{where}; remove it (its --option keys: {known})")
    if chip is not None and chip not in target.chips:
        raise UserError(f"--chip {chip} is not a chip of target '{target.name}'; use one of {', '.join(target.chips)}")
    if quant is not None and quant not in target.quants:
        users = [t.name for t in all_targets() if quant in t.quants]
        where = f" (it is for {', '.join(users)})" if users else ""
        raise UserError(f"--quant {quant} is not a number format of target '{target.name}'{where}; "
                        f"use one of {', '.join(target.quants)}")  # fmt: skip
    if calib is not None and not target.uses_calib:
        users = [t.name for t in all_targets() if t.uses_calib]
        raise UserError(f"--calib is not used by target '{target.name}' (it computes in floating point); "
                        f"remove it (calibration tables are for {', '.join(users)})")  # fmt: skip
