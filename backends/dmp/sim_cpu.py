"""The CPU layers of a DV700 layer table, as the runtime (flatten, softmax, copy concat) and npuc's custom
layer callbacks compute them, on the simulated io buffer."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.kernels.activation import apply_activation
from npuc.compiler.kernels.elementwise import softmax
from npuc.compiler.ops import Activation

from .decode import yolo_decode
from .layers import Layer, Network
from .layout import whc8_encode
from .sim_memory import Memory, f16


def _dims3(layer: Layer) -> list[int]:
    if len(layer.input_dim) != 3:
        raise CorruptFileError(f"layer '{layer.name}' input_dim {layer.input_dim} is not (W, H, C)")
    return layer.input_dim


def _flatten(layer: Layer, mem: Memory, blob: np.ndarray, net: Network) -> None:
    x = mem.read_hwc(layer.input_offs, _dims3(layer), layer.is_input_hw_layout)
    mem.write(layer.output_offs, x.reshape(-1))


def _softmax(layer: Layer, mem: Memory, blob: np.ndarray, net: Network) -> None:
    x = mem.read_hwc(layer.input_offs, _dims3(layer), layer.is_input_hw_layout).astype(np.float32)
    mem.write(layer.output_offs, softmax(x, -1).astype(np.float32).reshape(-1))


def _copy_concat(layer: Layer, mem: Memory, blob: np.ndarray, net: Network) -> None:
    parts = []
    for j in layer.input_layers:
        if not 0 <= j < len(net.layers):
            raise CorruptFileError(f"concat '{layer.name}' names input layer {j}, which does not exist")
        src = net.layers[j]
        parts.append(mem.read_hwc(src.output_offs, src.output_dim, True))
    mem.write(layer.output_offs, whc8_encode(np.concatenate(parts, axis=2)))


def _elementwise(fn: Callable[[np.ndarray, dict], np.ndarray]) -> Callable:
    def kernel(layer: Layer, mem: Memory) -> None:
        w, h, c = _dims3(layer)
        x = mem.read(layer.input_offs, w * h * c, "float16").astype(np.float32)
        mem.write(layer.output_offs, f16(fn(x, layer.custom_params)).astype(np.float16))

    return kernel


def _channel_mul(layer: Layer, mem: Memory) -> None:
    w, h, c = _dims3(layer)
    offs = layer.custom_params.get("scale_offs")
    if not isinstance(offs, int):
        raise CorruptFileError(f"channel_mul '{layer.name}' has no integer scale_offs parameter")
    x = mem.read_hwc(layer.input_offs, (w, h, c), layer.is_input_hw_layout).astype(np.float32)
    scale = mem.read(offs, c, "float16").astype(np.float32)
    y = f16(x * scale).astype(np.float16)
    mem.write(layer.output_offs, whc8_encode(y) if layer.is_input_hw_layout else y.reshape(-1))


def _yolo_decode(layer: Layer, mem: Memory) -> None:
    """The head outputs of every level (WHC8 fp16 at level<k>_offs) decoded into (4 + classes, N) fp32."""
    p = layer.custom_params
    levels = [(int(p[f"w{k}"]), int(p[f"h{k}"]), int(p[f"stride{k}"])) for k in range(int(p["levels"]))]
    c = _dims3(layer)[2]
    rows = []
    for k, (w, h, _) in enumerate(levels):
        offs = p[f"level{k}_offs"]
        if not isinstance(offs, int):
            raise CorruptFileError(f"yolo_decode '{layer.name}' has no integer level{k}_offs parameter")
        hwc = mem.read_hwc(offs, (w, h, c), True).astype(np.float32)
        rows.append(hwc.reshape(h * w, c).T)
    out = yolo_decode(np.concatenate(rows, axis=1), levels, int(p["reg_max"]), bool(p["sigmoid"]))
    if out.size != int(np.prod(layer.output_dim)):
        raise CorruptFileError(f"yolo_decode '{layer.name}' makes {out.size} values, not {layer.output_dim}")
    mem.write(layer.output_offs, out.reshape(-1))


CUSTOM_LAYERS: dict[str, Callable[[Layer, Memory], None]] = {
    "hard_swish": _elementwise(lambda x, p: apply_activation(x, Activation("hard_swish"))),
    "hard_sigmoid": _elementwise(
        lambda x, p: apply_activation(x, Activation("hard_sigmoid", alpha=p["alpha"], beta=p["beta"]))
    ),
    "silu": _elementwise(lambda x, p: x * apply_activation(x, Activation("sigmoid"))),
    "gelu": _elementwise(lambda x, p: apply_activation(x, Activation("gelu"))),
    "erf": _elementwise(lambda x, p: apply_activation(x, Activation("erf"))),
    "channel_mul": _channel_mul,
    "yolo_decode": _yolo_decode,
}


def _custom(layer: Layer, mem: Memory, blob: np.ndarray, net: Network) -> None:
    kernel = CUSTOM_LAYERS.get(layer.custom_type or "")
    if kernel is None:
        raise UserError(f"custom layer '{layer.name}' has type {layer.custom_type!r}, which npuc cannot simulate")
    try:
        kernel(layer, mem)
    except KeyError as exc:
        raise CorruptFileError(f"custom layer '{layer.name}' lacks parameter {exc}") from None


CPU_LAYER_KERNELS: dict[str, Callable[[Layer, Memory, np.ndarray, Network], None]] = {
    "LT_FLATTEN": _flatten,
    "LT_SOFTMAX": _softmax,
    "LT_COPY_CONCAT": _copy_concat,
    "LT_CUSTOM": _custom,
}
