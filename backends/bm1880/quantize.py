"""Lower the canonicalized float IR + calibration thresholds to BM1880 int8 layers (BMNet per-layer shift).

Every activation is int8 with one symmetric threshold T (`q = round(x·128/T)`, specs/bm1880.md §3.2). Each
IR op becomes one or more `Layer` records with the integer parameters the kernels need:
conv/FC: int8 weight [oc][ic][kh][kw], int16 bias, one right shift (`numformats.bm1880_int8.bm1880_quantize_layer`), and
with weight_scale=channel per-channel gains (lower_gains.py; the default for a cali_table, `choose_weight_scale`);
pooling and concat: an 8-bit requant multiplier and shift; eltwise: one multiplier per input and a common
shift; ReLU/LeakyReLU/PReLU: gt/le scales and shifts. Reshape/flatten become aliases of their input's bytes.
A linear layer on a (B, L, K) sequence is one FC over the B·L rows (a view of the same bytes); a transposed conv
whose kernel equals its stride is a 1x1 conv per phase and an interleave; both fold the bias Add after them.
Trailing layout transposes and softmax (what BMNet leaves to the host) are dropped from the outputs.
Slice/split, nearest upsample, lookup activations and products are lowered in lower_moves.py; the
records themselves live in layers.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from npuc.compiler import ops
from npuc.compiler.coverage import per_op, stop_if_gaps
from npuc.compiler.errors import UnsupportedError, UserError
from npuc.compiler.ir import Graph, Op
from npuc.compiler.numformats.bm1880_int8 import (
    bm1880_eltwise_multipliers,
    bm1880_quantize_layer,
    bm1880_requant_multiplier,
    bm1880_scale_shift,
)
from npuc.compiler.numformats.rounding import round_half_up, saturate
from npuc.passes.rewrite.rewrites import sole_user

from .layers import Layer, LowerContext, LoweredNet, as_4d, unsupported
from .lower_gains import GainQuant, apply_gains
from .lower_moves import lower_lut, lower_mul, lower_resize, lower_slice, lower_split, lower_transpose

HOST_TAIL_KINDS = ("transpose", "softmax")
HOST_TAIL_ACTIVATIONS = ("elu",)  # BMNet runs these as CPU ("customized") layers after the NPU


def runs_on_host(op: Op) -> bool:
    """An output op BMNet leaves to the host: transposes, softmax and its CPU activation layers."""
    if op.kind == "activation":
        return op.attrs.act.kind in HOST_TAIL_ACTIVATIONS
    return op.kind in HOST_TAIL_KINDS


MAX_PAD = 15  # 4-bit pad and stride fields of the BD (specs/bm1880.md §2.5)


# ---------------------------------------------------------------------------------------------------------
# thresholds


_SUFFIX = re.compile(r"_\d+$")


def threshold_for(name: str, table: dict[str, float], table_names: dict[str, str] | None) -> float | None:
    """A tensor's threshold: its own row, its tpu-mlir row name, or (BMNet/Caffe tables) the name without
    the `_<n>` suffix ONNX exporters append to Caffe blob names."""
    for key in (name, (table_names or {}).get(name), _SUFFIX.sub("", name)):
        if key and key in table and table[key] > 0:
            return float(np.float32(table[key]))
    return None


_BMNET_TEXT = re.compile(r"^\s*layer\s*\{", re.M)  # a text BMNet table


def _bmnet_encoding(path: Path) -> str | None:
    """A BMNet calibration table's encoding, "text" (a prototxt of `layer {` blocks) or "binary" (.pb2), read from
    the file's head; None for tpu-mlir's cali_table (what `npuc calibrate` writes)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"calibration table not found: {path}; check the --calib path")
    text = path.read_bytes()[:4096].decode("utf-8", "replace")
    if _BMNET_TEXT.search(text):
        return "text"
    return "binary" if path.suffix.lower() == ".pb2" or "\0" in text else None


