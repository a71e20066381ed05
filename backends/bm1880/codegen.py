"""BM1880 code generation: the weight blob, the neuron-area plan and the cmdbuf of the program's units.

Units (groups.py: layer groups formed by passes/lowering/layer_group.py, lone layers, output-channel chunks of a
conv, concats) run in order; each loads its weights and its inputs' rows from the weight/neuron areas,
computes tile by tile in local memory (N first, then H; pads only at the tensor's real edges) and stores
only its output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npuc.compiler.errors import UnsupportedError
from npuc.passes.lowering.layer_group import Tile

from . import isa
from .emit import Emitter, LTensor, align, lane_blocks, tile_bytes
from .groups import Unit, edge_pads
from .kernels import KERNELS, LUT_ENTRIES, LayerBuffers, Window, arith, lut_table
from .moves import MOVE_EMITTERS
from .quantize import Layer, LoweredNet

FOREVER = 1 << 30


# ---------------------------------------------------------------------------------------------------------
# weight blob


@dataclass(frozen=True)
class WeightRef:
    weight: int = -1
    bias: int = -1
    gains: int = -1


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
        bias = b"" if layer.bias is None else _planes(layer.bias)
        gains = b"" if layer.gains is None else layer.gains.astype(np.uint8).tobytes()
        at = self._put(payload + bias + gains)
        return WeightRef(at, at + len(payload) if bias else -1, at + len(payload) + len(bias) if gains else -1)


# ---------------------------------------------------------------------------------------------------------
# neuron area


def plan_neurons(net: LoweredNet, units: list[Unit]) -> tuple[dict[str, int], int]:
    """Offsets of the tensors that live in the neuron area (first fit over unit-index lifetimes)."""
    life: dict[str, list[int]] = {net.storage[t]: [-1, -1] for t in net.inputs}
    for step, unit in enumerate(units):
        for name in unit.group.inputs:
            owner = net.storage[name]
            if owner in life:
                life[owner][1] = max(life[owner][1], step)
        life.setdefault(unit.group.output, [step, step])
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

    def load_weights(self, layer: Layer, addr: int, oc_range: tuple[int, int]) -> tuple[int, int, int]:
        """GDMA the layer's weights (channels oc_range) to `addr`; returns (weight, bias, gains) local addresses."""
        ref = self.blob.add(layer)
        if ref.weight < 0:
            return 0, 0, 0
        c0, c1 = oc_range
        oc = c1 - c0
        if layer.kind == "lut":  # c-stride 0: the same 256 bytes into every lane
            self.em.load_weight(ref.weight, (LUT_ENTRIES, 0, LUT_ENTRIES), lut_table(addr))
            return addr, 0, 0
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
        gains_addr = align(bias_addr + 2 * lane_blocks(oc)) if ref.bias >= 0 else bias_addr
        if ref.gains >= 0:
            self.em.load_weight(ref.gains + c0, (full, 1, 1), LTensor(gains_addr, (1, oc, 1, 1)))
        return addr, bias_addr, gains_addr

    def run_unit(self, unit: Unit) -> None:
        net, layers = self.net, unit.layers
        if layers[0].kind == "concat":
            self._concat(layers[0])
            return
        if layers[0].kind in MOVE_EMITTERS:
            MOVE_EMITTERS[layers[0].kind](self, layers[0])
            return
        oc_full = net.shapes[layers[-1].output][1]
        chunk = unit.oc_range or (0, oc_full)

        def load_layer_weights(k: int) -> tuple[int, int, int]:
            rng = chunk if k == len(layers) - 1 else (0, net.shapes[layers[k].output][1])
            return self.load_weights(layers[k], unit.weights[k], rng)

        resident = [load_layer_weights(k) for k in range(len(layers))] if unit.resident else None
        for tile in unit.tiles:
            self._tile(unit, tile, chunk, resident, load_layer_weights)

    def _tile(self, unit: Unit, tile: Tile, chunk, resident, load_layer_weights) -> None:
        net, layers, group = self.net, unit.layers, unit.group
        n0, nn = tile.batch, tile.count
        held: dict[int, tuple[LTensor, int]] = {}  # slot -> (its tensor, first row it holds)
        for k, layer in enumerate(layers):
            for slot in (s for s in unit.slots if s.early and s.start == k):
                r0, r1 = slot.rows(group, tile)
                _, c, _, w = net.shapes[slot.tensor]
                t = LTensor(slot.addr, (nn, c, r1 - r0, w))
                if slot.loaded:
                    self.neuron(True, slot.tensor, t, n0, 0, r0)
                else:  # rows of a tensor made in this group, for a reader with shape-derived strides
                    src, first = held[id(slot.source)]
                    arith(self.em, "mul", t, src.rows(first, (r0, r1)), 1)
                held[id(slot)] = (t, r0)
            ins = []
            for i in range(len(layer.inputs)):
                t, first = held[id(unit.slot_of[(k, i)])]
                ins.append(t.rows(first, tile.reads[(layer.name, i)].rows))
            w_addr, b_addr, g_addr = resident[k] if resident is not None else load_layer_weights(k)
            o0, o1 = tile.rows[layer.output]
            oc = unit.channels(net, k)
            y = LTensor(unit.out_slot[k].addr, (nn, oc, o1 - o0, net.shapes[layer.output][3]))
            held[id(unit.out_slot[k])] = (y, o0)
            x2 = ins[1] if len(ins) > 1 else None
            buffers = LayerBuffers(ins[0], y, w_addr, b_addr, unit.scratch[k], x2, g_addr)
            KERNELS[layer.kind](self.em, layer, buffers, Window(edge_pads(net, layer, (o0, o1))), oc)
        out, _ = held[id(unit.out_slot[len(layers) - 1])]
        self.neuron(False, layers[-1].output, out, n0, chunk[0], tile.rows[group.output][0])

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
