"""Read and write tpu-mlir's `cali_table` text format (specs/quant.md §1.3), so tables move between the tools.

Layout: `#` header lines (with `###` separators), `# op_name    threshold    min    max`, then one
`name threshold min max` row per tensor (`%.7f`), then optional blocks each opened by a marker line:
`#int4_th` and `mqbench-fp8` (same four columns), `#weight_scale` / `#weight_scale_fp8`
(`name n s1..sn [m zp1..zpm]`), `#asym_op` and `#int4_op` (one name per line). As in tpu-mlir's importer,
any other `#` line returns to the main block.

Determinism: a table read from a file keeps its header lines verbatim (known fields re-rendered from the
dataclass), so read → write is byte-identical. A new table's `# genetated time:` (sic, as tpu-mlir spells
it) comes from SOURCE_DATE_EPOCH (UTC) when set, else the fixed `1970-01-01 00:00:00` — never the clock.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_bytes, read_text_file
from npuc.compiler.sanitize import table_field

TIME_KEY = "genetated time"  # tpu-mlir's spelling; other tools match on it
COLUMNS_LINE = "# op_name    threshold    min    max"
FIXED_TIME = "1970-01-01 00:00:00"
MAX_TABLE_BYTES = 64 << 20

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ROW_RE = re.compile(rf"^(\S+)\s+({_NUM})\s+({_NUM})\s+({_NUM})$")
_HEADER_RE = re.compile(r"^#\s*([^:#]+?)\s*:\s?(.*)$")


@dataclass(frozen=True)
class Threshold:
    """One row: symmetric threshold and the observed range."""

    threshold: float
    min: float
    max: float


@dataclass(frozen=True)
class WeightScale:
    """A `#weight_scale` row: per-channel scales and optional zero points (from a QAT tool)."""

    scales: tuple[float, ...]
    zero_points: tuple[float, ...] = ()


# Block marker substrings, in tpu-mlir's match order, and the attribute each block fills.
_MARKERS: tuple[tuple[str, str], ...] = (
    ("#weight_scale", "weight_scales"),
    ("#int4_th", "int4_entries"),
    ("#tpu-mlir-fp8", "entries"),  # header marker of an fp8 table: rows stay in the main block
    ("mqbench-fp8", "fp8_entries"),
    ("asym_op", "asym_ops"),
    ("int4_op", "int4_ops"),
)


@dataclass
class CalibrationTable:
    """An ordered cali_table: main rows plus header fields and the optional blocks."""

    entries: dict[str, Threshold] = field(default_factory=dict)
    histogram_bins: int | None = 2048
    sample_number: int | None = None
    tune_number: int | None = None
    method: str | None = None
    preprocess: str | None = None  # Preprocess.spec() of pictures calibrated on (npuc's line; tpu-mlir skips it)
    inputs: str | None = None  # digest of what made the table (model, samples, settings): `build --config` reuses it
    mlir_version: str = "npuc cali version 1.0"
    mlir_file: str = ""
    generated_time: str | None = None  # None: SOURCE_DATE_EPOCH or FIXED_TIME when written
    fp8: bool = False  # header says `#tpu-mlir-fp8 caliration table` instead of `# histogram number`
    int4_entries: dict[str, Threshold] = field(default_factory=dict)
    fp8_entries: dict[str, Threshold] = field(default_factory=dict)
    weight_scales: dict[str, WeightScale] = field(default_factory=dict)
    asym_ops: list[str] = field(default_factory=list)
    int4_ops: list[str] = field(default_factory=list)
    header_lines: list[str] | None = None  # verbatim header of a table read from a file
    block_markers: dict[str, str] = field(default_factory=dict)  # attribute -> marker line as read

    def thresholds(self) -> dict[str, float]:
        """name -> threshold of the main block."""
        return {name: e.threshold for name, e in self.entries.items()}


# ---------------------------------------------------------------------------------------------------------
# Header fields: (key as written, attribute, parse, render)


def _parse_int(text: str) -> int:
    return int(text.strip())


_HEADER_FIELDS: tuple[tuple[str, str, Callable[[str], object], Callable[[object], str]], ...] = (
    ("mlir version", "mlir_version", str, str),
    ("mlir", "mlir_file", str, str),
    (TIME_KEY, "generated_time", str, str),
    ("quantization threshold calculation method", "method", str, str),
    ("histogram number", "histogram_bins", _parse_int, str),
    ("sample number", "sample_number", _parse_int, str),
    ("tune number", "tune_number", _parse_int, str),
    ("preprocess", "preprocess", str, str),
    ("inputs", "inputs", str, str),
)
_FIELD_BY_KEY = MappingProxyType({key: (attr, parse, render) for key, attr, parse, render in _HEADER_FIELDS})


def default_generated_time(environ: Mapping[str, str] = os.environ) -> str:
    """SOURCE_DATE_EPOCH (seconds, UTC) formatted like tpu-mlir's str(datetime), else FIXED_TIME."""
    epoch = environ.get("SOURCE_DATE_EPOCH")
    if epoch is None:
        return FIXED_TIME
    try:
        stamp = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise UserError(f"SOURCE_DATE_EPOCH={epoch!r} is not a Unix timestamp; set it to integer seconds") from None
    return stamp.strftime("%Y-%m-%d %H:%M:%S")


