"""Matrix kernels on the TIU matrix unit: fully-connected layers (Gemm / MatMul with a constant right operand)
and MatMul of two activations (attention: batched, with numpy broadcasting of the batch dimensions, bf16).

Matrices use the local matrix layout: a row of `cols` values is split into groups of one EU width (16 int8
or 8 bf16 values), group g in lane g % lanes (specs/cv18xx.md §3.4 "matrix multiply"). int8 requantizes with
one 32-bit multiplier and a right shift and adds an int32 bias held as four byte planes; bf16 adds an fp32
bias held as a high-16 plane and a low-16 plane.
"""

from __future__ import annotations

import math

import numpy as np

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, does_not_fit, fused_relu, kernel, no_kernel, op_where, quant_of
from npuc.backends.cv18xx.kernels.elementwise import clamp
from npuc.backends.cv18xx.lmem import ESIZE, GTensor, LTensor, align
from npuc.backends.cv18xx.weights import bf16_bits, fp32_planes, int32_planes
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Op

MAX_K = 4095  # the opd1_n field


class MatrixLayout:
    def __init__(self, cg: Codegen, fmt: str, group: int | None = None) -> None:
        self.chip = cg.chip
        self.fmt = fmt
        self.group = group or cg.chip.eu_bytes // ESIZE[fmt]

    def groups(self, cols: int) -> int:
        return -(-cols // self.group)

    def lane_bytes(self, rows: int, cols: int) -> int:
        return align(rows * -(-self.groups(cols) // self.chip.lanes) * self.chip.eu_bytes)

    def tensors(self, addr: int, rows: int, cols: int) -> tuple[LTensor, LTensor]:
        """(TIU view with full groups, TDMA view with the real column count) of one local matrix."""
        c = self.groups(cols)
        e = ESIZE[self.fmt]
        n_str = self.chip.eu_bytes * -(-c // self.chip.lanes)
        full = LTensor(addr, (rows, c, 1, self.group), self.fmt, (n_str, self.chip.eu_bytes, self.group * e, e))
        w = min(cols, self.group)
        moved = LTensor(addr, (rows, c, 1, w), self.fmt, (n_str, self.chip.eu_bytes, w * e, e))
        return full, moved


def column_tile(layout: MatrixLayout, k: int, cols: int) -> int:
    """Right-matrix columns per tile: halved while its K rows take more than half a lane, but never below one
    column group in every lane (narrower tiles hold the same bytes per lane and cost one instruction each:
    O-Net's 1152x256 layer took 16 products of 16 columns instead of one)."""
    tile = cols
    while tile > layout.group and layout.lane_bytes(k, tile) > layout.chip.lmem_size // 2:
        narrower = max(layout.group, (tile // 2 + layout.group - 1) // layout.group * layout.group)
        if layout.lane_bytes(k, narrower) == layout.lane_bytes(k, tile):
            break
        tile = narrower
    return tile


def _operands(cg: Codegen, op: Op) -> tuple[np.ndarray, np.ndarray | None]:
    w = cg.const(op.inputs[1])
    if op.kind == "gemm":
        if op.attrs.trans_a:
            raise no_kernel(op, "Gemm with transA")
        if op.attrs.trans_b:
            w = w.T
    if w.ndim != 2:
        raise no_kernel(op, f"a {w.ndim}-D right operand (only 2-D weights)")
    bias = cg.const(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] else None
    return np.ascontiguousarray(w), bias


def _load_left(cg: Codegen, src: GTensor, rows: int, k: int, dst: LTensor) -> None:
    """Rows of K values into the left matrix: whole column groups in one move, a partial last group in a
    second move into its own lane (a move's destination is whole groups)."""
    e = dst.esz
    group = cg.chip.eu_bytes // e
    full = k // group * group
    n_str, c_str = dst.strides[:2]
    if full:
        moved = LTensor(dst.addr, (rows, full // group, 1, group), dst.fmt, (n_str, c_str, group * e, e))
        dma.load_matrix(cg.stream, src, rows, full, k * e, moved)
    if full < k:
        g = full // group
        lane, block = g % cg.chip.lanes, g // cg.chip.lanes
        addr = lane * cg.chip.lmem_size + dst.addr + block * c_str
        rest = LTensor(addr, (rows, 1, 1, k - full), dst.fmt, (n_str, c_str, (k - full) * e, e))
        dma.load_matrix(cg.stream, GTensor(src.region, src.offset + full * e, (1,) * 4, src.fmt), rows, k - full,
                        k * e, rest)  # fmt: skip


@kernel("gemm", "matmul")
def matrix_product(cg: Codegen, op: Op) -> None:
    if op.kind == "matmul" and cg.graph.const(op.inputs[1]) is None:
        activations_matmul(cg, op)
    else:
        fully_connected(cg, op)


def _zero(cg: Codegen, t: LTensor, layout: MatrixLayout) -> None:
    """Zero a local matrix (its padding columns or rows must add nothing: 0 * garbage may be NaN)."""
    n_str, c_str = t.strides[:2]
    width = layout.group * t.esz
    cg.stream.tiu(tiu.xor_zero(LTensor(t.addr, (t.shape[0], t.shape[1], 1, width), "i8", (n_str, c_str, width, 1))))


def activations_matmul(cg: Codegen, op: Op) -> None:
    """A[..., M, K] @ B[..., K, N], both read from gmem: per batch element (broadcast as numpy does), the left
    rows and the right columns are loaded as matrices, zero-padded to whole K groups, and multiplied."""
    if quant_of(op).mode != "bf16":
        raise no_kernel(op, "an int8 MatMul of two activations")
    a_shape, b_shape = (cg.graph.shape(n) for n in op.inputs[:2])
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise no_kernel(op, "a MatMul of a vector")
    (m, k), (k2, n) = a_shape[-2:], b_shape[-2:]
    if k != k2 or -(-k // 16) * 16 > MAX_K:
        raise UserError(f"op '{op.name}': K = {k} (right rows {k2}) is not a matrix one instruction takes")
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    layout = MatrixLayout(cg, "bf16")
    e = 2
    kp = -(-k // layout.group) * layout.group
    chip, s = cg.chip, cg.stream
    tile_cols = column_tile(layout, kp, n)
    per_row = layout.lane_bytes(1, kp) + layout.lane_bytes(1, tile_cols)
    tile_rows = min(m, MAX_K, (chip.lmem_size - layout.lane_bytes(kp, tile_cols)) // per_row)
    if tile_rows < 1:
        raise does_not_fit(op_where(op), f"a {k}x{tile_cols} right-matrix tile", chip)
    places = [cg.plan.places[name] for name in (*op.inputs[:2], op.outputs[0])]
    for index in np.ndindex(*batch):
        offsets = [_batch_offset(index, shape[:-2]) * math.prod(shape[-2:]) * e for shape in (a_shape, b_shape)]
        out_offset = _batch_offset(index, batch) * m * n * e
        for c0 in range(0, n, tile_cols):
            nc = min(n, c0 + tile_cols) - c0
            right, right_moved = layout.tensors(0, kp, nc)
            if kp > k:
                _zero(cg, right, layout)
            src = GTensor(places[1].region, places[1].offset + offsets[1] + c0 * e, (1,) * 4, "bf16")
            dma.load_matrix(s, src, k, nc, n * e, LTensor(right_moved.addr, (k, *right_moved.shape[1:]), "bf16",
                                                         right_moved.strides))  # fmt: skip
            top = layout.lane_bytes(kp, nc)
            for r0 in range(0, m, tile_rows):
                rows = min(m, r0 + tile_rows) - r0
                left, left_moved = layout.tensors(top, rows, kp)
                if kp > k:
                    _zero(cg, left, layout)
                a_src = GTensor(places[0].region, places[0].offset + offsets[0] + r0 * k * e, (1,) * 4, "bf16")
                _load_left(cg, a_src, rows, k, left_moved)
                out, out_moved = layout.tensors(top + layout.lane_bytes(rows, kp), rows, nc)
                s.tiu(tiu.matmul(out, left, right, None, kp, 0, 0, False))
                dst = GTensor(places[2].region, places[2].offset + out_offset + (r0 * n + c0) * e, (1,) * 4, "bf16")
                dma.store_matrix(s, out_moved, dst, rows, nc, n * e)


def _batch_offset(index: tuple[int, ...], dims: tuple[int, ...]) -> int:
    """The flat batch position of broadcast `index` in a tensor whose batch dims are `dims` (1s broadcast)."""
    index = index[len(index) - len(dims) :] if dims else ()
    flat = 0
    for i, d in zip(index, dims):
        flat = flat * d + (i if d > 1 else 0)
    return flat


def fully_connected(cg: Codegen, op: Op) -> None:
    q = quant_of(op)
    bf16 = q.mode == "bf16"
    fmt = "bf16" if bf16 else "i8"
    e = ESIZE[fmt]
    w, bias = _operands(cg, op)
    k, cols = w.shape
    in_shape = cg.graph.shape(op.inputs[0])
    rows = int(np.prod(in_shape[:-1])) if len(in_shape) > 1 else 1
    if in_shape[-1] != k:
        raise UserError(f"op '{op.name}': input {in_shape} does not end in the weight's {k} rows")
    if -(-k // 16) * 16 > MAX_K:
        raise UserError(f"op '{op.name}': K = {k} exceeds the {MAX_K} rows one matrix instruction takes")
    relu, _ = fused_relu(op)
    layout = MatrixLayout(cg, fmt)
    left_layout = layout
    # the TIU takes K as (left column groups) x (group width): pad K with zero weight rows; the left
    # matrix's padding columns are zeroed before each load so they add nothing
    kp = -(-k // layout.group) * layout.group
    if kp > k:
        w = np.concatenate([w, np.zeros((kp - k, cols), w.dtype)])
    stored = bf16_bits(w) if bf16 else np.asarray(w, np.int8)
    # compressed: one VLC buffer per column tile (raw where that is smaller), as tpu-mlir stores its FC weights
    weight = None if cg.compress_weights else cg.weights.add(f"{op.name}_filter", stored, fmt)
    planes = 2 if bf16 else 4
    gbias = None
    if bias is not None:
        data = fp32_planes(bias) if bf16 else int32_planes(np.asarray(bias, np.int64).astype(np.int32))
        gbias = cg.weights.add(f"{op.name}_bias", data, fmt)
    x = GTensor.contiguous(cg.plan.places[op.inputs[0]].region, cg.plan.places[op.inputs[0]].offset,
                           (1, 1, rows, k), fmt)  # fmt: skip
    yp = cg.plan.places[op.outputs[0]]
    chip, s = cg.chip, cg.stream
    tile_cols = column_tile(layout, kp, cols)  # then as many rows as fit
    fixed = layout.lane_bytes(kp, tile_cols) + (layout.lane_bytes(planes, tile_cols) if gbias is not None else 0)
    per_row = left_layout.lane_bytes(1, k) + layout.lane_bytes(1, tile_cols)
    tile_rows = min(rows, MAX_K, (chip.lmem_size - fixed) // per_row)
    if tile_rows < 1:
        raise does_not_fit(op_where(op), f"a {k}x{tile_cols} weight tile", chip)
    for c0 in range(0, cols, tile_cols):
        c1 = min(cols, c0 + tile_cols)
        nc = c1 - c0
        top = 0
        right, right_moved = layout.tensors(top, kp, nc)
        top += layout.lane_bytes(kp, nc)
        if weight is None:
            part = np.ascontiguousarray(stored[:, c0:c1]).reshape(1, 1, kp, nc)
            dma.load_matrix(s, cg.weights.add_compressed(f"{op.name}_filter@{c0}", part, fmt), kp, nc, nc * e,
                            right_moved)  # fmt: skip
        else:
            dma.load_matrix(s, GTensor(weight.region, weight.offset + c0 * e, (1,) * 4, fmt), kp, nc, cols * e,
                            right_moved)  # fmt: skip
        lbias = None
        if gbias is not None:
            lbias, bias_moved = layout.tensors(top, planes, nc)
            top += layout.lane_bytes(planes, nc)
            dma.load_matrix(s, GTensor(gbias.region, gbias.offset + c0 * e, (1,) * 4, fmt), planes, nc,
                            cols * e, bias_moved)  # fmt: skip
        for r0 in range(0, rows, tile_rows):
            r1 = min(rows, r0 + tile_rows)
            m = r1 - r0
            left, left_moved = left_layout.tensors(top, m, kp)
            out_addr = top + left_layout.lane_bytes(m, kp)
            if kp > k:
                n_str, c_str = left.strides[:2]
                as_bytes = (m, left.shape[1], 1, layout.group * e)
                s.tiu(tiu.xor_zero(LTensor(left.addr, as_bytes, "i8", (n_str, c_str, layout.group * e, 1))))
            out, out_moved = layout.tensors(out_addr, m, nc)
            _load_left(cg, GTensor(x.region, x.offset + r0 * k * e, (1,) * 4, fmt), m, k, left_moved)
            mult = int(np.asarray(q.multiplier).ravel()[0]) if not bf16 else 0
            rshift = int(np.asarray(q.rshift).ravel()[0]) if not bf16 else 0
            s.tiu(tiu.matmul(out, left, right, lbias, kp, mult, rshift, relu))
            clamp(cg, op, out)
            dst = GTensor(yp.region, yp.offset + (r0 * cols + c0) * e, (1,) * 4, fmt)
            dma.store_matrix(s, out_moved, dst, m, nc, cols * e)
