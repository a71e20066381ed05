"""Execute a DV700 layer table from its bytes: the io buffer is a byte array, weights are decoded from the
`.bin` at each run's offset, activations are fp16 in the WHC8 layout (CPU layers as the runtime does them).

Arithmetic: float32 accumulation, rounded to fp16 after each stage of a run ([conv]→[add]→[pool]→[act]).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.kernels.activation import apply_activation
from npuc.compiler.kernels.conv import conv2d_nchw, pad_hw, windows
from npuc.compiler.kernels.elementwise import softmax
from npuc.compiler.ops import Activation

from . import weights as wpack
from .layers import (
    ACT_ELU,
    ACT_LEAKY,
    ACT_PRELU,
    ACT_RELU6,
    ACT_SIGMOID,
    ACT_TANH,
    CONV_DECONV_BIT,
    CONV_DW_BIT,
    CONV_OFF,
    POOL_AVG,
    POOL_MAX,
    POOL_UPSAMPLE,
    TRANSPOSED_WEIGHTS,
    WFMT_8BIT,
    Layer,
    Network,
    Run,
    TensorBinding,
    kernel_wh,
    unpack2,
    unpack4,
)
from .layout import whc8_decode, whc8_encode
from .validate import check_layer, hardware_from_options, layer_output_dims, run_input_dims, run_output_dims

MAX_IO_BYTES = 1 << 30  # the boards carry 1-2 GiB of DRAM for everything; no io buffer comes near it


def _f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


class Memory:
    """The io buffer with bounds-checked typed views."""

    def __init__(self, size: int) -> None:
        if not 0 <= size <= MAX_IO_BYTES:
            raise CorruptFileError(
                f"io size {size} is out of range (a DV700 io buffer holds at most {MAX_IO_BYTES}); regenerate it"
            )
        self.data = np.zeros(size, np.uint8)

    def read(self, offs: int, count: int, dtype: str) -> np.ndarray:
        n = count * np.dtype(dtype).itemsize
        if offs < 0 or offs + n > self.data.size:
            raise CorruptFileError(f"io read [{offs}, {offs + n}) is outside the {self.data.size}-byte io buffer")
        return self.data[offs : offs + n].view(dtype).copy()

    def write(self, offs: int, values: np.ndarray) -> None:
        raw = np.ascontiguousarray(values).view(np.uint8).reshape(-1)
        if offs < 0 or offs + raw.size > self.data.size:
            raise CorruptFileError(
                f"io write [{offs}, {offs + raw.size}) is outside the {self.data.size}-byte io buffer"
            )
        self.data[offs : offs + raw.size] = raw

    def read_hwc(self, offs: int, dims: list[int] | tuple[int, ...], whc8: bool, dtype: str = "float16") -> np.ndarray:
        w, h, c = dims
        flat = self.read(offs, w * h * c, dtype)
        return whc8_decode(flat, w, h, c) if whc8 else flat.reshape(h, w, c)


# ---------------------------------------------------------------------------------------------------------
# conv runs
# ---------------------------------------------------------------------------------------------------------


def _run_weights(run: Run, c: int, blob: np.ndarray, transposed: bool) -> wpack.PackedConv:
    kw, kh = kernel_wh(run.p)
    cg = 1 if run.conv_enable & CONV_DW_BIT else c
    if run.weight_offs + run.weight_size > blob.size or run.weight_offs % 16:
        raise CorruptFileError(
            f"run weights at offset {run.weight_offs} (+{run.weight_size}) are outside the {blob.size}-byte "
            "weights file or not 16-byte aligned"
        )
    return wpack.unpack_conv(
        blob[run.weight_offs : run.weight_offs + run.weight_size],
        run.m,
        cg,
        kh,
        kw,
        quantized=run.weight_fmt == WFMT_8BIT,
        prelu=run.actfunc == ACT_PRELU,
        dilated=run.conv_dilation != 0,
        transposed=transposed,
    )


ACTIVATIONS: dict[int, Callable[[np.ndarray, Run, wpack.PackedConv | None], np.ndarray]] = {
    ACT_TANH: lambda x, r, w: np.tanh(x),
    ACT_SIGMOID: lambda x, r, w: apply_activation(x, Activation("sigmoid")),
    ACT_LEAKY: lambda x, r, w: np.where(x >= 0, x, x * np.float32(np.uint16(r.actfunc_param).view(np.float16))),
    ACT_ELU: lambda x, r, w: apply_activation(x, Activation("elu", alpha=1.0)),
    ACT_RELU6: lambda x, r, w: np.clip(x, 0, 6),
    ACT_PRELU: lambda x, r, w: np.where(x >= 0, x, x * w.prelu.reshape(1, -1, 1, 1)),
}


def _pool(x: np.ndarray, run: Run) -> np.ndarray:
    if run.pool_enable == POOL_UPSAMPLE:
        return x.repeat(2, axis=2).repeat(2, axis=3)
    kw, kh = unpack2(run.pool_size)
    sx, sy = unpack2(run.pool_stride)
    left, right, top, bottom = unpack4(run.pool_pad)
    if run.pool_enable == POOL_MAX:
        return windows(pad_hw(x, (top, left, bottom, right), -np.inf), (kh, kw), (sy, sx), (1, 1)).max(axis=(4, 5))
    total = windows(pad_hw(x, (top, left, bottom, right)), (kh, kw), (sy, sx), (1, 1)).sum(axis=(4, 5))
    return total * np.float32(np.uint16(run.pool_avg_param).view(np.float16))


def _spread(x: np.ndarray, sx: int, sy: int) -> np.ndarray:
    """x with (stride - 1) zeros inserted between neighbouring pixels, as a deconvolution reads it."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, (h - 1) * sy + 1, (w - 1) * sx + 1), x.dtype)
    out[:, :, ::sy, ::sx] = x
    return out


