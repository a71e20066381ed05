"""LSTM and GRU over a sequence (ONNX semantics), one numpy step per time step and direction."""

from __future__ import annotations

import numpy as np

from ..ir import Op
from ..ops import Recurrent
from .activation import sigmoid
from .registry import float_kernel


def _gates(a: Recurrent, x: np.ndarray) -> np.ndarray:
    return np.clip(x, -a.clip, a.clip) if a.clip is not None else x


def _lstm_step(a: Recurrent, x, h, c, w, r, b, p):
    """One LSTM step; gates i, o, f, c as ONNX orders them; peepholes p (i, o, f) read the cell state."""
    z = x @ w.T + h @ r.T + b
    i, o, f, g = np.split(z, 4, axis=-1)
    pi, po, pf = np.split(p, 3)
    i, f, g = _gates(a, i + pi * c), _gates(a, f + pf * c), _gates(a, g)
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    return sigmoid(_gates(a, o + po * c)) * np.tanh(c), c


def _gru_step(a: Recurrent, x, h, w, r, b):
    """One GRU step; gates z, r, h as ONNX orders them (linear_before_reset picks where r applies)."""
    hidden = a.hidden
    wb, rb = b[: 3 * hidden], b[3 * hidden :]
    xw = x @ w.T + wb
    hr = h @ r[: 2 * hidden].T + rb[: 2 * hidden]
    zt = sigmoid(_gates(a, xw[..., :hidden] + hr[..., :hidden]))
    rt = sigmoid(_gates(a, xw[..., hidden : 2 * hidden] + hr[..., hidden:]))
    rh, rbh = r[2 * hidden :], rb[2 * hidden :]
    if a.linear_before_reset:
        candidate = xw[..., 2 * hidden :] + rt * (h @ rh.T + rbh)
    else:
        candidate = xw[..., 2 * hidden :] + (rt * h) @ rh.T + rbh
    ht = np.tanh(_gates(a, candidate))
    return (1 - zt) * ht + zt * h


@float_kernel("recurrent")
def recurrent(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    a: Recurrent = op.attrs
    x, w, r, b, h0 = inputs[:5]
    c0 = inputs[5] if a.cell == "lstm" else None
    peep = inputs[6] if a.cell == "lstm" else None
    seq = x.shape[0]
    y = np.zeros((seq, a.directions, x.shape[1], a.hidden), x.dtype)
    last_h, last_c = np.zeros_like(h0), np.zeros_like(h0)
    for d in range(a.directions):
        backwards = a.direction == "reverse" or d == 1
        h = h0[d]
        c = c0[d] if c0 is not None else None
        gates = 4 if a.cell == "lstm" else 3
        bias = b[d, : gates * a.hidden] + b[d, gates * a.hidden :] if a.cell == "lstm" else b[d]
        for t in reversed(range(seq)) if backwards else range(seq):
            if a.cell == "lstm":
                h, c = _lstm_step(a, x[t], h, c, w[d], r[d], bias, peep[d])
            else:
                h = _gru_step(a, x[t], h, w[d], r[d], bias)
            y[t, d] = h
        last_h[d] = h
        if c is not None:
            last_c[d] = c
    outputs = [y, last_h]
    return outputs + [last_c] if a.cell == "lstm" else outputs
