"""npuc's calibration as a BMNet `NetCalibrationParameter`: thresholds plus the per-layer integer parameters
npuc's BM1880 lowering chose (right shifts, pool/eltwise/concat multipliers, ReLU-family scales), laid out
like the tables BMNet's calibration tool writes (specs/bm1880.md §3.1), so BMNet and npuc can share them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from npuc.compiler.ir import Graph

from .calibration import new_calibration, save_calibration
from .quantize import Layer, LoweredNet, lower


def _shifted(entry, layer: Layer) -> None:
    entry.right_shift_width = layer.rshift


def _quantized_inputs(entry, layer: Layer) -> None:
    entry.right_shift_width = layer.rshift
    entry.threshold_x_quantized.extend(layer.multipliers)


def _concat(entry, layer: Layer) -> None:
    p = entry.concat_param
    p.right_shift_width.extend(layer.shifts)
    p.threshold_x_quantized.extend(layer.multipliers)
    p.need_quantize_num = sum(1 for m, s in zip(layer.multipliers, layer.shifts) if (m, s) != (1, 0))


def _activation(entry, layer: Layer) -> None:
    (gt, le), (gt_shift, le_shift) = layer.multipliers, layer.shifts
    if layer.mode == "prelu":
        entry.prelu_param.gt_scale, entry.prelu_param.gt_right_shift_width = gt, gt_shift
        entry.prelu_param.le_right_shift_width = le_shift
    elif layer.mode == "leaky":  # BMNet keeps a leaky ReLU's scales in relu_param
        p = entry.relu_param
        p.gt_scale, p.le_scale, p.gt_right_shift_width, p.le_right_shift_width = gt, le, gt_shift, le_shift


# layer kind -> how its integer parameters appear in the table
FIELDS: dict[str, Callable] = {
    "conv": _shifted,
    "dwconv": _shifted,
    "pool": _quantized_inputs,
    "eltwise": _quantized_inputs,
    "concat": _concat,
    "act": _activation,
}


def _blob(msg, name: str, threshold: float, layer_name: str | None = None):
    entry = msg.layer.add()
    entry.name = layer_name or name
    entry.threshold_y.append(threshold)
    blob = entry.blob_param.add()
    blob.name, blob.threshold_y = name, threshold
    return entry


def table_from_net(net: LoweredNet, name: str = ""):
    """The `NetCalibrationParameter` of a lowered net (layers in program order, inputs first)."""
    msg = new_calibration(name or net.name)
    for tensor in net.inputs:
        _blob(msg, tensor, net.thresholds[tensor]).top_unsigned.append(False)
    for layer in net.layers:
        # a fused activation split back out gets internal names ("ip1#leaky" making "customized1#pre"): the
        # table uses the source names, the layer's for the pre-activation blob and the tensor's for the act
        layer_name = layer.output if "#" in layer.name else layer.name
        blob_name = layer.name if "#" in layer.output else layer.output
        entry = _blob(msg, blob_name, net.thresholds[layer.output], layer_name)
        FIELDS.get(layer.kind, lambda e, lay: None)(entry, layer)
        entry.bottom_unsigned.extend([False] * len(layer.inputs))
        entry.top_unsigned.append(False)
    return msg


def export_bmnet_table(graph: Graph, thresholds: dict[str, float], path: Path,
                       table_names: dict[str, str] | None = None) -> None:  # fmt: skip
    """Lower `graph` with `thresholds` for the BM1880 and write the BMNet table (.pb2 binary, else text)."""
    net = lower(graph, thresholds, table_names)
    save_calibration(table_from_net(net, graph.name), path)


def write_bmnet_table(model: Path, table: Any, shapes: dict, path: Path) -> None:
    """BMNet's NetCalibrationParameter: the thresholds plus the shifts and multipliers the bm1880 lowering picks."""
    import onnx

    from npuc.frontends.onnx import import_onnx
    from npuc.passes.calibration.calibrate import tensor_table_names
    from npuc.passes.rewrite.canonicalize import canonicalize

    graph = import_onnx(model, shapes or None, [])
    canonicalize(graph)
    names = tensor_table_names(onnx.load(str(model), load_external_data=False))
    export_bmnet_table(graph, table.thresholds(), path, names)
