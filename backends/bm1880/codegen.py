"""BM1880 code generation: layer groups, tiling in 32 NPUs x 64 KiB, the neuron-area plan, the cmdbuf.

A group is a chain of single-input layers (conv, depthwise, pool, activation) whose intermediate tensors
stay in local memory; only the group's input and output touch the neuron area. Each group runs over slices
of its output (N first, then H); the input rows of a slice are found backwards through the chain
(kernel/stride/pad halos), and pads are applied only at the tensor's real edges. `opt` mirrors BMNet:
"none" = every layer is its own group (all activations through DDR); "layer-group" = chains, weights reloaded
per slice; "layer-group-weight" = chains with every weight of the group loaded once and kept resident.
Eltwise and concat layers are groups of their own; a conv whose weights cannot fit is split by output
channels (multiples of 32). Local layout per group: weights, then two activation ping-pong buffers, then
scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from npuc.compiler.errors import UnsupportedError, UserError

from . import isa
from .emit import Emitter, LTensor, align, lane_blocks, tile_bytes
from .kernels import KERNELS, LayerBuffers, Window, arith, work_bytes
from .quantize import Layer, LoweredNet

OPT_LEVELS = ("none", "layer-group", "layer-group-weight")
CHAIN_KINDS = frozenset({"conv", "dwconv", "pool", "act"})
WINDOW_KINDS = frozenset({"conv", "dwconv", "pool"})
FOREVER = 1 << 30


# ---------------------------------------------------------------------------------------------------------
# weight blob


@dataclass(frozen=True)
class WeightRef:
    weight: int = -1
    bias: int = -1


def _planes(bias: np.ndarray) -> bytes:
    """16-bit bias as the low-byte plane then the high-byte plane (specs/bm1880.md §2.7)."""
    u = bias.astype(np.int16).view(np.uint16)
    return (u & 0xFF).astype(np.uint8).tobytes() + (u >> 8).astype(np.uint8).tobytes()


@dataclass
class WeightBlob:
    """The shared weight area: each layer's int8 weights then its bias planes; identical content is shared."""

    data: bytearray = field(default_factory=bytearray)
    index: dict[bytes, int] = field(default_factory=dict)

    def _put(self, payload: bytes) -> int:
        if payload not in self.index:
            self.index[payload] = len(self.data)
            self.data += payload
        return self.index[payload]

    def add(self, layer: Layer) -> WeightRef:
        if layer.weight is None:
            return WeightRef()
        w = layer.weight
        if layer.kind == "conv":  # [oc][kh][kw][ic]
            w = w.transpose(0, 2, 3, 1)
        payload = np.ascontiguousarray(w).astype(np.int8).tobytes()
        if layer.bias is None:
            return WeightRef(self._put(payload))
        both = self._put(payload + _planes(layer.bias))
        return WeightRef(both, both + len(payload))


def weight_lane_bytes(layer: Layer, oc: int) -> int:
    """Local bytes per lane of a layer's weights and bias (for `oc` output channels)."""
    if layer.weight is None:
        return 0
    bias = 2 * lane_blocks(oc) if layer.bias is not None else 0
    if layer.kind == "conv":
        _, ic, kh, kw = layer.weight.shape
        return align(lane_blocks(oc) * kh * kw * ic) + align(bias)
    if layer.kind == "dwconv":
        return align(lane_blocks(oc) * align(layer.kernel[0] * layer.kernel[1])) + align(bias)
    return lane_blocks(oc) * isa.EU_NUM  # prelu slopes, EU-aligned (1, c, 1, 1)


# ---------------------------------------------------------------------------------------------------------
# groups and slicing


@dataclass
class Group:
    layers: list[Layer]
    oc_range: tuple[int, int] | None = None  # output-channel chunk of a lone conv
    nstep: int = 1
    slices: list[tuple[int, int]] = field(default_factory=list)
    resident: bool = True


@dataclass(frozen=True)
class Span:
    rows_in: tuple[int, int]
    rows_out: tuple[int, int]
    pads: tuple[int, int, int, int]