def _standard_header(table: CalibrationTable) -> list[str]:
    """The header tpu-mlir's run_calibration writes (method line only when a method is set)."""
    lines = [
        f"# mlir version: {table.mlir_version}",
        f"# mlir: {table.mlir_file}",
        f"# {TIME_KEY}: {table.generated_time or default_generated_time()}",
    ]
    if table.method is not None:
        lines.append(f"# quantization threshold calculation method: {table.method}")
    if table.fp8:
        lines.append("#tpu-mlir-fp8 caliration table")
    elif table.histogram_bins is not None:
        lines.append(f"# histogram number: {table.histogram_bins}")
    if table.sample_number is not None:
        lines.append(f"# sample number: {table.sample_number}")
    if table.preprocess is not None:
        lines.append(f"# preprocess: {table.preprocess}")
    if table.inputs is not None:
        lines.append(f"# inputs: {table.inputs}")
    lines.append("###")
    if table.tune_number is not None:
        lines += [f"# tune number: {table.tune_number}", "###"]
    lines.append(COLUMNS_LINE)
    return lines


def _render_header(table: CalibrationTable) -> list[str]:
    if table.header_lines is None:
        return _standard_header(table)
    lines = []
    for line in table.header_lines:
        m = _HEADER_RE.match(line)
        spec = _FIELD_BY_KEY.get(m.group(1)) if m else None
        if spec is None:
            lines.append(line)
            continue
        attr, _, render = spec
        value = getattr(table, attr)
        if value is not None:  # a field cleared on the dataclass drops its line
            lines.append(line[: m.start(2)] + render(value))
    return lines


def _row(name: str, e: Threshold) -> str:
    return f"{table_field(name, 'cali_table')} {e.threshold:.7f} {e.min:.7f} {e.max:.7f}"


def _weight_row(name: str, w: WeightScale) -> str:
    parts = [table_field(name, "cali_table"), str(len(w.scales)), *(repr(float(s)) for s in w.scales)]
    if w.zero_points:
        parts += [str(len(w.zero_points)), *(repr(float(z)) for z in w.zero_points)]
    return " ".join(parts)


# attribute -> (default marker line, row renderer)
_BLOCK_WRITERS: tuple[tuple[str, str, Callable[[CalibrationTable], list[str]]], ...] = (
    ("int4_entries", "#int4_th", lambda t: [_row(n, e) for n, e in t.int4_entries.items()]),
    ("fp8_entries", "#mqbench-fp8", lambda t: [_row(n, e) for n, e in t.fp8_entries.items()]),
    ("weight_scales", "#weight_scale", lambda t: [_weight_row(n, w) for n, w in t.weight_scales.items()]),
    ("asym_ops", "#asym_op", lambda t: list(t.asym_ops)),
    ("int4_ops", "#int4_op", lambda t: list(t.int4_ops)),
)


def format_table(table: CalibrationTable) -> str:
    """The table as cali_table text (newline-terminated lines)."""
    lines = _render_header(table)
    lines += [_row(name, e) for name, e in table.entries.items()]
    for attr, marker, render in _BLOCK_WRITERS:
        if getattr(table, attr):
            lines += ["", table.block_markers.get(attr, marker), *render(table)]
    return "\n".join(lines) + "\n"


