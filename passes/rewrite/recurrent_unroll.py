"""LSTM and GRU unrolled over their (pinned) sequence into the ops every NPU runs: matrix products with constant
weights, slices, elementwise arithmetic, sigmoid and tanh — what tpu-mlir emits for recurrent layers on chips
without a recurrent unit. For backends that have no `recurrent` kernel (cv18xx); the float semantics are the
`recurrent` op's (compiler/kernels/recurrent.py).

Per direction, the input projection of every step is one Gemm over the whole sequence ([T*B, F] x W_g^T + b_g
per gate g); each step slices its rows, adds h_{t-1} R_g^T (a Gemm with constant weights) and applies the
gate's activation. A constant initial state (zeros, as exporters write) folds away instead of running.
"""

from __future__ import annotations

import numpy as np

from npuc.compiler import ops
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op

State = str | np.ndarray  # a tensor name, or a constant [batch, hidden] value


class _Unroller:
    def __init__(self, graph: Graph, op: Op) -> None:
        self.graph, self.op, self.a = graph, op, op.attrs
        self.count = 0

    def name(self, what: str) -> str:
        self.count += 1
        return self.graph.unique_name(f"{self.op.name}_{what}{self.count}")

    def emit(self, kind: str, inputs: list[str], attrs: object, out: str | None = None) -> str:
        out = out or self.name(kind)
        self.graph.add_op(kind, inputs, [out], attrs, name=out)
        return out

    def const(self, value: np.ndarray, what: str) -> str:
        name = self.name(what)
        self.graph.add_const(name, np.ascontiguousarray(value, np.float32))
        return name

    def act(self, x: str, kind: str, gate: bool = True) -> str:
        """The activation of a gate (clipped first when the op has a clip) or, gate=False, of the cell state."""
        if self.a.clip is not None and gate:
            x = self.emit("activation", [x], ops.ActivationOp(ops.Activation("clip", lo=-self.a.clip, hi=self.a.clip)))
        return self.emit("activation", [x], ops.ActivationOp(ops.Activation(kind)))

    def gemm(self, x: str, weight: np.ndarray, bias: np.ndarray | None) -> str:
        """x @ weight.T (+ bias): weight is [out, in], as the recurrent weights are stored."""
        inputs = [x, self.const(weight, "w")] + ([self.const(bias, "b")] if bias is not None else [])
        return self.emit("gemm", inputs, ops.Gemm(trans_b=True))

    def recur(self, xs: str, h: State, r: np.ndarray, bias: np.ndarray | None = None) -> str:
        """xs + h @ r.T (+ bias): the step's input part plus its recurrent part (a constant h folds)."""
        if isinstance(h, np.ndarray):
            part = h @ r.T + (bias if bias is not None else 0)
            return xs if not np.any(part) else self.emit("eltwise", [xs, self.const(part, "h0r")], ops.Eltwise("add"))
        return self.emit("eltwise", [xs, self.gemm(h, r, bias)], ops.Eltwise("add"))

    def mul(self, a: str, b: State) -> str | None:
        """a * b; None when b is a constant zero (the product vanishes)."""
        if isinstance(b, np.ndarray):
            if not np.any(b):
                return None
            b = self.const(b, "state")
        return self.emit("eltwise", [a, b], ops.Eltwise("mul"))

    def slice_rows(self, x: str, t: int, batch: int) -> str:
        return self.emit("slice", [x], ops.Slice((t * batch,), ((t + 1) * batch,), (0,), (1,)))

    def run(self) -> None:
        g, a, op = self.graph, self.a, self.op
        x = op.inputs[0]
        w, r, b = (g.const(n) for n in op.inputs[1:4])
        if w is None or r is None or b is None:
            raise UserError(f"op '{op.name}' ({a.cell}): its weights and bias must be constants to unroll it")
        if a.cell == "lstm" and (g.const(op.inputs[6]) is None or np.any(g.const(op.inputs[6]))):
            raise UserError(f"op '{op.name}' (lstm): peephole connections cannot be unrolled; export without them")
        seq, batch, features = g.shape(x)
        flat = self.emit("reshape", [x], ops.Reshape((seq * batch, features)))
        ys, hs, cs = [], [], []
        for d in range(a.directions):
            backwards = a.direction == "reverse" or d == 1
            steps = list(reversed(range(seq))) if backwards else list(range(seq))
            h0 = self._initial(op.inputs[4], d, batch)
            c0 = self._initial(op.inputs[5], d, batch) if a.cell == "lstm" else None
            run = self._lstm if a.cell == "lstm" else self._gru
            outs, h, c = run(flat, w[d], r[d], b[d], h0, c0, steps, batch)
            ys.append(self._stack([outs[t] for t in range(seq)], (1, 1, batch, a.hidden), 0))
            hs.append(h)
            cs.append(c)
        self._stack(ys, None, 1, op.outputs[0])
        for states, out in zip((hs, cs), op.outputs[1:]):
            self._stack([self._tensor(s) for s in states], (1, batch, a.hidden), 0, out)

    def _initial(self, name: str, d: int, batch: int) -> State:
        """Direction d's initial state: its constant value, or the slice of the state input."""
        value = self.graph.const(name)
        if value is not None:
            return np.asarray(value[d], np.float32)
        part = self.emit("slice", [name], ops.Slice((d,), (d + 1,), (0,), (1,)))
        return self.emit("reshape", [part], ops.Reshape((batch, self.a.hidden)))

    def _tensor(self, state: State) -> str:
        return self.const(state, "state") if isinstance(state, np.ndarray) else state

    def _stack(self, names: list[str], piece: tuple[int, ...] | None, axis: int, out: str | None = None) -> str:
        """Concatenate along `axis`, each piece first reshaped to `piece` (None: as it is)."""
        if piece is not None:
            names = [self.emit("reshape", [n], ops.Reshape(piece)) for n in names]
        if len(names) == 1:
            return self.emit("reshape", names, ops.Reshape(self.graph.shape(names[0])), out)
        return self.emit("concat", names, ops.Concat(axis), out)

    def _lstm(self, flat, w, r, b, h, c, steps, batch):  # noqa: ANN001, ANN202
        hidden = self.a.hidden
        gate = lambda m, k: m[k * hidden : (k + 1) * hidden]  # noqa: E731  (ONNX order i, o, f, c)
        bias = b[: 4 * hidden] + b[4 * hidden :]
        xw = [self.gemm(flat, gate(w, k), gate(bias, k)) for k in range(4)]
        outs = {}
        for t in steps:
            pre = [self.recur(self.slice_rows(xw[k], t, batch), h, gate(r, k)) for k in range(4)]
            i, o, f = (self.act(p, "sigmoid") for p in pre[:3])
            candidate = self.act(pre[3], "tanh")
            kept, added = self.mul(f, c), self.emit("eltwise", [i, candidate], ops.Eltwise("mul"))
            c = added if kept is None else self.emit("eltwise", [kept, added], ops.Eltwise("add"))
            h = self.emit("eltwise", [o, self.act(c, "tanh", gate=False)], ops.Eltwise("mul"))
            outs[t] = h
        return outs, h, c

    def _gru(self, flat, w, r, b, h, c, steps, batch):  # noqa: ANN001, ANN202
        hidden = self.a.hidden
        gate = lambda m, k: m[k * hidden : (k + 1) * hidden]  # noqa: E731  (ONNX order z, r, h)
        wb, rb = b[: 3 * hidden], b[3 * hidden :]
        xw = [self.gemm(flat, gate(w, k), gate(wb, k) + (gate(rb, k) if k < 2 else 0)) for k in range(3)]
        outs = {}
        for t in steps:
            z, reset = (self.act(self.recur(self.slice_rows(xw[k], t, batch), h, gate(r, k)), "sigmoid")
                        for k in range(2))  # fmt: skip
            xs = self.slice_rows(xw[2], t, batch)
            if self.a.linear_before_reset:  # xs + r * (h R_h^T + rb_h)
                hr = self._tensor(h @ gate(r, 2).T + gate(rb, 2)) if isinstance(h, np.ndarray) else \
                    self.gemm(h, gate(r, 2), gate(rb, 2))  # fmt: skip
                candidate = self.emit("eltwise", [xs, self.emit("eltwise", [reset, hr], ops.Eltwise("mul"))],
                                      ops.Eltwise("add"))  # fmt: skip
            else:  # xs + (r * h) R_h^T + rb_h
                gated = self.mul(reset, h)
                candidate = self.recur(xs, np.zeros((batch, hidden), np.float32) if gated is None else gated,
                                       gate(r, 2), gate(rb, 2))  # fmt: skip
            ht = self.act(candidate, "tanh")
            # (1 - z) * ht + z * h = ht + z * (h - ht)
            diff = self.emit("eltwise", [self._tensor(h), ht], ops.Eltwise("sub"))
            h = self.emit("eltwise", [ht, self.emit("eltwise", [z, diff], ops.Eltwise("mul"))], ops.Eltwise("add"))
            outs[t] = h
        return outs, h, None


def unroll_recurrent(graph: Graph) -> list[str]:
    """Replace every `recurrent` op of `graph` by its unrolled ops, in place; returns one note per op."""
    notes = []
    for op in list(graph.iter_ops("recurrent")):
        at, before = graph.ops.index(op), len(graph.ops)
        _Unroller(graph, op).run()
        made = graph.ops[before:]
        del graph.ops[before:]
        graph.ops[at : at + 1] = made
        seq = graph.shape(op.inputs[0])[0]
        notes.append(f"{op.attrs.cell.upper()} '{op.name}' unrolled over {seq} steps x {op.attrs.directions} "
                     f"direction(s): {len(made)} ops (matrix products, sigmoid, tanh, elementwise)")  # fmt: skip
    graph.prune()
    return notes
