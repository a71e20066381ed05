"""Converters for ONNX ops that npuc spells in IR primitives: LogSoftmax, InstanceNormalization, Tile, Einsum.

Each becomes the ops a backend already has kernels for (reduce, eltwise, layer_norm, concat, transpose,
reshape, matmul), so every target runs them wherever it runs those primitives, with no new kernel.
"""

from __future__ import annotations

import math
import string

import numpy as np

from npuc.compiler import ops

from .registry import ConvertContext, converter

# ---- LogSoftmax: x - max - log(sum(exp(x - max))), stable for any input range ----------------------------


def _log_softmax(ctx: ConvertContext, axis: int, coerce_2d: bool) -> None:
    x, shape = ctx.input(0), ctx.shape(0)
    if coerce_2d:  # opset < 13 normalises the input flattened to 2-D at `axis`
        flat = ctx.temp("flat")
        ctx.emit("reshape", [x], ops.Reshape((math.prod(shape[:axis]), math.prod(shape[axis:]))), [flat])
        x, axis = flat, 1
    peak, shifted, exps, total, log_total = (ctx.temp(n) for n in ("max", "shifted", "exp", "sum", "log_sum"))
    ctx.emit("reduce", [x], ops.Reduce("max", (axis,), True), [peak])
    ctx.emit("eltwise", [x, peak], ops.Eltwise("sub"), [shifted])
    ctx.emit("activation", [shifted], ops.ActivationOp(ops.Activation("exp")), [exps])
    ctx.emit("reduce", [exps], ops.Reduce("sum", (axis,), True), [total])
    ctx.emit("activation", [total], ops.ActivationOp(ops.Activation("log")), [log_total])
    if not coerce_2d:
        ctx.emit("eltwise", [shifted, log_total], ops.Eltwise("sub"))
        return
    result = ctx.temp("log_softmax")
    ctx.emit("eltwise", [shifted, log_total], ops.Eltwise("sub"), [result])
    ctx.emit("reshape", [result], ops.Reshape(shape))


converter("LogSoftmax", 1)(lambda ctx: _log_softmax(ctx, ctx.axis(int(ctx.attr("axis", 1))), True))
converter("LogSoftmax", 13)(lambda ctx: _log_softmax(ctx, ctx.axis(int(ctx.attr("axis", -1))), False))


# ---- InstanceNormalization: a layer norm over the spatial axes, then the per-channel scale and bias -------


@converter("InstanceNormalization", 1, const_inputs=(1, 2))
def instance_normalization(ctx: ConvertContext) -> None:
    shape = ctx.shape(0)
    if len(shape) < 3:
        raise ctx.unsupported(f"the input is {list(shape)}; it needs a batch, a channel and a spatial axis")
    dtype = ctx.graph.tensors[ctx.input(0)].dtype
    ones, zeros, normed = ctx.temp("ones"), ctx.temp("zeros"), ctx.temp("normalized")
    ctx.graph.add_const(ones, np.ones(shape[2:], dtype))
    ctx.graph.add_const(zeros, np.zeros(shape[2:], dtype))
    eps = float(ctx.attr("epsilon", 1e-5))
    ctx.emit("layer_norm", [ctx.input(0), ones, zeros], ops.LayerNorm(2, eps), [normed])
    scale, bias = ctx.const(1), ctx.const(2)
    if scale.shape != (shape[1],) or bias.shape != (shape[1],):
        raise ctx.unsupported(f"scale {list(scale.shape)} and B {list(bias.shape)} must both be [{shape[1]}]")
    ctx.emit("channel_scale", [normed, ctx.input(1), ctx.input(2)], ops.ChannelScale(axis=1))


# ---- Tile: one concat of copies per repeated axis --------------------------------------------------------


@converter("Tile", 6, const_inputs=(1,))
def tile(ctx: ConvertContext) -> None:
    shape, repeats = ctx.shape(0), ctx.ints(1)
    if len(repeats) != len(shape) or any(r < 1 for r in repeats):
        raise ctx.unsupported(f"repeats {repeats} must be one positive count per axis of the {len(shape)}-D input")
    current = ctx.input(0)
    axes = [axis for axis, r in enumerate(repeats) if r > 1]
    if not axes:
        ctx.alias(current)
        return
    for i, axis in enumerate(axes):
        out = ctx.output(0) if i == len(axes) - 1 else ctx.temp(f"tiled{axis}")
        ctx.emit("concat", [current] * repeats[axis], ops.Concat(axis), [out])
        current = out


# ---- Einsum: the contraction forms linear and attention layers use, as transpose/reshape/matmul ---------


