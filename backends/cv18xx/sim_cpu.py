"""The CV18xx runtime's built-in CPU functions, as the simulator runs them between TPU routines.

Each function takes the routine's decoded arguments and its input tensors (numpy arrays in their stored
dtype and shape) and returns one array per output tensor, in the output's dtype. The semantics follow the
vendor runtime's functions as they behave on its simulator (checked bit for bit by tests/vendor); a mode or
argument a function does not model raises, naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from npuc.backends.cv18xx.sim_libm import expf
from npuc.compiler.errors import CorruptFileError, UnsupportedError, UserError

Out = tuple[np.dtype, tuple[int, ...]]  # the dtype and shape of one output tensor
CpuFunction = Callable[[dict[str, Any], Sequence[np.ndarray], Sequence[Out]], list[np.ndarray]]


def cpu_quant(args: dict[str, Any], inputs: Sequence[np.ndarray], outs: Sequence[Out]) -> list[np.ndarray]:
    """`quant`: float -> int8 as round-half-away-from-zero(x * scale), saturated."""
    if (args.get("from"), args.get("to")) != ("FP32", "INT8"):
        raise UnsupportedError(f"CPU quant from {args.get('from')} to {args.get('to')} is not simulated")
    scale = args.get("scale")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not np.isfinite(scale):
        raise CorruptFileError(f"CPU quant: argument 'scale' is {scale!r}, not a finite number")
    x = inputs[0].astype(np.float32) * np.float32(scale)
    rounded = np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))
    return [np.clip(rounded, -128, 127).astype(outs[0][0]).reshape(outs[0][1])]


def cpu_softmax(args: dict[str, Any], inputs: Sequence[np.ndarray], outs: Sequence[Out]) -> list[np.ndarray]:
    """`softmax` over `axis` in fp32: exp(x - m) / sum, rounded the way the vendor runtime rounds.

    The runtime seeds the running maximum of every outer row with the tensor's *first* row, so m is
    max(row, first row) rather than max(row); the quotient is the same number, but rounded differently where
    the first row holds the larger value. The sum accumulates in fp32 in axis order."""
    x = inputs[0].astype(np.float32)
    axis = int(args.get("axis", 1))
    if not 0 <= axis < x.ndim:
        raise CorruptFileError(f"CPU softmax axis {axis} is outside the {x.ndim}-D input")
    rows = x.reshape(math.prod(x.shape[:axis]), x.shape[axis], -1)
    m = np.maximum(rows[0, 0], rows.max(axis=1))[:, None, :]
    e = expf(rows - m)  # the C library's expf, bit for bit (sim_libm.py)
    total = np.cumsum(e, axis=1, dtype=np.float32)[:, -1:, :]
    return [(e / total).reshape(outs[0][1]).astype(outs[0][0])]


NEAREST_MODES = ("nearest", "nearest_half_pixel")


def _nearest_index(out_size: int, in_size: int, half_pixel: bool) -> np.ndarray:
    """Source row/column of each output one: int(i * (in/out)) in fp32, or ceil((i + 0.5) * scale - 1)."""
    scale = np.float32(in_size) / np.float32(out_size)
    i = np.arange(out_size)
    if half_pixel:
        index = np.ceil((i + 0.5) * np.float64(scale) - 1.0).astype(np.int64)
    else:
        index = (i.astype(np.float32) * scale).astype(np.int64)
    return np.clip(index, 0, in_size - 1)


def cpu_interp(args: dict[str, Any], inputs: Sequence[np.ndarray], outs: Sequence[Out]) -> list[np.ndarray]:
    """`interp` in its nearest modes: a copy of the stored values (int8, bf16 or fp32; no requantization)."""
    mode = str(args.get("coordinate_transformation_mode", ""))
    if mode not in NEAREST_MODES:
        raise UnsupportedError(f"CPU interp with coordinate_transformation_mode {mode!r} is not simulated yet")
    x = inputs[0]
    if x.ndim != 4:
        raise CorruptFileError(f"CPU interp input has shape {x.shape}; it takes n, c, h, w")
    dtype, shape = outs[0]
    oh, ow = (int(args["height"]), int(args["width"])) if args.get("height") and args.get("width") else shape[2:4]
    if (x.shape[0], x.shape[1], oh, ow) != tuple(shape):
        raise CorruptFileError(f"CPU interp: {x.shape} resized to {oh}x{ow} does not fill the output {shape}")
    half = mode == "nearest_half_pixel"
    rows, cols = _nearest_index(oh, x.shape[2], half), _nearest_index(ow, x.shape[3], half)
    return [x[:, :, rows][:, :, :, cols].astype(dtype)]


ARGMAX_TILE = 256  # the TPU part reduces each run of 256 elements to its maximum


def cpu_argmax_v3(args: dict[str, Any], inputs: Sequence[np.ndarray], outs: Sequence[Out]) -> list[np.ndarray]:
    """`argmax_v3`: inputs (data, per-tile maxima from the TPU), outputs (indices[, values]).

    The tile with the largest maximum wins (the first on ties); the index is the first element of that tile
    equal to its maximum (0 if none is), plus the tile's offset; the value is the int8 maximum times `scale`
    (a bf16 maximum as its float)."""
    data, maxima = inputs[0], inputs[1]
    axis = int(args.get("axis", -1))
    if not 0 <= axis < data.ndim or data.dtype not in (np.int8, np.uint16):
        raise UnsupportedError(f"CPU argmax_v3 over axis {axis} of {data.dtype} data is not simulated")
    outer, inner = math.prod(data.shape[:axis]), data.shape[axis]
    if math.prod(data.shape[axis + 1 :]) != 1:
        raise UnsupportedError("CPU argmax_v3 over an axis that is not the innermost is not simulated")
    tiles = -(-inner // ARGMAX_TILE)
    flat_max = maxima.reshape(-1)
    if flat_max.size < outer * tiles:
        raise CorruptFileError(f"CPU argmax_v3: {flat_max.size} tile maxima for {outer} rows of {tiles} tiles")
    signed = (lambda v: v.astype(np.int64)) if data.dtype == np.int8 else _bf16_order
    tile_max = signed(flat_max[: outer * tiles].reshape(outer, tiles))
    best = np.argmax(tile_max, axis=1)  # first tile on ties, as the runtime's strict '>' scan
    best_value = tile_max[np.arange(outer), best]
    padded = np.full((outer, tiles * ARGMAX_TILE), np.iinfo(np.int64).min, np.int64)
    padded[:, :inner] = signed(data.reshape(outer, inner))
    in_tile = padded.reshape(outer, tiles, ARGMAX_TILE)[np.arange(outer), best]
    hit = in_tile == best_value[:, None]
    index = np.where(hit.any(axis=1), hit.argmax(axis=1), 0) + best * ARGMAX_TILE
    results = [index.astype(np.float32).astype(outs[0][0]).reshape(outs[0][1])]
    if len(outs) > 1:
        raw = flat_max[: outer * tiles].reshape(outer, tiles)[np.arange(outer), best]
        if data.dtype == np.int8:
            values = raw.astype(np.int64).astype(np.float32) * np.float32(args.get("scale", 1.0))
        else:
            values = (raw.astype(np.uint32) << 16).view(np.float32)
        results.append(values.astype(outs[1][0]).reshape(outs[1][1]))
    return results


def _bf16_order(bits: np.ndarray) -> np.ndarray:
    """bf16 bits as the runtime compares them: as signed 16-bit integers."""
    return bits.astype(np.uint16).view(np.int16).astype(np.int64)


INDEX_DTYPES = (np.int16, np.uint16, np.int32, np.uint32)


def cpu_embedding(args: dict[str, Any], inputs: Sequence[np.ndarray], outs: Sequence[Out]) -> list[np.ndarray]:
    """`embedding`: inputs (indices, table); each index copies one table row (dim 1 of the table's shape long)
    into the output, in order. The runtime does not check the indices: one outside the table is an error here."""
    if len(inputs) != 2:
        raise CorruptFileError(f"CPU embedding takes indices and a table, got {len(inputs)} inputs")
    indices, table = inputs
    if indices.dtype not in INDEX_DTYPES:
        raise UnsupportedError(f"CPU embedding with {indices.dtype} indices is not simulated (16/32-bit integers)")
    if table.dtype != outs[0][0] or table.ndim < 2 or table.shape[1] == 0:
        raise CorruptFileError(f"CPU embedding: a {table.dtype} table of shape {table.shape} for a {outs[0][0]} output")
    rows = table.reshape(-1, table.shape[1])
    flat = indices.reshape(-1).astype(np.int64)
    bad = (flat < 0) | (flat >= rows.shape[0])
    if bad.any():
        raise UserError(f"CPU embedding: index {flat[bad][0]} is outside the table's {rows.shape[0]} rows")
    if flat.size * rows.shape[1] != math.prod(outs[0][1]):
        raise CorruptFileError(f"CPU embedding: {flat.size} rows of {rows.shape[1]} do not fill output {outs[0][1]}")
    return [rows[flat].reshape(outs[0][1])]


CPU_FUNCTIONS: dict[str, CpuFunction] = {
    "embedding": cpu_embedding,
    "quant": cpu_quant,
    "softmax": cpu_softmax,
    "interp": cpu_interp,
    "argmax_v3": cpu_argmax_v3,
}