def write_table(table: CalibrationTable, path: str | Path) -> None:
    """Write atomically (temp file + rename) so a failed run never leaves a partial table."""
    atomic_write_bytes(Path(path), format_table(table).encode("utf-8"))


# ---------------------------------------------------------------------------------------------------------
# Reading


def _block_of(line: str) -> str:
    for marker, attr in _MARKERS:
        if marker in line:
            return attr
    return "entries"


def _parse_threshold_row(line: str, where: str) -> tuple[str, Threshold]:
    m = _ROW_RE.match(line)
    if m is None:
        raise UserError(
            f"{where}: expected 'name threshold min max' (a tpu-mlir cali_table row), got {line[:80]!r}; "
            "pass a tpu-mlir calibration table"
        )
    return m.group(1), Threshold(float(m.group(2)), float(m.group(3)), float(m.group(4)))


def _parse_weight_row(line: str, where: str) -> tuple[str, WeightScale]:
    parts = line.split()
    try:
        n = int(parts[1])
        scales = tuple(float(v) for v in parts[2 : 2 + n])
        rest = parts[2 + n :]
        m = int(rest[0]) if rest else 0
        zps = tuple(float(v) for v in rest[1 : 1 + m])
        if len(scales) != n or len(zps) != m or len(rest) not in (0, 1 + m):
            raise ValueError("count mismatch")
    except (IndexError, ValueError):
        raise UserError(
            f"{where}: bad #weight_scale row {line[:80]!r}; expected 'name n s1..sn [m zp1..zpm]'"
        ) from None
    return parts[0], WeightScale(scales, zps)


def parse_table(text: str, source: str = "<cali_table>") -> CalibrationTable:
    """Parse cali_table text; any line that is neither a comment nor a valid row is a UserError."""
    table = CalibrationTable(histogram_bins=None, mlir_version="", header_lines=[])
    block = "entries"
    in_header = True
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        where = f"{source}:{lineno}"
        if not line.strip():
            continue
        if line.startswith("#"):
            block = _block_of(line)
            if block == "entries" and "#tpu-mlir-fp8" in line:
                table.fp8 = True
            if in_header and block == "entries":
                table.header_lines.append(line)
                _read_header_field(table, line, where)
            elif block != "entries":
                in_header = False
                table.block_markers[block] = line
            continue
        in_header = False
        line = line.strip()
        if block in ("entries", "int4_entries", "fp8_entries"):
            name, entry = _parse_threshold_row(line, where)
            getattr(table, block)[name] = entry
        elif block == "weight_scales":
            name, scale = _parse_weight_row(line, where)
            table.weight_scales[name] = scale
        else:
            getattr(table, block).append(line.split()[0])
    if not table.entries and not table.header_lines:
        raise UserError(f"{source}: no calibration rows found; pass a tpu-mlir calibration table")
    return table


def _read_header_field(table: CalibrationTable, line: str, where: str) -> None:
    m = _HEADER_RE.match(line)
    spec = _FIELD_BY_KEY.get(m.group(1)) if m else None
    if spec is None:
        return
    attr, parse, _ = spec
    try:
        setattr(table, attr, parse(m.group(2)))
    except ValueError:
        raise UserError(
            f"{where}: header '{m.group(1)}' has a bad value {m.group(2)!r}; fix or remove the line"
        ) from None


def read_table(path: str | Path) -> CalibrationTable:
    """Read a cali_table file (UTF-8 text, at most 64 MiB)."""
    path = Path(path)
    return parse_table(read_text_file(path, "calibration table", MAX_TABLE_BYTES), str(path))


def table_from_rows(
    rows: Mapping[str, tuple[float, float, float]],
    method: str | None = None,
    sample_number: int | None = None,
    histogram_bins: int | None = 2048,
    tune_number: int | None = None,
    mlir_file: str = "",
) -> CalibrationTable:
    """A new table (standard header) from name -> (threshold, min, max), in the mapping's order."""
    entries = {name: Threshold(float(t), float(lo), float(hi)) for name, (t, lo, hi) in rows.items()}
    return CalibrationTable(
        entries=entries,
        histogram_bins=histogram_bins,
        sample_number=sample_number,
        tune_number=tune_number,
        method=method,
        mlir_file=mlir_file,
    )