def _einsum_terms(ctx: ConvertContext) -> tuple[list[str], str]:
    """The operand terms and the output term, the ellipsis spelled out as letters the equation does not use."""
    equation = str(ctx.attr("equation", "")).replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ctx.inputs) or not 1 <= len(terms) <= 2:
        raise ctx.unsupported(f"equation {equation!r} has {len(terms)} operand terms for {len(ctx.inputs)} inputs",
                              "npuc converts one- and two-operand Einsum")  # fmt: skip
    spare = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in equation]
    ellipsis_rank = max((len(ctx.shape(i)) - len(t.replace("...", "")) for i, t in enumerate(terms) if "..." in t),
                        default=0)  # fmt: skip
    filler = "".join(spare[:ellipsis_rank])
    spelled = []
    for i, term in enumerate(terms):
        if "..." in term:
            term = term.replace("...", filler[ellipsis_rank - (len(ctx.shape(i)) - len(term) + 3) :])
        if len(term) != len(ctx.shape(i)) or not all(x.isalpha() for x in term):
            raise ctx.unsupported(f"term {terms[i]!r} does not match input {i} of shape {list(ctx.shape(i))}")
        if len(set(term)) != len(term):
            raise ctx.unsupported(f"term {terms[i]!r} repeats an index (a diagonal)", "npuc converts contractions only")
        spelled.append(term)
    if arrow:
        out = rhs.replace("...", filler)
    else:  # implicit output: the ellipsis, then the indices seen once, alphabetically
        counts = "".join(spelled)
        out = filler + "".join(sorted(c for c in set(counts) if counts.count(c) == 1 and c not in filler))
    if len(set(out)) != len(out) or any(c not in "".join(spelled) for c in out):
        raise ctx.unsupported(f"output term {rhs!r} names an index twice or one no operand has")
    return spelled, out


class _Builder:
    """Emits the primitive ops, skipping the ones that would change nothing."""

    def __init__(self, ctx: ConvertContext) -> None:
        self.ctx = ctx

    def transpose(self, name: str, term: str, order: str) -> str:
        if term == order:
            return name
        out = self.ctx.temp("transposed")
        self.ctx.emit("transpose", [name], ops.Transpose(tuple(term.index(c) for c in order)), [out])
        return out

    def reshape(self, name: str, shape: tuple[int, ...], out: str | None = None) -> str:
        if self.ctx.graph.shape(name) == shape and out is None:
            return name
        out = out or self.ctx.temp("reshaped")
        self.ctx.emit("reshape", [name], ops.Reshape(shape), [out])
        return out

    def sum_out(self, name: str, term: str, keep: str) -> tuple[str, str]:
        """Sum the indices of `term` not in `keep`."""
        axes = tuple(i for i, c in enumerate(term) if c not in keep)
        if not axes:
            return name, term
        out = self.ctx.temp("summed")
        self.ctx.emit("reduce", [name], ops.Reduce("sum", axes, False), [out])
        return out, "".join(c for c in term if c in keep)


@converter("Einsum", 12)
def einsum(ctx: ConvertContext) -> None:
    terms, out = _einsum_terms(ctx)
    b = _Builder(ctx)
    size = {c: d for i, t in enumerate(terms) for c, d in zip(t, ctx.shape(i))}
    names = list(ctx.inputs)
    for i, term in enumerate(terms):  # indices only this operand has and the output drops: summed first
        others = "".join(t for j, t in enumerate(terms) if j != i)
        names[i], terms[i] = b.sum_out(names[i], term, out + others)
    if len(terms) == 1:
        if terms[0] == out:
            ctx.alias(names[0])
        else:
            ctx.emit("transpose", [names[0]], ops.Transpose(tuple(terms[0].index(x) for x in out)))
        return
    (left, right), (a, c) = names, terms
    for index in set(a) & set(c):
        if ctx.graph.shape(left)[a.index(index)] != ctx.graph.shape(right)[c.index(index)]:
            raise ctx.unsupported(f"index {index!r} has sizes that differ between the operands (broadcasting)")
    batch = "".join(x for x in out if x in a and x in c)
    contract = "".join(x for x in a if x in c and x not in out)
    rows = "".join(x for x in a if x not in c)
    cols = "".join(x for x in c if x not in a)

    def count(indices: str) -> int:
        return math.prod(size[x] for x in indices)

    lhs = b.reshape(b.transpose(left, a, batch + rows + contract), (count(batch), count(rows), count(contract)))
    rhs = b.reshape(b.transpose(right, c, batch + contract + cols), (count(batch), count(contract), count(cols)))
    product = ctx.temp("product")
    ctx.emit("matmul", [lhs, rhs], ops.MatMul(), [product])
    spread = batch + rows + cols
    if spread == out:
        b.reshape(product, tuple(size[x] for x in out), ctx.output(0))
        return
    spread_name = b.reshape(product, tuple(size[x] for x in spread))
    ctx.emit("transpose", [spread_name], ops.Transpose(tuple(spread.index(x) for x in out)))
