"""Calibration-data refinement of conv / FC weights for the cv18xx int8 scheme: bias correction and weight
reconstruction. The integer format does not change: the result is a float graph with new constants that
`passes.quantization.quantize` turns into int8 per-channel weights and int32 biases as usual.

Both walk the graph once, in order, keeping two batched environments over the calibration samples: the
float network and the scheme simulated in float (passes/quantization/qsim.py) with the layers already refined. Each
conv / gemm / matmul with constant weights then sees the quantized activations the deployed network will
give it, and is fitted to the float network's result (its pre-activation output):

- `bias`: per output channel, the mean of (quantized-path output − float output) over samples and positions
  is subtracted from the bias (a conv without one gets one).
- `weights`: ridge least squares per output channel, mapping the quantized input to the float output:
  depthwise kh·kw + 1 unknowns per channel, other convs and FC (ic·kh·kw + 1) unknowns shared by every
  output channel's system; the ridge pulls towards the original weights (`ridge` × the mean diagonal of
  AᵀA), which matters where samples are few (1x1 convs on pooled features, FC). The refitted weights then
  go on their int8 grid and a bias correction absorbs the mean error that rounding adds.
- `gptq`: as `weights`, but the refitted weights are placed on their int8 grid row by row with the rounding
  error compensated through the layer's Hessian (passes/calibration/gptq.py) instead of rounded to nearest.
- a `+views` suffix (`weights+views`, `gptq+views`) fits on the samples plus passes/calibration/augment.py's crops,
  rescales and tone changes of them (5x the samples, 5x the time).

Only `bias` and `weights` are offered to users (`METHODS`); the others are kept for bench/accuracy.py, where
they measured no better than `weights` on PP-LCNet (its docstring has the numbers).

Grouped convs that are not depthwise and matmuls whose weight is not constant are left as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.interp import to_graph_layout
from npuc.compiler.ir import Graph, Op
from npuc.compiler.kernels.conv import conv2d_nchw, pad_hw, windows
from npuc.passes.calibration.augment import augment_feeds
from npuc.passes.calibration.gptq import round_refit
from npuc.passes.quantization.qsim import Simulator, is_depthwise, output_cosines, stack_feeds

METHODS = ("bias", "weights")  # what `npuc calibrate --refine` offers
BENCH_METHODS = ("gptq", "weights+views", "gptq+views")  # measured, no better than "weights" (module docstring)
DEFAULT_RIDGE = 0.1  # chosen by calibration-only cross-validation (bench/accuracy.py docstring)
CHUNK_ELEMENTS = 1 << 22  # floats per im2col block when accumulating normal equations


@dataclass
class RefineResult:
    """Refined constants (IR tensor name -> float32 array) and the calibration output cosine before/after."""

    constants: dict[str, np.ndarray]
    cosine_before: float
    cosine_after: float
    layers: list[str] = field(default_factory=list)

    def apply(self, graph: Graph) -> Graph:
        """A copy of `graph` with the refined constants (new bias tensors are added and wired in)."""
        return apply_constants(graph, self.constants)


def bias_name(graph: Graph, op: Op) -> str | None:
    """The constant that acts as `op`'s bias: its own third input, for a matmul the constant of the eltwise
    add right after it (None if there is none), else a new `<op>_refined_bias`."""
    if op.kind != "matmul":
        return op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] else f"{op.name}_refined_bias"
    users = [u for u in graph.ops if op.outputs[0] in u.inputs]
    if len(users) != 1 or users[0].kind != "eltwise" or users[0].attrs.kind != "add" or len(users[0].inputs) != 2:
        return None
    other = next((n for n in users[0].inputs if n != op.outputs[0]), None)
    c = graph.const(other) if other else None
    w = graph.const(op.inputs[1])
    return other if c is not None and c.size == w.shape[-1] and users[0].attrs.act is None else None


def apply_constants(graph: Graph, constants: Mapping[str, np.ndarray]) -> Graph:
    """`graph` (copied) with constants replaced; a `<op>_refined_bias` constant becomes that op's bias."""
    out = copy.deepcopy(graph)
    for op in out.ops:
        name = f"{op.name}_refined_bias"
        if name in constants and (len(op.inputs) < 3 or not op.inputs[2]):
            op.inputs = [*op.inputs[:2], name]
    for name, value in constants.items():
        if name in out.tensors and not out.tensors[name].is_const:
            raise UserError(f"refinement names '{name}', which is not a constant of the model; refine it again")
        out.add_const(name, np.asarray(value, np.float32))
    return out


def _refinable(graph: Graph, op: Op) -> bool:
    if op.kind not in ("conv2d", "gemm", "matmul") or len(op.inputs) < 2:
        return False
    w = graph.const(op.inputs[1])
    if w is None or not np.issubdtype(w.dtype, np.floating):
        return False
    if op.kind == "conv2d":
        return op.attrs.group == 1 or is_depthwise(op, w)
    if op.kind == "gemm":
        return not op.attrs.trans_a and op.attrs.alpha == 1.0 and op.attrs.beta == 1.0
    return w.ndim == 2 and len(graph.shape(op.inputs[0])) == 2 and bias_name(graph, op) is not None


