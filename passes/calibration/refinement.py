"""The refinement side file: refined conv / FC constants that travel next to a calibration table.

`npuc calibrate MODEL DATA --refine weights -o model.cali` would write `model.cali` (thresholds, unchanged
format) and `model.cali.refine.npz` (this module); `npuc build --calib model.cali` applies the side file when
it exists (or when named with `--refine FILE`) to the canonicalized graph before `passes.quantization.quantize`, so the
artifact keeps the cv18xx int8 format and only its weight and bias values differ.

The file is an .npz (stored, fixed timestamps: same refinement, same bytes) keyed by IR tensor name — the
canonicalized graph's constant names, which canonicalization derives deterministically from the ONNX model —
plus `__format__` (version). A channel split (`npuc calibrate --split-channels K`, passes/calibration/channel_split.py)
adds one `__groups__.<conv>` member per split run: each channel's group number. The build replays the split
first, then sets the constants (named in the split graph). Reading validates everything: a file from another
model, a damaged archive or a shape mismatch is a UserError naming the file and tensor.
"""

from __future__ import annotations

import copy
import io
import zipfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_bytes
from npuc.compiler.ir import Graph
from npuc.passes.calibration.calitable import CalibrationTable, Threshold
from npuc.passes.calibration.channel_split import apply_groupings, channel_peaks, plan_groupings, split_thresholds
from npuc.passes.calibration.refine import DEFAULT_RIDGE, RefineResult, apply_constants, out_channels, refine_weights
from npuc.passes.quantization.quantize import thresholds_for_graph

FORMAT = 2  # 1: constants only; 2: + channel-split groups (1 still reads)
SUFFIX = ".refine.npz"
GROUPS = "__groups__."  # member prefix of a split run's channel -> group numbers
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
MAX_MEMBERS = 100_000
MAX_MEMBER_BYTES = 1 << 31


def side_file(table_path: str | Path) -> Path:
    """Where the refinement of a table lives: `<table>.refine.npz`."""
    return Path(str(table_path) + SUFFIX)


def refine_for_table(
    graph: Graph,
    table: CalibrationTable,
    feeds: Sequence[Mapping[str, np.ndarray]],
    method: str = "weights",
    table_names: Mapping[str, str] | None = None,
    ridge: float = DEFAULT_RIDGE,
) -> RefineResult:
    """Refine the canonicalized `graph` for `table` on calibration `feeds` (see passes/calibration/refine.py);
    `table_names` as for `thresholds_for_graph` (the source model's `tensor_table_names`)."""
    thresholds = thresholds_for_graph(graph, table, warn=False, table_names=table_names).thresholds
    return refine_weights(graph, thresholds, feeds, method, ridge)


@dataclass
class Refinement:
    """What a side file carries: the channel split to replay (run start conv -> channel indices per group),
    then refined constants by IR name (of the split graph when there is a split)."""

    constants: dict[str, np.ndarray] = field(default_factory=dict)
    groupings: dict[str, list[np.ndarray]] = field(default_factory=dict)


def _group_numbers(idx: list[np.ndarray]) -> np.ndarray:
    numbers = np.zeros(sum(len(i) for i in idx), np.int64)
    for g, channels in enumerate(idx):
        numbers[channels] = g
    return numbers


def split_for_table(
    graph: Graph,
    table: CalibrationTable,
    table_names: Mapping[str, str],
    feeds: Sequence[Mapping[str, np.ndarray]],
    k: int,
) -> tuple[Graph, CalibrationTable, dict[str, str], dict[str, list[np.ndarray]]]:
    """Split the canonicalized `graph`'s per-channel runs into up to `k` channel groups
    (passes/calibration/channel_split.py) from channel peaks over `feeds`: (split graph, the table with the split
    tensors' rows in place of the tensors they replace, IR tensor -> table row for the split graph, the groupings the
    side file records)."""
    thresholds = thresholds_for_graph(graph, table, warn=False, table_names=table_names).thresholds
    split = apply_groupings(graph, plan_groupings(graph, channel_peaks(graph, feeds), k))
    made, absmax = split_thresholds(graph, split, thresholds, feeds)
    gone = {table_names.get(t, t) for t in graph.tensors if t not in split.graph.tensors}
    entries = {row: e for row, e in table.entries.items() if row not in gone}
    entries.update({n: Threshold(float(np.float32(th)), -absmax[n], absmax[n]) for n, th in sorted(made.items())})
    names = {t: r for t, r in table_names.items() if t in split.graph.tensors}
    names.update({n: n for n in made})
    result = copy.copy(table)
    result.entries = entries
    return split.graph, result, names, split.groupings