def table_kind(path: Path) -> str:
    """The table's kind: "bmnet" (a BMNet calibration table) or "cali_table" (tpu-mlir's)."""
    return "cali_table" if _bmnet_encoding(path) is None else "bmnet"


def load_thresholds(path: Path) -> dict[str, float]:
    """Thresholds by name from a tpu-mlir cali_table or a BMNet calibration table (.pb2 or text)."""
    from npuc.passes.calibration.calitable import read_table

    from .calibration import blob_thresholds, load_calibration

    encoding = _bmnet_encoding(path)
    if encoding is None:
        return read_table(Path(path)).thresholds()
    msg = load_calibration(Path(path), encoding)
    table = {layer.name: float(layer.threshold_y[0]) for layer in msg.layer if layer.threshold_y}
    table.update(blob_thresholds(msg))
    return table


# ---------------------------------------------------------------------------------------------------------
# weight scale


# --option weight_scale: "layer" is BMNet's one shift per layer (the vendor's weights, byte for byte); "channel"
# adds per-channel power-of-two gains (lower_gains.py). The table's kind picks the default: a BMNet table builds
# what BMNet builds, npuc's own cali_table gets the gains (PP-LCNet logit cosine 0.698 -> 0.976).
WEIGHT_RULES = MappingProxyType({"layer": "BMNet's per-layer shift", "channel": "per-channel power-of-two gains"})
DEFAULT_WEIGHT_SCALE = MappingProxyType({"bmnet": "layer", "cali_table": "channel"})
TABLE_KIND_NAMES = MappingProxyType({"bmnet": "a BMNet calibration table", "cali_table": "a tpu-mlir cali_table"})


def check_weight_scale(value: str) -> str:
    if value not in WEIGHT_RULES:
        raise UserError(f"--option weight_scale={value!r} is not one of {', '.join(WEIGHT_RULES)}")
    return value


def choose_weight_scale(options: Mapping[str, Any], kind: str) -> tuple[str, str | None]:
    """(weight scale, the note saying why): --option weight_scale when given (no note), else the default of
    the table's kind."""
    if "weight_scale" in options:
        return check_weight_scale(str(options["weight_scale"])), None
    scale = DEFAULT_WEIGHT_SCALE[kind]
    other = next(s for s in WEIGHT_RULES if s != scale)
    note = (f"weights: {WEIGHT_RULES[scale]}, the default with {TABLE_KIND_NAMES[kind]} "
            f"(--option weight_scale={other}: {WEIGHT_RULES[other]})")  # fmt: skip
    return scale, note


# ---------------------------------------------------------------------------------------------------------
# graph preparation


def strip_host_tail(graph: Graph) -> list[str]:
    """Drop output transposes, softmax and CPU activations (run on the host, as BMNet does); returns the
    dropped op names."""
    dropped: list[str] = []
    changed = True
    while changed:
        changed = False
        producers, consumers = graph.producers(), graph.consumers()
        for out in list(graph.outputs):
            op = producers.get(out)
            if op is None or not runs_on_host(op) or consumers.get(out):
                continue
            src = op.inputs[0]
            graph.outputs = [src if o == out else o for o in graph.outputs]
            graph.remove_op(op)
            dropped.append(f"{op.name} ({op.kind})")
            changed = True
    graph.outputs = list(dict.fromkeys(graph.outputs))
    return dropped


def _check_window(op: Op, kernel, strides, pads) -> None:
    if max(*strides, *pads) > MAX_PAD:
        raise unsupported(op, f"with stride {strides} / pads {pads} above {MAX_PAD}")


def _split_act(ctx: LowerContext, op: Op, act: ops.Activation | None) -> tuple[str, bool]:
    """(tensor the main layer writes, fused relu): leaky ReLU becomes a following act layer, any other
    activation a following lookup. The pre-activation tensor takes the output's threshold (exact for clip)."""
    out = op.outputs[0]
    if act is None or act.kind == "relu":
        return out, act is not None
    return ctx.add_tensor(f"{out}#pre", ctx.net.shapes[out], ctx.t(out)), False


