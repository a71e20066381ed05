"""Convs whose filters stream through a one-tile CV18xx layer group instead of staying resident.

A group computed in one tile (every row at once, batch 1) reads each filter once, so the filters need not all
sit in local memory for the whole group: each conv's filters pass through two alternating chunk buffers, a
whole number of lanes' worth of output channels at a time, chunk i + 1 loading while chunk i convolves
(reorder.py moves the loads up). group_plan.py places the buffers (taken while the op before runs, so the first
chunk loads under it); group.py emits `emit_streamed_conv` in the op's place. That keeps resnet18's 14x14 and
7x7 stages, whose 3x3 filters take up to twice a lane, in local memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuc.backends.cv18xx import dma, tiu
from npuc.backends.cv18xx.codegen import Codegen, fused_relu, quant_of
from npuc.backends.cv18xx.kernels.conv import ConvParams, conv_weights
from npuc.backends.cv18xx.kernels.group_ops import conv_geometry, tile_window
from npuc.backends.cv18xx.lmem import ESIZE, LTensor, Resident, channel_view, local_bytes, local_strides
from npuc.backends.cv18xx.timing import TDMA_BYTES_PER_CYCLE, TDMA_SETUP_CYCLES, TIU_SETUP_CYCLES
from npuc.compiler.ir import Op
from npuc.passes.lowering.layer_group import Read

STREAM_SET_SHARE = 8  # a streamed conv's chunk buffers (one set of two) take at most 1/8 of a lane


@dataclass(frozen=True)
class ConvStream:
    """A conv of a one-tile group (every row at once, so each filter is read once) whose filters do not stay
    resident: they pass through two alternating buffer sets in chunks of output channels (a whole number of
    lanes each), so chunk i + 1 loads while chunk i convolves. int8 per-channel records stay resident (small);
    bf16 bias planes come with each chunk (the TIU finds the low plane one chunk-sized plane after the high)."""

    chunks: tuple[tuple[int, int], ...]
    filter_shape: tuple[int, int, int, int]  # the largest chunk's (1, oc, kh*kw, ic)
    planes_shape: tuple[int, int, int, int] | None  # its bf16 bias planes (2, oc, 1, 1)
    fmt: str

    def set_bytes(self, cg: Codegen) -> int:
        planes = 0 if self.planes_shape is None else local_bytes(cg.chip, self.planes_shape, self.fmt, False)
        return local_bytes(cg.chip, self.filter_shape, self.fmt, False) + planes

    def copies(self) -> int:
        return 2 if len(self.chunks) > 1 else 1


def conv_stream(cg: Codegen, op: Op) -> ConvStream | None:
    """How `op`'s filters stream: the most lanes' worth of output channels per chunk whose buffer set takes at
    most 1/STREAM_SET_SHARE of a lane. None for a depthwise or grouped conv, or when one lane's worth of
    channels takes more than a quarter of a lane."""
    if op.kind != "conv2d" or op.attrs.group != 1:
        return None
    bf16 = quant_of(op).mode == "bf16"
    fmt = "bf16" if bf16 else "i8"
    oc, ic, kh, kw = cg.graph.tensors[op.inputs[1]].shape
    has_bias = len(op.inputs) > 2 and bool(op.inputs[2])
    lanes, lmem = cg.chip.lanes, cg.chip.lmem_size

    def shape_of(t: int) -> ConvStream:
        planes = (2, t, 1, 1) if bf16 and has_bias else None
        chunks = tuple((o0, min(oc, o0 + t)) for o0 in range(0, oc, t))
        return ConvStream(chunks, (1, t, kh * kw, ic), planes, fmt)

    one = shape_of(min(oc, lanes))
    if one.set_bytes(cg) > lmem // 4:
        return None
    t = min(oc, lanes)
    while t < oc and shape_of(min(oc, t + lanes)).set_bytes(cg) <= lmem // STREAM_SET_SHARE:
        t = min(oc, t + lanes)
    # a chunk must compute at least as long as the next one loads, else the TIU waits for every chunk (a 1x1
    # conv over a 1x1 map is all filter traffic: its own kernel loads fewer, larger tiles, earlier)
    _, _, oh, ow = cg.graph.shape(op.outputs[0])
    per_cycle = cg.chip.eu_bytes // ESIZE[fmt]
    compute = TIU_SETUP_CYCLES + -(-t // lanes) * oh * ow * kh * kw * ic // per_cycle
    load = TDMA_SETUP_CYCLES + t * kh * kw * ic * ESIZE[fmt] // TDMA_BYTES_PER_CYCLE
    return shape_of(t) if compute >= load else None


def streamed_resident(cg: Codegen, op: Op) -> list[Resident]:
    """What a streamed conv keeps resident: the int8 per-channel records (bf16 planes stream with the chunks)."""
    if quant_of(op).mode == "bf16":
        return []
    oc = cg.graph.tensors[op.inputs[1]].shape[0]
    has_bias = len(op.inputs) > 2 and bool(op.inputs[2])
    return [Resident((1, oc, 1, 9 if has_bias else 5), "i8", False, lambda: ConvParams(cg, op, oc, False).g)]


def emit_streamed_conv(cg: Codegen, op: Op, out: LTensor, ins: list[LTensor], reads: list[Read],
                       res: list[LTensor], stream: ConvStream, addr: int) -> None:  # fmt: skip
    """`op` over one tile, chunk by chunk: load the chunk's filters (and bf16 planes) into buffer set i % 2
    at `addr`, convolve into the chunk's channels of `out`. The loads are emitted right before their chunk;
    reorder.py moves each up under the previous chunk (or the previous op, whose memory the first set avoids)."""
    s, chip = cg.stream, cg.chip
    bf16 = stream.fmt == "bf16"
    has_bias = len(op.inputs) > 2 and bool(op.inputs[2])
    relu, relu_max = fused_relu(op)
    win = tile_window(conv_geometry(cg, op), reads[0])
    filters = conv_weights(cg, op, bf16, False)
    params = ConvParams(cg, op, out.shape[1], True) if bf16 and has_bias else None
    set_bytes = stream.set_bytes(cg)
    for i, (o0, o1) in enumerate(stream.chunks):
        base = addr + (i % 2) * set_bytes
        shape = (1, o1 - o0, *stream.filter_shape[2:])
        lw = LTensor(base, shape, stream.fmt, local_strides(chip, shape, stream.fmt, False))
        dma.load(s, filters.slice(c=(o0, o1)).place(), lw)
        lp = None
        if params is not None:
            planes = params.tile(o0, o1)
            at = base + local_bytes(chip, stream.filter_shape, stream.fmt, False)
            lp = LTensor(at, planes.shape, planes.fmt, local_strides(chip, planes.shape, planes.fmt, False))
            dma.load(s, planes, lp)
        elif not bf16:
            lp = channel_view(chip, res[0], o0, o1)
        part = channel_view(chip, out, o0, o1)
        s.tiu(tiu.conv(part, ins[0], lw, lp, win, relu, has_bias))
        if relu_max is not None:
            s.tiu(tiu.minimum(part, part, relu_max))
