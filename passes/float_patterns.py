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
    tensor there, and int8's single scale zeroes the scores (YOLOv8n: output cosine 0.89 -> 0.999)."""
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
    while frontier:
        for out in frontier.pop().outputs:
            for user in consumers.get(out, []):
                if user.name not in reached:
                    reached.add(user.name)
                    frontier.append(user)
    return [op.name for op in graph.ops if op.name in reached]


PATTERNS: MappingProxyType[str, Callable[[Graph], list[str]]] = MappingProxyType({"detection decode": detection_decode})


def pattern_layers(graph: Graph) -> dict[str, list[str]]:
    """Pattern name -> the op names it keeps in float (patterns that found nothing left out)."""
    found = {name: fn(graph) for name, fn in PATTERNS.items()}
    return {name: layers for name, layers in found.items() if layers}