def _finish_act(ctx: LowerContext, op: Op, act: ops.Activation | None, pre: str) -> None:
    if act is not None and act.kind == "leaky_relu":
        _add_relu_like(ctx, f"{op.name}#leaky", "leaky", pre, op.outputs[0], slope=float(act.alpha))
    elif act is not None and act.kind != "relu":
        lower_lut(ctx, Op(f"{op.name}#{act.kind}", "activation", [pre], [op.outputs[0]], ops.ActivationOp(act)))


def _conv_layer(ctx: LowerContext, op: Op, src: str, weight: np.ndarray, bias, kernel, strides, pads, dil, act):
    out, relu = _split_act(ctx, op, act)
    q = _quantize_weights(ctx, weight, bias, src, op.outputs[0])
    ctx.add(Layer(op.name, "conv", (src,), out, "", kernel, strides, pads, dil, q.weight, q.bias, q.rshift, relu,
                  gains=q.gains, gain_shift=q.gain_shift))  # fmt: skip
    _finish_act(ctx, op, act, out)


def _quantize_weights(ctx: LowerContext, weight, bias, src: str, out: str) -> GainQuant:
    """BMNet's per-layer rule (no gains), or the per-channel gains (lower_gains.py)."""
    if ctx.channel_gains:
        return apply_gains(weight, bias, ctx.t(src), ctx.t(out))
    q = bm1880_quantize_layer(weight, bias, ctx.t(src), ctx.t(out))
    return GainQuant(q.weight, q.bias, q.rshift, None)


def _lower_conv(ctx: LowerContext, op: Op) -> None:
    a: ops.Conv2d = op.attrs
    w, b = ctx.const(op, 1), ctx.const(op, 2)
    src = op.inputs[0]
    oc, icg, kh, kw = w.shape
    pads = (a.pads[0], a.pads[2], a.pads[1], a.pads[3])
    _check_window(op, (kh, kw), a.strides, pads)
    cin = ctx.net.shapes[src][1]
    if a.group > 1 and a.group == cin == oc and icg == 1:
        out, relu = _split_act(ctx, op, a.act)
        q = _quantize_weights(ctx, w, b, src, op.outputs[0])
        ctx.add(Layer(op.name, "dwconv", (src,), out, "", (kh, kw), a.strides, pads, a.dilations,
                      q.weight.reshape(oc, kh, kw), q.bias, q.rshift, relu, gains=q.gains,
                      gain_shift=q.gain_shift))  # fmt: skip
        _finish_act(ctx, op, a.act, out)
        return
    if a.group > 1:  # general grouped conv: a dense conv with a block-diagonal kernel
        dense = np.zeros((oc, cin, kh, kw), np.float32)
        per = oc // a.group
        for g in range(a.group):  # loop over groups only
            dense[g * per : (g + 1) * per, g * icg : (g + 1) * icg] = w[g * per : (g + 1) * per]
        w = dense
    _conv_layer(ctx, op, src, w, b, (kh, kw), a.strides, pads, a.dilations, a.act)


def _fc_input(ctx: LowerContext, name: str, k: int) -> tuple[str, tuple[int, int]]:
    """The 4-D tensor an FC reads and its kernel: a flattened NCHW map is read directly as an HxW conv."""
    producer = ctx.producers.get(name)
    if producer is not None and producer.kind == "reshape":
        src = producer.inputs[0]
        n, c, h, w = ctx.net.shapes[src]
        if len(ctx.graph.shape(src)) == 4 and c * h * w == k and ctx.graph.shape(name)[0] == n:
            return src, (h, w)
    return name, (1, 1)


