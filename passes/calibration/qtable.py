"""tpu-mlir's mixed-precision qtable: which layers keep a float format instead of int8 (specs/quant.md §1.3).

The text format: `#` comment lines (tpu-mlir writes `# op_name   quantize_mode`), then one `name MODE` per line,
MODE one of F32, F16, BF16, INT8. `npuc calibrate --target-cos` writes one beside its table (`<table>.qtable`);
`npuc build` reads it from there, or from `--qtable FILE`, and keeps its BF16 layers in bf16.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_bytes, read_text_file
from npuc.compiler.sanitize import table_field

MODES = ("F32", "F16", "BF16", "INT8")
SUFFIX = ".qtable"
HEADER = "# op_name   quantize_mode"
MAX_BYTES = 16 << 20  # a qtable names layers; far larger is not one


def beside(table_path: str | Path) -> Path:
    """Where the qtable of a calibration table lives: `<table>.qtable`."""
    return Path(str(table_path) + SUFFIX)


def read_qtable(path: str | Path) -> dict[str, str]:
    """Layer name -> MODE, in file order; one-line errors name the file and line."""
    path = Path(path)
    text = read_text_file(path, "qtable", MAX_BYTES)
    modes: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"{path}:{number}"
        if len(fields) != 2:
            raise UserError(f"{where}: expected 'layer_name MODE', got {len(fields)} field(s)")
        name, mode = fields
        if mode.upper() not in MODES:
            raise UserError(f"{where}: mode {mode!r} is not one of {', '.join(MODES)}")
        if name in modes:
            raise UserError(f"{where}: layer '{name}' is listed twice; keep one line per layer")
        modes[name] = mode.upper()
    return modes


def bf16_layers(path: str | Path, known: set[str], target: str = "cv18xx") -> list[str]:
    """The BF16 layers of the qtable at `path`; every listed name must be in `known` (the graph's op and tensor
    names), and every mode must be one the target keeps (BF16 or INT8)."""
    modes = read_qtable(path)
    unknown = [n for n in modes if n not in known]
    if unknown:
        raise UserError(
            f"{path}: layer '{unknown[0]}' ({len(unknown)} of {len(modes)}) matches no op or tensor of the model; "
            "was it made for another model? Rerun `npuc calibrate --target-cos` for this one"
        )
    other = sorted({m for m in modes.values() if m not in ("BF16", "INT8")})
    if other:
        raise UserError(f"{path}: mode {other[0]} has no {target} form; keep layers in BF16 or INT8")
    return [n for n, m in modes.items() if m == "BF16"]


def format_qtable(names: Iterable[str], mode: str = "BF16", comments: Iterable[str] = ()) -> str:
    lines = [*(f"# {c}" for c in comments), HEADER, *(f"{table_field(n, 'qtable')} {mode}" for n in names)]
    return "\n".join(lines) + "\n"


def write_qtable(path: str | Path, names: Iterable[str], mode: str = "BF16", comments: Iterable[str] = ()) -> None:
    atomic_write_bytes(Path(path), format_qtable(names, mode, comments).encode())