def execute_run(
    x: np.ndarray, run: Run, blob: np.ndarray, eltwise: np.ndarray | None, transposed: bool = False
) -> np.ndarray:
    """One run on an NCHW float32 array (fp16 values)."""
    packed = None
    if run.conv_enable != CONV_OFF:
        c = x.shape[1]
        packed = _run_weights(run, c, blob, transposed)
        kw, kh = kernel_wh(run.p)
        sx, sy = unpack2(run.conv_stride)
        dx, dy = unpack2(run.conv_dilation) if run.conv_dilation else (1, 1)
        left, right, top, bottom = unpack4(run.conv_pad)
        group = c if run.conv_enable & CONV_DW_BIT else 1
        if run.conv_enable & CONV_DECONV_BIT:  # stride spreads the input (zeros between pixels); conv at stride 1
            x, sx, sy = _spread(x, sx, sy), 1, 1
        x = conv2d_nchw(x, packed.weight, (sy, sx), (top, left, bottom, right), (dy, dx), group)
        x = _f16(x + packed.bias.reshape(1, -1, 1, 1))
    if eltwise is not None:
        x = _f16(x + eltwise) if run.pool_enable != POOL_AVG else x
    if run.pool_enable:
        x = _f16(_pool(x, run))
        if eltwise is not None and run.pool_enable == POOL_AVG:  # [avg_pool]→[add]→[act]
            x = _f16(x + eltwise)
    if run.actfunc:
        if run.actfunc not in ACTIVATIONS:
            raise CorruptFileError(f"run has unknown actfunc {run.actfunc}; regenerate the output")
        x = _f16(ACTIVATIONS[run.actfunc](x, run, packed))
    return x


