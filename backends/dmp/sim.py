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
from .layout import whc8_encode
from .sim_cpu import CPU_LAYER_KERNELS
from .sim_memory import Memory
from .sim_memory import f16 as _f16
from .validate import check_layer, hardware_from_options, layer_output_dims, run_input_dims, run_output_dims

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


LAYER_KERNELS: dict[str, Callable[[Layer, Memory, np.ndarray, Network], None]] = {
    "LT_CONV": _conv_layer,
    "LT_CONCAT": _concat,
    **CPU_LAYER_KERNELS,
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