def _as_matrix(op: Op, w: np.ndarray) -> np.ndarray:
    """FC weights as (in, out)."""
    return w.T if op.kind == "gemm" and op.attrs.trans_b else w


def _from_matrix(op: Op, m: np.ndarray) -> np.ndarray:
    return m.T if op.kind == "gemm" and op.attrs.trans_b else m


def linear(op: Op, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """The op's output before its fused activation."""
    if op.kind == "conv2d":
        a = op.attrs
        y = conv2d_nchw(x, w, a.strides, a.pads, a.dilations, a.group)  # depthwise: a sum over its taps
        return y if b is None else y + b.astype(np.float32).reshape(1, -1, 1, 1)
    y = x @ _as_matrix(op, w).astype(np.float32)
    return y if b is None else y + b.astype(np.float32).reshape(-1)


def _channel_mean(op: Op, e: np.ndarray) -> np.ndarray:
    return e.mean(axis=(0, 2, 3)) if op.kind == "conv2d" else e.reshape(-1, e.shape[-1]).mean(axis=0)


def _patches(op: Op, x: np.ndarray, k: tuple[int, int]) -> np.ndarray:
    """(N, C, OH, OW, KH, KW) windows of the padded input."""
    a = op.attrs
    return windows(pad_hw(x, a.pads), k, a.strides, a.dilations)


def _accumulate(ata: np.ndarray, aty: np.ndarray, cols: np.ndarray, target: np.ndarray) -> None:
    """Add one block of rows to AᵀA and AᵀY, A = [cols, 1]; cols (..., rows, d), target (..., rows, o).
    Block products in float32 (a block is at most CHUNK_ELEMENTS values), sums across blocks in float64."""
    d = cols.shape[-1]
    ct = np.swapaxes(cols, -1, -2)
    ata[..., :d, :d] += ct @ cols
    sums = cols.sum(axis=-2, dtype=np.float64)
    ata[..., :d, d] += sums
    ata[..., d, :d] += sums
    ata[..., d, d] += cols.shape[-2]
    aty[..., :d, :] += ct @ target
    aty[..., d, :] += target.sum(axis=-2, dtype=np.float64)


def _normal_equations_dense(op: Op, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AᵀA (D+1, D+1) and AᵀY (D+1, OC) for a group-1 conv or FC; A = [im2col(x), 1]."""
    if op.kind != "conv2d":
        d, oc = x.shape[-1], y.shape[-1]
        ata, aty = np.zeros((d + 1, d + 1)), np.zeros((d + 1, oc))
        _accumulate(ata, aty, x.reshape(-1, d), y.reshape(-1, oc))
        return ata, aty
    oc, d = w.shape[0], int(np.prod(w.shape[1:]))
    ata, aty = np.zeros((d + 1, d + 1)), np.zeros((d + 1, oc))
    per = max(1, CHUNK_ELEMENTS // max(1, d * y.shape[2] * y.shape[3]))
    for s in range(0, x.shape[0], per):  # blocks of samples bound the im2col copy
        win = _patches(op, x[s : s + per], w.shape[2:])
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(-1, d)
        _accumulate(ata, aty, cols, y[s : s + per].transpose(0, 2, 3, 1).reshape(len(cols), oc))
    return ata, aty


def _normal_equations_depthwise(op: Op, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per channel AᵀA (C, K+1, K+1) and AᵀY (C, K+1); A = [the channel's kh·kw window taps, 1]."""
    c, k = w.shape[0], int(np.prod(w.shape[2:]))
    ata, aty = np.zeros((c, k + 1, k + 1)), np.zeros((c, k + 1, 1))
    per = max(1, CHUNK_ELEMENTS // max(1, c * k * y.shape[2] * y.shape[3]))
    for s in range(0, x.shape[0], per):
        win = _patches(op, x[s : s + per], w.shape[2:])
        taps = win.transpose(1, 0, 2, 3, 4, 5).reshape(c, -1, k)
        _accumulate(ata, aty, taps, y[s : s + per].transpose(1, 0, 2, 3).reshape(c, -1, 1))
    return ata, aty[..., 0]


def _ridge_solve(ata: np.ndarray, aty: np.ndarray, prior: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """argmin ‖Aθ − y‖² + λ‖θ − prior‖², λ = ridge · mean diagonal of AᵀA (per system), and the system's
    matrix AᵀA + λI (the Hessian that passes/calibration/gptq.py rounds against)."""
    n = ata.shape[-1]
    lam = ridge * np.trace(ata, axis1=-2, axis2=-1) / n + 1e-12
    eye = np.eye(n)
    if ata.ndim == 3:  # depthwise: one system per channel, prior (C, K+1)
        lhs = ata + lam[:, None, None] * eye
        return np.linalg.solve(lhs, (aty + lam[:, None] * prior)[..., None])[..., 0], lhs
    lhs = ata + lam * eye
    return np.linalg.solve(lhs, aty + lam * prior), lhs


def reconstruct(  # noqa: ANN201
    op: Op, x_q: np.ndarray, y_f: np.ndarray, w: np.ndarray, b: np.ndarray, ridge: float, rounding: bool = False
):
    """Ridge least-squares weights and bias mapping the quantized input `x_q` to the float output `y_f`;
    with `rounding`, the weights already on their int8 grid, rounding error compensated (passes/calibration/gptq.py)."""
    if op.kind == "conv2d" and is_depthwise(op, w):
        ata, aty = _normal_equations_depthwise(op, x_q, y_f, w)
        prior = np.concatenate([w.reshape(w.shape[0], -1), b.reshape(-1, 1)], axis=1).astype(np.float64)
        theta, lhs = _ridge_solve(ata, aty, prior, ridge)
        if rounding:  # one system per channel, one output each
            theta = round_refit(lhs, theta[..., None], per_tensor=False)[..., 0]
        return theta[:, :-1].reshape(w.shape).astype(np.float32), theta[:, -1].astype(np.float32)
    ata, aty = _normal_equations_dense(op, x_q, y_f, w)
    if op.kind == "conv2d":
        prior_w = w.reshape(w.shape[0], -1).T
    else:
        prior_w = _as_matrix(op, w)
    prior = np.concatenate([prior_w, b.reshape(1, -1)], axis=0).astype(np.float64)
    theta, lhs = _ridge_solve(ata, aty, prior, ridge)
    if rounding:  # FC weights share one scale (weight_grid), conv weights one per output channel
        theta = round_refit(lhs[None], theta[None], per_tensor=op.kind != "conv2d")[0]
    new_w = theta[:-1].T.reshape(w.shape) if op.kind == "conv2d" else _from_matrix(op, theta[:-1])
    return new_w.astype(np.float32), theta[-1].astype(np.float32).reshape(b.shape)


def refine_weights(
    graph: Graph,
    thresholds: Mapping[str, float],
    feeds: Sequence[Mapping[str, np.ndarray]],
    method: str = "weights",
    ridge: float = DEFAULT_RIDGE,
) -> RefineResult:
    """Bias correction (`method="bias"`), weight reconstruction plus bias correction (`"weights"`), or one of
    `BENCH_METHODS` (module docstring) applied to every refinable conv / FC of `graph`, fitted on `feeds`
    (calibration samples) under `thresholds`."""
    if method not in METHODS + BENCH_METHODS:
        raise UserError(f"refinement method '{method}' is not one of {', '.join(METHODS + BENCH_METHODS)}")
    if not feeds:
        raise UserError("refinement needs calibration samples; pass at least one")
    if not 0.0 <= ridge < float("inf"):
        raise UserError(f"refinement ridge {ridge} must be a finite number >= 0 (default {DEFAULT_RIDGE})")
    fit, _, extra = method.partition("+")
    if extra == "views":  # fit on the samples and their crops / rescales / tone changes
        feeds = augment_feeds(feeds)
    biases = {op.name: bias_name(graph, op) for op in graph.ops if _refinable(graph, op)}
    zero = {
        name: np.zeros(out_channels(op, graph.const(op.inputs[1])), np.float32)
        for op in graph.ops
        if (name := biases.get(op.name)) is not None and name not in graph.tensors
    }
    graph = apply_constants(graph, zero) if zero else graph  # every refined op has a bias from here on
    feed = to_graph_layout(graph, stack_feeds(feeds))  # NHWC-fed inputs as the graph's NCHW tensors
    sim, float_sim = Simulator(graph, thresholds), Simulator(graph, {})
    out = graph.outputs[0]
    ref = float_sim.outputs(feed, quantized=False)
    before = float(output_cosines(ref, sim.outputs(feed)).mean())
    f_env, q_env = dict(feed), sim.inputs(feed)
    constants: dict[str, np.ndarray] = dict(zero)
    layers = []
    for i, op in enumerate(graph.ops):
        if op.name in biases:
            b_name = biases[op.name]
            w, b = graph.const(op.inputs[1]), graph.const(b_name)
            shape = b.shape
            y_f = linear(op, f_env[op.inputs[0]], w, b)
            x_q = q_env[op.inputs[0]]
            if fit != "bias":
                w, b = reconstruct(op, x_q, y_f, w, b, ridge, rounding=fit == "gptq")
                sim.set_weight(op.inputs[1], w)
                constants[op.inputs[1]] = w
            y_q = linear(op, x_q, sim.constant(op, 1, True), b)
            b = (b.reshape(-1) - _channel_mean(op, y_q - y_f)).astype(np.float32).reshape(shape)
            sim.set_weight(b_name, b)
            constants[b_name] = b
            layers.append(op.name)
        f_env = float_sim.forward(f_env, i, i + 1, quantized=False)
        q_env = sim.forward(q_env, i, i + 1)
    after = float(output_cosines(ref, q_env[out]).mean())
    return RefineResult(constants, before, after, layers)


def out_channels(op: Op, w: np.ndarray) -> int:
    """Output channels of a conv / FC with weights `w`."""
    return w.shape[0] if op.kind == "conv2d" else _as_matrix(op, w).shape[1]