def _lower_fc(ctx: LowerContext, op: Op, weight_kn: np.ndarray, bias: np.ndarray | None, act) -> None:
    src = op.inputs[0]
    if len(ctx.graph.shape(src)) != 2:
        raise unsupported(op, f"on a rank-{len(ctx.graph.shape(src))} input")
    k, n_out = weight_kn.shape
    src, (kh, kw) = _fc_input(ctx, src, k)
    c = ctx.net.shapes[src][1]
    w = np.ascontiguousarray(weight_kn.T).reshape(n_out, c, kh, kw)
    if bias is not None:
        bias = np.broadcast_to(bias.reshape(-1), (n_out,)).astype(np.float32)
    _conv_layer(ctx, op, src, w, bias, (kh, kw), (1, 1), (0, 0, 0, 0), (1, 1), act)


def _lower_gemm(ctx: LowerContext, op: Op) -> None:
    a: ops.Gemm = op.attrs
    if a.trans_a:
        raise unsupported(op, "with transA")
    w = ctx.const(op, 1)
    w = (w.T if a.trans_b else w) * np.float32(a.alpha)
    b = ctx.const(op, 2)
    _lower_fc(ctx, op, w, None if b is None else b * np.float32(a.beta), a.act)


def _lower_matmul(ctx: LowerContext, op: Op) -> None:
    weight = ctx.const(op, 1)
    if len(ctx.graph.shape(op.inputs[0])) == 3 and weight.ndim == 2:
        _lower_rows_fc(ctx, op, weight)
        return
    _lower_fc(ctx, op, weight, None, op.attrs.act)


def _rows_view(ctx: LowerContext, name: str, rows: int) -> str:
    """`name`'s bytes read as (rows, features, 1, 1): the NCHW view in which an FC runs on each row."""
    shape = (rows, int(np.prod(ctx.net.shapes[name])) // rows, 1, 1)
    return ctx.add_tensor(f"{name}#rows", shape, ctx.t(name), ctx.net.storage[name])


def _bias_add(ctx: LowerContext, op: Op, features: int, axis: int, relu: bool = False) -> tuple[Op, np.ndarray] | None:
    """The Add of one constant per output feature (along `axis`) that alone reads `op`'s output: a bias
    exported apart; with `relu`, a ReLU fused into that Add is allowed too."""
    add = sole_user(ctx.graph, op.outputs[0])
    if add is None or add.kind != "eltwise" or add.attrs.kind != "add" or op.attrs.act:
        return None
    if add.attrs.act is not None and not (relu and add.attrs.act.kind == "relu"):
        return None
    others = [i for i in add.inputs if i != op.outputs[0]]
    const = ctx.graph.const(others[0]) if len(others) == 1 and len(add.inputs) == 2 else None
    out_shape = ctx.graph.shape(op.outputs[0])
    if const is None or const.size != features or ctx.graph.shape(add.outputs[0]) != out_shape:
        return None
    pos = axis % len(out_shape) - len(out_shape)  # numpy broadcasting aligns the constant on the right
    if const.ndim > len(out_shape) or const.ndim < -pos or const.shape[pos] != features:
        return None
    return add, np.asarray(const, np.float32).reshape(-1)


def _lower_rows_fc(ctx: LowerContext, op: Op, weight: np.ndarray) -> None:
    """(B, L, K) x (K, N), a sequence model's linear layer: the B·L rows as the samples of one FC (the bytes
    are already row after row), with the bias Add that follows folded in."""
    b, rows, k = ctx.graph.shape(op.inputs[0])
    features = weight.shape[1]
    last, bias = op, None
    found = _bias_add(ctx, op, features, -1)
    if found is not None:
        last, bias = found
        ctx.absorbed.add(last.name)
    src = _rows_view(ctx, op.inputs[0], b * rows)
    out = last.outputs[0]
    view = ctx.add_tensor(f"{out}#rows", (b * rows, features, 1, 1), ctx.t(out))
    ctx.net.storage[out] = view
    w = np.ascontiguousarray(weight.T).reshape(features, k, 1, 1)
    fc = Op(op.name, op.kind, [src], [view], op.attrs)
    _conv_layer(ctx, fc, src, w, bias, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), op.attrs.act)


