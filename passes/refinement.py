"""The refinement side file: refined conv / FC constants that travel next to a calibration table.

`npuc calibrate MODEL DATA --refine weights -o model.cali` would write `model.cali` (thresholds, unchanged
format) and `model.cali.refine.npz` (this module); `npuc build --calib model.cali` applies the side file when
it exists (or when named with `--refine FILE`) to the canonicalized graph before `passes.quantize`, so the
artifact keeps the cv18xx int8 format and only its weight and bias values differ.

The file is an .npz (stored, fixed timestamps: same refinement, same bytes) keyed by IR tensor name — the
canonicalized graph's constant names, which canonicalization derives deterministically from the ONNX model —
plus `__format__` (version) and `__shapes__` checks. Reading validates everything: a file from another
model, a damaged archive or a shape mismatch is a UserError naming the file and tensor.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_bytes
from npuc.compiler.ir import Graph
from npuc.passes.calitable import CalibrationTable
from npuc.passes.quantize import thresholds_for_graph
from npuc.passes.refine import DEFAULT_RIDGE, RefineResult, apply_constants, out_channels, refine_weights

FORMAT = 1
SUFFIX = ".refine.npz"
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
    """Refine the canonicalized `graph` for `table` on calibration `feeds` (see passes/refine.py);
    `table_names` as for `thresholds_for_graph` (the source model's `tensor_table_names`)."""
    thresholds = thresholds_for_graph(graph, table, warn=False, table_names=table_names).thresholds
    return refine_weights(graph, thresholds, feeds, method, ridge)


def encode_refinement(constants: Mapping[str, np.ndarray]) -> bytes:
    """The side file's bytes: one float32 .npy member per constant, sorted by name, plus the format."""
    buffer = io.BytesIO()
    members = {"__format__": np.array(FORMAT, np.int64)}
    members.update({name: np.ascontiguousarray(constants[name], np.float32) for name in sorted(constants)})
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, value in members.items():
            data = io.BytesIO()
            np.lib.format.write_array(data, value, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data.getvalue())
    return buffer.getvalue()


def save_refinement(path: str | Path, constants: Mapping[str, np.ndarray]) -> None:
    """Write the side file atomically."""
    atomic_write_bytes(Path(path), encode_refinement(constants))


def load_refinement(path: str | Path) -> dict[str, np.ndarray]:
    """Read and validate a side file: IR constant name -> float32 array."""
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
    if version is None or version.shape != () or int(version) != FORMAT:
        raise UserError(f"{path}: refinement format {version!r} is not {FORMAT}; run npuc calibrate --refine again")
    for name, value in arrays.items():
        if value.dtype != np.float32 or not np.isfinite(value).all():
            raise UserError(f"{path}: tensor {name!r} is not finite float32; run npuc calibrate --refine again")
    return arrays


def apply_refinement(graph: Graph, constants: Mapping[str, np.ndarray], where: str = "refinement") -> Graph:
    """A copy of the canonicalized `graph` with the refined constants; each must replace a constant of the same
    shape or be a new `<op>_refined_bias` of an existing op (else a UserError: the file is for another model)."""
    ops = {op.name: op for op in graph.ops}
    for name, value in constants.items():
        tensor = graph.tensors.get(name)
        if tensor is not None:
            if not tensor.is_const or tuple(tensor.shape) != tuple(value.shape):
                raise UserError(
                    f"{where}: tensor {name!r} {tuple(value.shape)} does not match the model's "
                    f"{tuple(tensor.shape)}; the file was made for another model, refine again"
                )
            continue
        op = ops.get(name.removesuffix("_refined_bias")) if name.endswith("_refined_bias") else None
        weight = graph.const(op.inputs[1]) if op is not None and len(op.inputs) > 1 else None
        if weight is None or value.ndim != 1 or value.size != out_channels(op, weight):
            raise UserError(f"{where}: the model has no tensor {name!r}; the file was made for another model")
    return apply_constants(graph, constants)
