"""Converters for elementwise ONNX ops: activations and broadcasting arithmetic."""

from __future__ import annotations

import numpy as np

from npuc.compiler import ops
from npuc.compiler.errors import UserError

from .registry import ConvertContext, converter


def _activation(ctx: ConvertContext, act: ops.Activation) -> None:
    ctx.emit("activation", [ctx.input(0)], ops.ActivationOp(act))


def _simple(op_type: str, kind: str, since: int = 1) -> None:
    converter(op_type, since)(lambda ctx: _activation(ctx, ops.Activation(kind)))


for _op_type, _kind in (
    ("Relu", "relu"),
    ("Sigmoid", "sigmoid"),
    ("Tanh", "tanh"),
    ("HardSwish", "hard_swish"),
    ("Erf", "erf"),
    ("Sqrt", "sqrt"),
    ("Exp", "exp"),
    ("Log", "log"),
    ("Reciprocal", "reciprocal"),
    ("Neg", "neg"),
    ("Abs", "abs"),
):
    _simple(_op_type, _kind)


@converter("LeakyRelu", 1)
def leaky_relu(ctx: ConvertContext) -> None:
    _activation(ctx, ops.Activation("leaky_relu", alpha=float(ctx.attr("alpha", 0.01))))


@converter("Elu", 1)
def elu(ctx: ConvertContext) -> None:
    _activation(ctx, ops.Activation("elu", alpha=float(ctx.attr("alpha", 1.0))))


@converter("HardSigmoid", 1)
def hard_sigmoid(ctx: ConvertContext) -> None:
    alpha, beta = float(ctx.attr("alpha", 0.2)), float(ctx.attr("beta", 0.5))
    _activation(ctx, ops.Activation("hard_sigmoid", alpha=alpha, beta=beta))


@converter("Gelu", 20)
def gelu(ctx: ConvertContext) -> None:
    _activation(ctx, ops.Activation("gelu", approximate=ctx.attr("approximate", "none")))


@converter("Clip", 6)
def clip_attrs(ctx: ConvertContext) -> None:
    lo, hi = float(ctx.attr("min", -np.inf)), float(ctx.attr("max", np.inf))
    _activation(ctx, ops.Activation("clip", lo=lo, hi=hi))


@converter("Clip", 11, const_inputs=(1, 2))
def clip(ctx: ConvertContext) -> None:
    lo, hi = ctx.const(1), ctx.const(2)
    for bound in (lo, hi):
        if bound is not None and np.size(bound) != 1:
            raise UserError(f"node '{ctx.node.name}' (Clip): a bound of shape {np.shape(bound)} is not a scalar")
    act = ops.Activation(
        "clip",
        lo=-np.inf if lo is None else float(np.ravel(lo)[0]),  # exporters write scalars or 1-element tensors
        hi=np.inf if hi is None else float(np.ravel(hi)[0]),
    )
    _activation(ctx, act)


@converter("PRelu", 1)
def prelu(ctx: ConvertContext) -> None:
    ctx.emit("prelu", [ctx.input(0), ctx.input(1)], ops.PRelu())


def _binary(op_type: str, kind: str) -> None:
    converter(op_type, 7)(lambda ctx: ctx.emit("eltwise", ctx.inputs, ops.Eltwise(kind)))


for _op_type, _kind in (
    ("Add", "add"),
    ("Sub", "sub"),
    ("Mul", "mul"),
    ("Div", "div"),
    ("Sum", "add"),
    ("Max", "max"),
    ("Min", "min"),
    ("Pow", "pow"),
):
    _binary(_op_type, _kind)