def spans(net: LoweredNet, layers: list[Layer], a: int, b: int) -> list[Span]:
    """Per layer, the input rows and edge pads that produce output rows [a, b) of the last layer."""
    out: list[Span] = []
    for layer in reversed(layers):
        rows_out = (a, b)
        pads = (0, 0, layer.pads[2], layer.pads[3])
        if layer.kind in WINDOW_KINDS:
            h_in = net.shapes[layer.inputs[0]][2]
            (kh, _), (sh, _), (dh, _) = layer.kernel, layer.strides, layer.dilations
            start = a * sh - layer.pads[0]
            end = (b - 1) * sh - layer.pads[0] + dh * (kh - 1) + 1
            pads = (max(0, -start), max(0, end - h_in), layer.pads[2], layer.pads[3])
            a, b = max(start, 0), min(end, h_in)
        out.append(Span((a, b), rows_out, pads))
    return out[::-1]


def _split(total: int, parts: int) -> list[tuple[int, int]]:
    edges = [total * i // parts for i in range(parts + 1)]
    return [(edges[i], edges[i + 1]) for i in range(parts) if edges[i + 1] > edges[i]]


def _channels(net: LoweredNet, layer: Layer, group: Group) -> int:
    c = net.shapes[layer.output][1]
    return group.oc_range[1] - group.oc_range[0] if group.oc_range and layer is group.layers[-1] else c


@dataclass(frozen=True)
class Layout:
    """Local addresses of a group: per-layer weight bases, the two activation buffers, scratch, end."""

    weights: tuple[int, ...]
    a: int
    b: int
    work: int
    end: int


def _tiles(net: LoweredNet, group: Group) -> tuple[int, int]:
    """(largest activation tile, largest scratch) per lane over the group's slices."""
    act = work = 0
    n = group.nstep
    for a, b in group.slices:
        for layer, span in zip(group.layers, spans(net, group.layers, a, b), strict=True):
            _, c_in, _, w_in = net.shapes[layer.inputs[0]]
            w_out = net.shapes[layer.output][3]
            t_in = tile_bytes((n, c_in, span.rows_in[1] - span.rows_in[0], w_in))
            t_out = tile_bytes((n, _channels(net, layer, group), span.rows_out[1] - span.rows_out[0], w_out))
            act = max(act, t_in, t_out)
            work = max(work, work_bytes(layer, max(t_in, t_out)))
    return act, work


def layout(net: LoweredNet, group: Group) -> Layout:
    sizes = [align(weight_lane_bytes(layer, _channels(net, layer, group))) for layer in group.layers]
    if group.resident:
        bases = tuple(sum(sizes[:i]) for i in range(len(sizes)))
        region = sum(sizes)
    else:
        bases, region = (0,) * len(sizes), max(sizes)
    act, work = _tiles(net, group)
    act = align(act)
    return Layout(bases, region, region + act, region + 2 * act, region + 2 * act + work)


def plan_slices(net: LoweredNet, group: Group) -> bool:
    """Pick the fewest N then H slices that fit local memory; False if even one row per slice does not."""
    n, _, h, _ = net.shapes[group.layers[-1].output]
    for nstep in range(n, 0, -1):
        group.nstep, group.slices = nstep, [(0, h)]
        if layout(net, group).end <= isa.LMEM_SIZE:
            return True
    for parts in range(2, h + 1):
        group.slices = _split(h, parts)
        if layout(net, group).end <= isa.LMEM_SIZE:
            return True
    return False


def _gmem_tensors(net: LoweredNet) -> tuple[set[str], dict[str, int]]:
    """Storage owners that must live in the neuron area (graph edges, shared or aliased tensors)."""
    needed = {net.storage[t] for t in net.inputs + net.outputs}
    uses: dict[str, int] = {}
    for layer in net.layers:
        for name in layer.inputs:
            owner = net.storage[name]
            uses[owner] = uses.get(owner, 0) + 1
            if owner != name:
                needed.add(owner)
    needed |= {name for name, count in uses.items() if count > 1}
    return needed, uses


def form_groups(net: LoweredNet, opt: str) -> list[Group]:
    """Greedy chains (opt != none), each extended only while it still fits local memory."""
    if opt not in OPT_LEVELS:
        raise UserError(f"--opt {opt!r} is not one of {', '.join(OPT_LEVELS)}")
    needed, _ = _gmem_tensors(net)
    resident = opt != "layer-group"
    groups: list[Group] = []
    for layer in net.layers:
        last = groups[-1] if groups else None
        if (
            opt != "none" and last is not None and last.oc_range is None and layer.kind in CHAIN_KINDS
            and last.layers[-1].kind in CHAIN_KINDS and layer.inputs == (last.layers[-1].output,)
            and last.layers[-1].output not in needed
        ):  # fmt: skip
            trial = Group(last.layers + [layer], resident=resident)
            if plan_slices(net, trial):
                groups[-1] = trial
                continue
        groups.extend(_lone(net, layer))
    return groups


def _lone(net: LoweredNet, layer: Layer) -> list[Group]:
    """A one-layer group, split by output channels when a conv's weights do not fit."""
    if layer.kind == "concat":
        return [Group([layer])]
    group = Group([layer])
    if plan_slices(net, group):
        return [group]
    oc = net.shapes[layer.output][1]
    if layer.kind == "conv":
        for chunk in range(((oc - 1) // isa.NPU_NUM) * isa.NPU_NUM, 0, -isa.NPU_NUM):
            trial = Group([layer], (0, chunk))
            if plan_slices(net, trial):
                return [
                    Group([layer], (c0, min(c0 + chunk, oc)), trial.nstep, trial.slices) for c0 in range(0, oc, chunk)
                ]
    raise UnsupportedError(
        f"layer '{layer.name}' ({layer.kind}) does not fit the BM1880 local memory even one row at a time"
    )


# ---------------------------------------------------------------------------------------------------------
# neuron area


def plan_neurons(net: LoweredNet, groups: list[Group]) -> tuple[dict[str, int], int]:
    """Offsets of the tensors that live in the neuron area (first fit over group-index lifetimes)."""
    life: dict[str, list[int]] = {net.storage[t]: [-1, -1] for t in net.inputs}
    for step, group in enumerate(groups):
        for layer in group.layers:
            for name in layer.inputs:
                owner = net.storage[name]
                if owner in life:
                    life[owner][1] = max(life[owner][1], step)
        out = group.layers[-1].output
        life.setdefault(out, [step, step])
    for name in net.outputs:
        life[net.storage[name]][1] = FOREVER
    placed: list[tuple[int, int, int]] = []  # (offset, size, last step)
    offsets: dict[str, int] = {}
    for name, (start, end) in sorted(life.items(), key=lambda kv: (kv[1][0], kv[0])):
        size = int(np.prod(net.shapes[name]))
        live = sorted((o, s) for o, s, e in placed if e >= start)
        offset = 0
        for o, s in live:
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        offsets[name] = offset
        placed.append((offset, size, end))
    return offsets, max((o + s for o, s, _ in placed), default=0)


# ---------------------------------------------------------------------------------------------------------
# emission


def _gstrides(shape: tuple[int, int, int, int]) -> tuple[int, int, int]:
    _, c, h, w = shape
    return (c * h * w, h * w, w)


@dataclass
class Program:
    """Everything emission needs for one command."""

    net: LoweredNet
    blob: WeightBlob
    offsets: dict[str, int]
    em: Emitter = field(default_factory=Emitter)

    def neuron(self, load: bool, name: str, t: LTensor, n0: int, c0: int, h0: int, w0: int = 0) -> None:
        owner = self.net.storage[name]
        shape = self.net.shapes[name]
        gs = _gstrides(shape)
        offset = self.offsets[owner] + n0 * gs[0] + c0 * gs[1] + h0 * gs[2] + w0
        self.em.gdma(load, isa.FLAG_NEURON, offset, gs, t)

    def load_weights(self, layer: Layer, addr: int, oc_range: tuple[int, int]) -> tuple[int, int]:
        """GDMA the layer's weights (channels oc_range) to `addr`; returns (weight, bias) local addresses."""
        ref = self.blob.add(layer)
        if ref.weight < 0:
            return 0, 0
        c0, c1 = oc_range
        oc = c1 - c0
        if layer.kind == "conv":
            full, ic, kh, kw = layer.weight.shape
            per = kh * kw * ic
            t = LTensor(addr, (1, oc, kh * kw, ic), aligned=False)
            self.em.load_weight(ref.weight + c0 * per, (full * per, per, ic), t)
        elif layer.kind == "dwconv":
            full, kh, kw = layer.weight.shape
            t = LTensor(addr, (1, oc, kh, kw))
            self.em.load_weight(ref.weight + c0 * kh * kw, (full * kh * kw, kh * kw, kw), t)
        else:  # prelu slopes
            full = layer.weight.shape[0]
            t = LTensor(addr, (1, oc, 1, 1))
            self.em.load_weight(ref.weight + c0, (full, 1, 1), t)
        bias_addr = align(addr + t.lane_bytes)
        if ref.bias >= 0:
            self.em.load_weight(ref.bias + c0, (full, 1, 1), LTensor(bias_addr, (2, oc, 1, 1), aligned=False))
        return addr, bias_addr

    def run_group(self, group: Group) -> None:
        net, layers = self.net, group.layers
        if layers[0].kind == "concat":
            self._concat(layers[0])
            return
        oc_full = net.shapes[layers[-1].output][1]
        chunk = group.oc_range or (0, oc_full)
        lay = layout(net, group)

        def load_layer_weights(i: int) -> tuple[int, int]:
            rng = chunk if layers[i] is layers[-1] else (0, net.shapes[layers[i].output][1])
            return self.load_weights(layers[i], lay.weights[i], rng)

        resident = [load_layer_weights(i) for i in range(len(layers))] if group.resident else None
        n_total = net.shapes[layers[-1].output][0]
        for n0 in range(0, n_total, group.nstep):
            nn = min(group.nstep, n_total - n0)
            for a, b in group.slices:
                self._slice(group, chunk, n0, nn, a, b, lay, resident, load_layer_weights)

    def _slice(self, group, chunk, n0, nn, a, b, lay: Layout, resident, load_layer_weights) -> None:
        net, layers = self.net, group.layers
        sp = spans(net, layers, a, b)
        first = layers[0]
        _, c_in, _, w_in = net.shapes[first.inputs[0]]
        r0, r1 = sp[0].rows_in
        x = LTensor(lay.a, (nn, c_in, r1 - r0, w_in))
        self.neuron(True, first.inputs[0], x, n0, 0, r0)
        x2 = None
        if first.kind == "eltwise":
            x2 = LTensor(lay.b, x.shape)
            self.neuron(True, first.inputs[1], x2, n0, 0, r0)
        side = 1
        for i, (layer, span) in enumerate(zip(layers, sp, strict=True)):
            w_addr, b_addr = resident[i] if resident is not None else load_layer_weights(i)
            _, c_out, _, w_out = net.shapes[layer.output]
            oc = chunk[1] - chunk[0] if layer is layers[-1] else c_out
            o0, o1 = span.rows_out
            y_addr = lay.a if layer.kind == "eltwise" else (lay.a, lay.b)[side]
            y = LTensor(y_addr, (nn, oc, o1 - o0, w_out))
            KERNELS[layer.kind](self.em, layer, LayerBuffers(x, y, w_addr, b_addr, lay.work, x2), Window(span.pads), oc)
            x, side = y, (1 - side if layer.kind != "eltwise" else side)
        self.neuron(False, layers[-1].output, x, n0, chunk[0], a)

    def _concat(self, layer: Layer) -> None:
        """Each input tile goes through local memory (requantized if its threshold differs) to its place."""
        axis = int(layer.mode)
        offset = 0
        for name, m, r in zip(layer.inputs, layer.multipliers, layer.shifts, strict=True):
            n, c, h, w = net_shape = self.net.shapes[name]
            rows = max(1, min(h, isa.LMEM_SIZE // max(1, tile_bytes((1, c, 1, w)))))
            while rows > 1 and tile_bytes((1, c, rows, w)) > isa.LMEM_SIZE:
                rows -= 1
            if tile_bytes((1, c, rows, w)) > isa.LMEM_SIZE:
                raise UnsupportedError(f"concat '{layer.name}': input '{name}' rows do not fit local memory")
            pos = [0, 0, 0, 0]
            pos[axis] = offset
            for n0 in range(n):
                for h0 in range(0, h, rows):
                    t = LTensor(0, (1, c, min(rows, h - h0), w))
                    self.neuron(True, name, t, n0, 0, h0)
                    if (m, r) != (1, 0):
                        arith(self.em, "mul", t, t, m, r, const_signed=0)
                    self.neuron(False, layer.output, t, n0 + pos[0], pos[1], h0 + pos[2], pos[3])
            offset += net_shape[axis]
