"""Layers a calibration keeps in float by experience, as tpu-mlir's does after its statistics (specs/quant.md
§1.1: a pattern-match qtable for YOLO v5-v12 post-processing).

Each pattern finds op names in the canonical IR; `npuc calibrate` writes them into `<table>.qtable`, which the
build reads. Registry: add a function to PATTERNS.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

from npuc.compiler.ir import Graph, Op


def _flattened_level(graph: Graph, producers: dict[str, Op], name: str) -> tuple[int, ...] | None:
    """The spatial size of the NCHW feature map `name` was reshaped from into (N, C, H*W), else None."""
    op = producers.get(name)
    if op is None or op.kind != "reshape" or len(graph.shape(name)) != 3 or len(graph.shape(op.inputs[0])) != 4:
        return None
    return tuple(graph.shape(op.inputs[0])[2:])


def detection_decode(graph: Graph) -> list[str]:
    """A detector's decode: from the concat that joins the flattened outputs of feature maps of several sizes
    (YOLOv8's per-level boxes and scores) to the graph outputs. Boxes in pixels and scores in 0..1 meet in one
    tensor there, and int8's single scale zeroes the scores (YOLOv8n: output cosine 0.89 -> 0.999). Each
    level's concat of box-distribution and class logits and the last convs making them go too: the DFL
    softmax reads the box logits (YOLOv8n's face box, default calibration: IoU 0.82 -> 0.91)."""
    producers, consumers = graph.producers(), graph.consumers()
    start = next(
        (
            op
            for op in graph.ops
            if op.kind == "concat"
            and len(op.inputs) >= 2
            and None not in (levels := [_flattened_level(graph, producers, n) for n in op.inputs])
            and len(set(levels)) >= 2
        ),
        None,
    )
    if start is None:
        return []
    reached, frontier = {start.name}, [start]
    for name in start.inputs:  # each level: its reshape, the concat joining box and class maps, their last convs
        reshape = producers[name]
        joined = producers.get(reshape.inputs[0])
        reached.add(reshape.name)
        if joined is not None and joined.kind == "concat":
            reached.add(joined.name)
            reached.update(producers[n].name for n in joined.inputs if n in producers and producers[n].kind == "conv2d")
    while frontier:
        for out in frontier.pop().outputs:
            for user in consumers.get(out, []):
                if user.name not in reached:
                    reached.add(user.name)
                    frontier.append(user)
    return [op.name for op in graph.ops if op.name in reached]


MOVES = ("reshape", "transpose", "concat", "slice", "split")  # ops that pass values through unchanged


def probability_outputs(graph: Graph) -> list[str]:
    """Sigmoids whose values reach a graph output unchanged (through reshapes, transposes, concats): score
    heads of detectors and segmenters, and the ops after them. Their outputs are mostly near 0, where one int8
    step of 1/127 is larger than the value (PicoDet's class scores, PP-OCR's text probability map)."""
    producers, consumers = graph.producers(), graph.consumers()
    kept: list[Op] = []
    for out in graph.outputs:
        chain, frontier = [], [producers.get(out)]
        while frontier:
            op = frontier.pop()
            if op is None or op in chain:
                continue
            if op.kind in MOVES:
                chain.append(op)
                frontier += [producers.get(n) for n in op.inputs if n]
            elif op.kind == "activation" and op.attrs.act.kind == "sigmoid":
                chain.append(op)
                kept.append(op)
        kept += [op for op in chain if op.kind in MOVES and _only_from(op, kept, producers, consumers)]
    names = {op.name for op in kept}
    return [op.name for op in graph.ops if op.name in names]


def _only_from(op: Op, sigmoids: list[Op], producers: dict[str, Op], consumers: dict[str, list[Op]]) -> bool:
    """Whether a value-moving op carries only what those sigmoids made (directly or through moves)."""
    made = {out for s in sigmoids for out in s.outputs}
    pending, seen = list(op.inputs), set()
    while pending:
        name = pending.pop()
        if name in made or name in seen:
            continue
        seen.add(name)
        src = producers.get(name)
        if src is None or src.kind not in MOVES:
            return False
        pending += [n for n in src.inputs if n]
    return True


PATTERNS: MappingProxyType[str, Callable[[Graph], list[str]]] = MappingProxyType(
    {"detection decode": detection_decode, "probability output": probability_outputs}
)


def pattern_layers(graph: Graph) -> dict[str, list[str]]:
    """Pattern name -> the op names it keeps in float (patterns that found nothing left out)."""
    found = {name: fn(graph) for name, fn in PATTERNS.items()}
    return {name: layers for name, layers in found.items() if layers}