def _conv_layer(layer: Layer, mem: Memory, blob: np.ndarray, net: Network) -> None:
    conf = layer.conv
    dims = (conf.w, conf.h, conf.c)
    if conf.u8tofp16_offs is not None:
        raw = mem.read_hwc(layer.input_offs, dims, True, "uint8").astype(np.intp)
        table = blob[conf.u8tofp16_offs : conf.u8tofp16_offs + 6 * 256]
        if table.size != 6 * 256:
            raise CorruptFileError(f"u8→fp16 table at {conf.u8tofp16_offs} is outside the weights file")
        lut = table.view(np.float16).astype(np.float32).reshape(3, 256)
        order = np.arange(conf.c)[::-1] if conf.to_bgr else np.arange(conf.c)
        hwc = lut[np.arange(conf.c)[None, None, :], raw[..., order]]
    else:
        hwc = mem.read_hwc(layer.input_offs, dims, True)
    out_dims = layer_output_dims(conf)
    if list(out_dims) != list(layer.output_dim[-3:]) and int(np.prod(out_dims)) != int(np.prod(layer.output_dim)):
        raise CorruptFileError(f"layer '{layer.name}' computes {out_dims} but declares output {layer.output_dim}")
    layer_input = hwc.astype(np.float32).transpose(2, 0, 1)[None]
    x, written = layer_input, 0
    in_dims = run_input_dims(conf)
    # bit 15 of input_circular_offset: this command's panels hold the kernels with kx and ky exchanged
    transposed = bool(conf.input_circular_offset & TRANSPOSED_WEIGHTS)
    for r, run in enumerate(conf.runs):
        out_dims = run_output_dims(run, in_dims[r])
        eltwise = None
        if conf.output_mode == 1 and conf.eltwise_offs is not None and r == len(conf.runs) - 1:
            eltwise = mem.read_hwc(conf.eltwise_offs, out_dims, True).astype(np.float32).transpose(2, 0, 1)[None]
        x = execute_run(x, run, blob, eltwise, transposed)
        if conf.topo >> r & 1:  # to memory: this branch's output follows the previous ones; restart from input
            data = whc8_encode(x[0].transpose(1, 2, 0).astype(np.float16))
            mem.write(layer.output_offs + written, data)
            written += data.nbytes
            x = layer_input


def _concat(layer: Layer, mem: Memory, blob: np.ndarray, net: Network) -> None:
    """LT_CONCAT does nothing at run time: its inputs must already sit side by side in its output region."""
    offs = layer.output_offs
    for j in layer.input_layers:
        if not 0 <= j < len(net.layers):
            raise CorruptFileError(f"concat '{layer.name}' names input layer {j}, which does not exist")
        src = net.layers[j]
        if src.output_offs != offs:
            raise CorruptFileError(
                f"concat '{layer.name}': input layer {j} writes at {src.output_offs}, not at {offs} beside the "
                "previous input; regenerate the output"
            )
        offs += src.output_size
    if offs - layer.output_offs != layer.output_size:
        raise CorruptFileError(f"concat '{layer.name}': inputs cover {offs - layer.output_offs} of its "
                               f"{layer.output_size} bytes; regenerate the output")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# CPU layers
# ---------------------------------------------------------------------------------------------------------


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
        mem.write(layer.output_offs, _f16(fn(x, layer.custom_params)).astype(np.float16))

    return kernel


def _channel_mul(layer: Layer, mem: Memory) -> None:
    w, h, c = _dims3(layer)
    offs = layer.custom_params.get("scale_offs")
    if not isinstance(offs, int):
        raise CorruptFileError(f"channel_mul '{layer.name}' has no integer scale_offs parameter")
    x = mem.read_hwc(layer.input_offs, (w, h, c), layer.is_input_hw_layout).astype(np.float32)
    scale = mem.read(offs, c, "float16").astype(np.float32)
    y = _f16(x * scale).astype(np.float16)
    mem.write(layer.output_offs, whc8_encode(y) if layer.is_input_hw_layout else y.reshape(-1))