def encode_refinement(refinement: Refinement) -> bytes:
    """The side file's bytes: one .npy member per constant (float32) and per split run (int64 group numbers),
    sorted by name, plus the format."""
    buffer = io.BytesIO()
    members = {"__format__": np.array(FORMAT, np.int64)}
    consts = refinement.constants
    members.update({name: np.ascontiguousarray(consts[name], np.float32) for name in sorted(consts)})
    groups = refinement.groupings
    members.update({GROUPS + name: _group_numbers(groups[name]) for name in sorted(groups)})
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, value in members.items():
            data = io.BytesIO()
            np.lib.format.write_array(data, value, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data.getvalue())
    return buffer.getvalue()


def save_refinement(path: str | Path, refinement: Refinement) -> None:
    """Write the side file atomically."""
    atomic_write_bytes(Path(path), encode_refinement(refinement))


def load_refinement(path: str | Path) -> Refinement:
    """Read and validate a side file."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS or any(i.file_size > MAX_MEMBER_BYTES for i in infos):
                raise UserError(f"{path}: too many or too large members for a refinement file; refine again")
            arrays = {}
            for info in infos:
                if not info.filename.endswith(".npy"):
                    raise UserError(f"{path}: unexpected member {info.filename!r}; refine the model again")
                with zf.open(info) as member:
                    arrays[info.filename[:-4]] = np.lib.format.read_array(member, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"refinement file not found: {path}; check the path or run npuc calibrate --refine") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise UserError(f"{path}: not a readable refinement file ({exc}); run npuc calibrate --refine again") from None
    version = arrays.pop("__format__", None)
    if version is None or version.shape != () or int(version) not in (1, FORMAT):
        raise UserError(f"{path}: refinement format {version!r} is not {FORMAT}; run npuc calibrate --refine again")
    result = Refinement()
    for name, value in arrays.items():
        if name.startswith(GROUPS):
            k = int(value.max()) + 1 if value.size else 0
            bad = value.dtype != np.int64 or value.ndim != 1 or value.size == 0 or value.min() < 0
            if bad or np.bincount(value).min() == 0:
                raise UserError(f"{path}: split groups {name!r} are not channel group numbers; calibrate again")
            result.groupings[name.removeprefix(GROUPS)] = [np.flatnonzero(value == g) for g in range(k)]
        elif value.dtype != np.float32 or not np.isfinite(value).all():
            raise UserError(f"{path}: tensor {name!r} is not finite float32; run npuc calibrate --refine again")
        else:
            result.constants[name] = value
    return result


def apply_refinement(graph: Graph, refinement: Refinement, where: str = "refinement",
                     float_layers: Collection[str] = ()) -> Graph:  # fmt: skip
    """A copy of the canonicalized `graph`, split as recorded, with the refined constants (`refit_constants`)."""
    return refit_constants(split_as_recorded(graph, refinement, where), refinement, where, float_layers)


def split_as_recorded(graph: Graph, refinement: Refinement, where: str = "refinement") -> Graph:
    """The canonicalized `graph` split into the recorded channel groups (itself when there are none); the
    split is exact in float, so its constants are still the model's."""
    return apply_groupings(graph, refinement.groupings, where).graph if refinement.groupings else graph


def refit_constants(split: Graph, refinement: Refinement, where: str = "refinement",
                    float_layers: Collection[str] = ()) -> Graph:  # fmt: skip
    """A copy of the `split` graph with the refined constants; each must replace a constant of the same shape
    or be a new `<op>_refined_bias` of an existing op (else a UserError: the file is for another model).

    Ops in `float_layers` (op or output names, as `quantize` reads them) keep the model's constants: a refit
    corrects the int8 rounding of its layer and the layers before it, which a layer in bf16 does not have, so
    applied there it moves the float result away from the model (PP-LCNet's refit graph all in float: output
    cosine 0.993, the model's constants there: 0.9999)."""
    constants = refinement.constants
    ops = {op.name: op for op in split.ops}
    for name, value in constants.items():
        tensor = split.tensors.get(name)
        if tensor is not None:
            if not tensor.is_const or tuple(tensor.shape) != tuple(value.shape):
                raise UserError(
                    f"{where}: tensor {name!r} {tuple(value.shape)} does not match the model's "
                    f"{tuple(tensor.shape)}; the file was made for another model, refine again"
                )
            continue
        op = ops.get(name.removesuffix("_refined_bias")) if name.endswith("_refined_bias") else None
        weight = split.const(op.inputs[1]) if op is not None and len(op.inputs) > 1 else None
        if weight is None or value.ndim != 1 or value.size != out_channels(op, weight):
            raise UserError(f"{where}: the model has no tensor {name!r}; the file was made for another model")
    kept = set(float_layers)
    if kept:
        floated = {op.name for op in split.ops if kept & {op.name, *op.outputs}}
        users: dict[str, set[str]] = {}
        for op in split.ops:
            for name in op.inputs:
                users.setdefault(name, set()).add(op.name)
        constants = {name: value for name, value in constants.items()
                     if not (users.get(name) or {name.removesuffix("_refined_bias")}) <= floated}  # fmt: skip
    return apply_constants(split, constants)