def _lower_deconv(ctx: LowerContext, op: Op) -> None:
    """A transposed conv whose kernel equals its stride (a learned upsample: each input pixel paints its own
    s x s output block): one 1x1 conv per phase (a, b) of the block, with the weights W[:, :, a, b], then the
    phases interleaved into the output (moves.interleave). The bias Add (and ReLU) that follows folds in."""
    a: ops.ConvTranspose2d = op.attrs
    w, b = ctx.const(op, 1), ctx.const(op, 2)
    cin, oc, kh, kw = w.shape
    if (kh, kw) != tuple(a.strides) or any(a.pads) or a.group != 1 or any(a.output_padding) or a.dilations != (1, 1):
        raise unsupported(op, f"with kernel {(kh, kw)}, strides {tuple(a.strides)}, pads {list(a.pads)}, group "
                              f"{a.group} (need kernel = stride, no pads, one group)")  # fmt: skip
    last, act = op, a.act
    found = _bias_add(ctx, op, oc, 1, relu=True)
    if found is not None:
        last, extra = found
        ctx.absorbed.add(last.name)
        b = extra if b is None else b + extra
        act = last.attrs.act
    if act is not None and act.kind != "relu":
        raise unsupported(op, f"with fused activation {act.kind}")
    out = last.outputs[0]
    n, _, h, wd = ctx.net.shapes[op.inputs[0]]
    phases = []
    for dy in range(kh):
        for dx in range(kw):
            phase = ctx.add_tensor(f"{out}#phase{dy}{dx}", (n, oc, h, wd), ctx.t(out))
            conv = Op(f"{op.name}#phase{dy}{dx}", "conv2d", [op.inputs[0]], [phase], None)
            weight = np.ascontiguousarray(w[:, :, dy, dx].T).reshape(oc, cin, 1, 1)
            _conv_layer(ctx, conv, op.inputs[0], weight, b, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), act)
            phases.append(phase)
    ctx.add(Layer(op.name, "interleave", tuple(phases), out, steps=(1, 1, kh, kw)))


def _lower_pool(ctx: LowerContext, op: Op) -> None:
    a: ops.Pool2d = op.attrs
    if a.act is not None:
        raise unsupported(op, f"with fused activation {a.act.kind}")
    src, out = op.inputs[0], op.outputs[0]
    _, _, h, w = ctx.net.shapes[src]
    _, _, oh, ow = ctx.net.shapes[out]
    kh, kw = a.kernel
    top, left = a.pads[0], a.pads[1]
    # ceil mode: the extra windows read padding below/right of the input
    bottom = max(a.pads[2], (oh - 1) * a.strides[0] + (kh - 1) * a.dilations[0] + 1 - h - top)
    right = max(a.pads[3], (ow - 1) * a.strides[1] + (kw - 1) * a.dilations[1] + 1 - w - left)
    _add_pool(ctx, op, a.mode, (kh, kw), a.strides, (top, bottom, left, right), a.dilations, a.count_include_pad)


def _lower_global_pool(ctx: LowerContext, op: Op) -> None:
    _, _, h, w = ctx.net.shapes[op.inputs[0]]
    _add_pool(ctx, op, op.attrs.mode, (h, w), (1, 1), (0, 0, 0, 0), (1, 1), True)


def _add_pool(ctx: LowerContext, op: Op, mode: str, kernel, strides, pads, dil, include_pad: bool) -> None:
    _check_window(op, kernel, strides, pads)
    src, out = op.inputs[0], op.outputs[0]
    tx, ty = ctx.t(src), ctx.t(out)
    if mode == "avg":
        if any(pads) and not include_pad:
            raise unsupported(op, "average pooling that excludes padding from the divisor")
        m, r = bm1880_requant_multiplier(tx, ty * kernel[0] * kernel[1])
    elif mode == "max":
        m, r = (1, 0) if tx == ty else bm1880_requant_multiplier(tx, ty)
    else:
        raise unsupported(op, f"with mode {mode}")
    ctx.add(Layer(op.name, "pool", (src,), out, mode, kernel, strides, pads, dil, rshift=r, multipliers=(m,)))