CUSTOM_LAYERS: dict[str, Callable[[Layer, Memory], None]] = {
    "hard_swish": _elementwise(lambda x, p: apply_activation(x, Activation("hard_swish"))),
    "hard_sigmoid": _elementwise(
        lambda x, p: apply_activation(x, Activation("hard_sigmoid", alpha=p["alpha"], beta=p["beta"]))
    ),
    "gelu": _elementwise(lambda x, p: apply_activation(x, Activation("gelu"))),
    "erf": _elementwise(lambda x, p: apply_activation(x, Activation("erf"))),
    "channel_mul": _channel_mul,
}


def _custom(layer: Layer, mem: Memory, blob: np.ndarray, net: Network) -> None:
    kernel = CUSTOM_LAYERS.get(layer.custom_type or "")
    if kernel is None:
        raise UserError(f"custom layer '{layer.name}' has type {layer.custom_type!r}, which npuc cannot simulate")
    try:
        kernel(layer, mem)
    except KeyError as exc:
        raise CorruptFileError(f"custom layer '{layer.name}' lacks parameter {exc}") from None


LAYER_KERNELS: dict[str, Callable[[Layer, Memory, np.ndarray, Network], None]] = {
    "LT_CONV": _conv_layer,
    "LT_FLATTEN": _flatten,
    "LT_SOFTMAX": _softmax,
    "LT_CONCAT": _concat,
    "LT_COPY_CONCAT": _copy_concat,
    "LT_CUSTOM": _custom,
}


# ---------------------------------------------------------------------------------------------------------
# network
# ---------------------------------------------------------------------------------------------------------


def _feed_to_hwc(binding: TensorBinding, value: np.ndarray) -> np.ndarray:
    arr = np.asarray(value)
    if list(arr.shape) != binding.shape:
        raise UserError(f"input '{binding.name}': expected shape {binding.shape}, given {list(arr.shape)}")
    hwc = arr[0] if binding.view == "nhwc" else arr[0].transpose(1, 2, 0)
    if binding.layout == "u8":
        if arr.dtype != np.uint8:
            raise UserError(f"input '{binding.name}' takes uint8 pixels (built with an input conversion table)")
        return whc8_encode(hwc)
    return whc8_encode(np.asarray(hwc, np.float32).astype(np.float16))


def _output_from_buffer(binding: TensorBinding, mem: Memory) -> np.ndarray:
    hwc = mem.read_hwc(binding.offs, binding.dims, binding.layout == "whc8", binding.dtype).astype(np.float32)
    if binding.view == "nchw":
        out = hwc.transpose(2, 0, 1)
    elif binding.view == "nhwc":
        out = hwc
    else:
        flat = hwc.reshape(-1)
        out = flat[np.asarray(binding.perm)] if binding.perm is not None else flat
    if out.size != int(np.prod(binding.shape)):
        raise CorruptFileError(f"output '{binding.name}' holds {out.size} values but its shape is {binding.shape}")
    return np.ascontiguousarray(out.reshape(binding.shape))


def run_network(net: Network, blob: bytes, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of `net` (decoded from `blob`, the weights file) for `feeds`, as float32 arrays."""
    weights = np.frombuffer(blob, np.uint8)
    if weights.size != net.weights_size:
        raise CorruptFileError(
            f"weights file has {weights.size} bytes but the layer table reserves {net.weights_size}; "
            "the .bin and the table do not belong together"
        )
    hw = hardware_from_options(net.hardware)
    for i, layer in enumerate(net.layers):
        check_layer(i, layer, hw)
    mem = Memory(net.io_size)
    for binding in net.inputs:
        if binding.name not in feeds:
            raise UserError(f"input '{binding.name}' has no feed; pass an array of shape {binding.shape}")
        mem.write(binding.offs, _feed_to_hwc(binding, feeds[binding.name]))
    for layer in net.layers:
        kernel = LAYER_KERNELS.get(layer.type)
        if kernel is None:
            raise UserError(f"layer '{layer.name}' has type {layer.type}, which npuc's DMP simulator does not run")
        kernel(layer, mem, weights, net)
    return {b.name: _output_from_buffer(b, mem) for b in net.outputs}