def _add_relu_like(ctx: LowerContext, name: str, mode: str, src: str, out: str, slope=0.0) -> None:
    """gt side `x·gt_scale >> gt_shift`, le side by a constant (leaky) or per-channel slopes (prelu)."""
    ratio = np.float32(ctx.t(src)) / np.float32(ctx.t(out))
    gt, gt_shift = (int(v) for v in bm1880_scale_shift(ratio, f"{name} gt scale"))
    weight, le, le_shift = None, 0, 0
    if mode == "leaky":
        le, le_shift = (int(v) for v in bm1880_scale_shift(np.float32(slope) * ratio, f"{name} le scale"))
    elif mode == "prelu":
        slopes = np.asarray(slope, np.float32) * ratio
        _, le_shift = bm1880_scale_shift(np.abs(slopes).max(), f"{name} le scale")
        weight = saturate(round_half_up(slopes * np.float32(2.0 ** int(le_shift))), np.int8)
        le_shift = int(le_shift)
    gt, le = min(gt, 127), int(np.clip(le, -128, 127))  # signed 8-bit constants
    ctx.add(Layer(name, "act", (src,), out, mode, weight=weight, multipliers=(gt, le), shifts=(gt_shift, le_shift)))


def _lower_activation(ctx: LowerContext, op: Op) -> None:
    act = op.attrs.act
    if act.kind not in ("relu", "leaky_relu"):
        lower_lut(ctx, op)
        return
    mode = "relu" if act.kind == "relu" else "leaky"
    _add_relu_like(ctx, op.name, mode, op.inputs[0], op.outputs[0], slope=float(act.alpha))


def _lower_prelu(ctx: LowerContext, op: Op) -> None:
    c = ctx.net.shapes[op.inputs[0]][1]
    slope = ctx.const(op, 1)
    if slope.size not in (1, c):
        raise unsupported(op, f"with slope shape {list(slope.shape)} (need one per channel)")
    _add_relu_like(ctx, op.name, "prelu", op.inputs[0], op.outputs[0], np.broadcast_to(slope.reshape(-1), (c,)))


def _lower_eltwise(ctx: LowerContext, op: Op) -> None:
    a: ops.Eltwise = op.attrs
    if a.kind == "mul":
        lower_mul(ctx, op)
        return
    if a.kind not in ("add", "max"):
        raise unsupported(op, f"eltwise {a.kind}")
    if a.act is not None and a.act.kind != "relu":
        raise unsupported(op, f"with fused activation {a.act.kind}")
    out = op.outputs[0]
    if len(op.inputs) != 2 or any(ctx.graph.const(i) is not None for i in op.inputs):
        raise unsupported(op, "with constant or more than two inputs")
    if any(ctx.graph.shape(i) != ctx.graph.shape(out) for i in op.inputs):
        raise unsupported(op, "with broadcasting")
    m, r = bm1880_eltwise_multipliers(np.array([ctx.t(i) for i in op.inputs]), ctx.t(out))
    ctx.add(Layer(op.name, "eltwise", tuple(op.inputs), out, a.kind, rshift=int(r), relu=a.act is not None,
                  multipliers=tuple(int(v) for v in m)))  # fmt: skip


def _lower_concat(ctx: LowerContext, op: Op) -> None:
    out = op.outputs[0]
    rank = len(ctx.graph.shape(out))
    axis = op.attrs.axis % rank
    axis4 = {4: axis, 2: axis, 3: (0, 1, 3)[axis]}.get(rank)
    if axis4 is None or any(ctx.graph.const(i) is not None for i in op.inputs):
        raise unsupported(op, f"on rank {rank} or with constant inputs")
    pairs = [(1, 0) if ctx.t(i) == ctx.t(out) else bm1880_requant_multiplier(ctx.t(i), ctx.t(out))
             for i in op.inputs]  # fmt: skip
    ctx.add(Layer(op.name, "concat", tuple(op.inputs), out, str(axis4),
                  multipliers=tuple(m for m, _ in pairs), shifts=tuple(r for _, r in pairs)))  # fmt: skip


def _lower_reshape(ctx: LowerContext, op: Op) -> None:
    src, out = op.inputs[0], op.outputs[0]
    ctx.net.storage[out] = ctx.net.storage[src]
    ctx.net.thresholds[out] = ctx.t(src)  # same bytes, same scale


LOWERINGS: dict[str, Callable[[LowerContext, Op], None]] = {
    "conv2d": _lower_conv,
    "gemm": _lower_gemm,
    "matmul": _lower_matmul,
    "pool2d": _lower_pool,
    "global_pool": _lower_global_pool,
    "activation": _lower_activation,
    "prelu": _lower_prelu,
    "eltwise": _lower_eltwise,
    "concat": _lower_concat,
    "reshape": _lower_reshape,
    "slice": lower_slice,
    "split": lower_split,
    "resize": lower_resize,
    "conv_transpose2d": _lower_deconv,
    "transpose": lower_transpose,
}


# ops inside the net with no BM1880 int8 form, and why (as a trailing output they are left to the host)
NO_FORM = {
    "softmax": "the TIU has no exponent, cross-channel sum or divide in int8, and a 256-entry lookup sees one "
    "value at a time; BMNet runs softmax on the host, only as a net output",
    "layer_norm": "npuc has no BM1880 form for it: the per-row mean, variance and reciprocal square root would each "
    "be requantized to int8 (the TIU has no divide and the chip no float format); cv18xx runs it in bf16",
    "recurrent": "npuc has no BM1880 form for it: its unrolled steps run in bf16 on cv18xx, and BM1880 has no float "
    "format while a table made on the model has no int8 thresholds for them",
}


def lower(
    graph: Graph,
    table: dict[str, float],
    table_names: dict[str, str] | None = None,
    source: str = "--calib",
    channel_gains: bool = False,
) -> LoweredNet:
    """The BM1880 int8 layers of a canonicalized float graph (modified: its host tail is dropped)."""
    dropped = strip_host_tail(graph)
    graph.prune()
    for op in graph.ops:
        with per_op(op):
            if op.kind in NO_FORM:
                raise UnsupportedError(
                    f"op '{op.name}' ({op.kind}) cannot run on bm1880: {NO_FORM[op.kind]}; end the bmodel before it "
                    f"with --output-names (its input '{op.inputs[0]}' and the other tensors the host needs)"
                )
            if op.kind not in LOWERINGS:
                raise UnsupportedError(
                    f"op '{op.name}' ({op.kind}) is not supported by the bm1880 target "
                    f"(supported: {', '.join(sorted(LOWERINGS))}); remove or replace it"
                )
    stop_if_gaps()
    net = LoweredNet(graph.name, list(graph.inputs), list(graph.outputs), {}, {}, {})
    net.host_ops = dropped
    if dropped:
        net.notes.append(f"left to the host (not in the bmodel): {', '.join(dropped)}")
    acts = list(graph.inputs) + [o for op in graph.ops for o in op.outputs]
    producers = graph.producers()
    for name in acts:
        net.ir_shapes[name] = tuple(graph.shape(name))
        net.shapes[name] = as_4d(graph.shape(name), f"tensor '{name}'")
        net.storage[name] = name
        th = threshold_for(name, table, table_names)
        if th is not None:
            net.thresholds[name] = th
    ctx = LowerContext(graph, net, producers, source, channel_gains)
    for op in graph.ops:
        with per_op(op):
            if op.name not in ctx.absorbed:
                LOWERINGS[op.kind](ctx, op)
    stop_if_gaps()
    for name in net.inputs + net.outputs:
        ctx.t(name)
    return net
