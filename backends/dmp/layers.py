"""The DV700 layer table (`fpga_layer` entries and their conv commands) as records, with one field table per
struct that drives the JSON twin (both ways) and the generated C++ comments.

Field values are stored exactly as the C++ writes them (packed bit fields included); `pack2`/`pack4` and
`unpack2`/`unpack4` convert between tuples and the packed forms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LAYER_TYPES = ("LT_INPUT", "LT_CONV", "LT_FC", "LT_FLATTEN", "LT_CONCAT", "LT_COPY_CONCAT", "LT_SOFTMAX", "LT_CUSTOM")
MAX_RUNS = 32

# conv_enable / pool_enable / weight_fmt / actfunc codes (spec §1.3)
CONV_OFF, CONV_ON, CONV_DEPTHWISE, CONV_DECONV, CONV_DEPTHWISE_DECONV = 0, 1, 3, 5, 7
CONV_DW_BIT, CONV_DECONV_BIT = 2, 4  # conv_enable flag bits
POOL_OFF, POOL_MAX, POOL_AVG, POOL_UPSAMPLE = 0, 1, 2, 4
WFMT_NONE, WFMT_FP16, WFMT_8BIT = 0, 1, 3
TRANSPOSED_WEIGHTS = 0x8000  # input_circular_offset of every conv when the kernels are stored transposed
ACT_NONE, ACT_TANH, ACT_LEAKY, ACT_SIGMOID, ACT_PRELU, ACT_ELU, ACT_RELU6 = range(7)
ACT_NAMES = {0: "none", 1: "tanh", 2: "leaky_relu", 3: "sigmoid", 4: "prelu", 5: "elu", 6: "relu6"}


def pack2(lo: int, hi: int) -> int:
    """Two 8-bit fields: [7:0] = lo, [15:8] = hi (kernel w/h, strides x/y, dilation x/y, pool size)."""
    return (int(lo) & 0xFF) | (int(hi) & 0xFF) << 8


def unpack2(v: int) -> tuple[int, int]:
    return v & 0xFF, (v >> 8) & 0xFF


def pack4(left: int, right: int, top: int, bottom: int) -> int:
    """Pads: left [7:0], right [15:8], top [23:16], bottom [31:24]."""
    return (left & 0xFF) | (right & 0xFF) << 8 | (top & 0xFF) << 16 | (bottom & 0xFF) << 24


def unpack4(v: int) -> tuple[int, int, int, int]:
    return v & 0xFF, (v >> 8) & 0xFF, (v >> 16) & 0xFF, (v >> 24) & 0xFF


def kernel_wh(p: int) -> tuple[int, int]:
    """The `p` field: width [7:0], height [15:8], height 0 meaning square."""
    w, h = unpack2(p)
    return w, h or w


@dataclass(frozen=True)
class Field:
    name: str
    ctype: str
    comment: str
    hexed: bool = False  # written as 0x.. in C++ (packed fields)


RUN_FIELDS: tuple[Field, ...] = (
    Field("m", "uint16", "Output Channels"),
    Field("conv_enable", "uint16", "0 = off, 1 = conv, 3 = depthwise, 5 = deconv, 7 = depthwise deconv"),
    Field("p", "uint16", "Filter Width [7:0] and Height [15:8] (0 = square)", True),
    Field("pz", "uint16", "Filter Depth"),
    Field("weight_fmt", "uint16", "Weight format (0 = none, 1 = fp16 stream, 3 = 8-bit quantized stream)"),
    Field("conv_pad", "uint32", "bits [7:0] = left, [15:8] = right, [23:16] = top, [31:24] = bottom padding", True),
    Field("conv_stride", "uint16", "bits [7:0] = X stride, bits [15:8] = Y stride", True),
    Field("conv_dilation", "uint16", "bits [7:0] = X dilation, bits [15:8] = Y dilation (0 = not dilated)", True),
    Field("pool_enable", "uint16", "0 = disabled, 1 = max pooling, 2 = average pooling, 4 = upsampling"),
    Field("pool_size", "uint16", "bits [7:0] = width, bits [15:8] = height", True),
    Field("pool_stride", "uint16", "bits [7:0] = X stride, bits [15:8] = Y stride", True),
    Field("pool_pad", "uint32", "bits [7:0] = left, [15:8] = right, [23:16] = top, [31:24] = bottom padding", True),
    Field("pool_avg_param", "uint16", "FP16 multiplier of average pooling, usually 1/(kx*ky)", True),
    Field("actfunc", "uint16", "0 = None, 1 = Tanh, 2 = Leaky ReLU, 3 = Sigmoid, 4 = PReLU, 5 = ELU, 6 = ReLU6"),
    Field("actfunc_param", "uint16", "FP16 Leaky ReLU slope (0x2E66 = 0.1)", True),
    Field("rectifi_en", "uint16", "abs(x) after the activation"),
    Field("lrn", "uint16", "[0] LRN enable, [1] include power, [11:8] log2 x^2 scale", True),
)

CONV_FIELDS: tuple[Field, ...] = (
    Field("topo", "uint32", "[31:0] Output Destination of each run, 0 = UBUF, 1 = EXTMEM", True),
    Field("w", "uint16", "Input Width"),
    Field("h", "uint16", "Input Height"),
    Field("z", "uint16", "Input Depth"),
    Field("c", "uint16", "Input Channels"),
    Field("input_circular_offset", "uint16", "0x8000 = transposed weights", True),
    Field("output_mode", "uint16", "0 = concat, 1 = eltwise add"),
)


@dataclass
class Run:
    """One `dmp_dv_cmdraw_conv_v0_run`, plus the weight placement and the IR ops it came from."""

    m: int
    conv_enable: int = CONV_OFF
    p: int = 1
    pz: int = 1
    weight_fmt: int = WFMT_NONE
    conv_pad: int = 0
    conv_stride: int = 0x101
    conv_dilation: int = 0
    pool_enable: int = POOL_OFF
    pool_size: int = 0
    pool_stride: int = 0x101
    pool_pad: int = 0
    pool_avg_param: int = 0
    actfunc: int = ACT_NONE
    actfunc_param: int = 0
    rectifi_en: int = 0
    lrn: int = 0
    weight_offs: int = 0
    weight_size: int = 0
    ops: list[str] = field(default_factory=list)


@dataclass
class ConvConf:
    """`dmp_dv_cmdraw_conv_v1` (u8→fp16 table, to_bgr) around `dmp_dv_cmdraw_conv_v0`."""

    w: int
    h: int
    c: int
    runs: list[Run]
    topo: int = 1
    z: int = 1
    input_circular_offset: int = 0
    output_mode: int = 0
    eltwise_offs: int | None = None  # None: eltwise_buf.mem = NULL
    u8tofp16_offs: int | None = None  # offset of the 6x256-byte table in the weights memory
    to_bgr: int = 0


@dataclass
class Layer:
    """One `fpga_layer` table entry."""

    name: str
    type: str
    input_offs: int
    output_offs: int
    output_size: int
    input_dim: list[int]
    output_dim: list[int]
    is_output: bool = False
    is_f32_output: bool = False
    is_input_hw_layout: bool = False
    conv: ConvConf | None = None
    softmax_axis: int | None = None
    custom_type: str | None = None
    custom_params: dict[str, Any] = field(default_factory=dict)
    input_layers: list[int] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)


@dataclass
class TensorBinding:
    """How a graph input/output maps onto the io buffer.

    layout: "whc8" (fp16 FPGA layout), "hwc" (row-major, CPU-layer output) or "u8" (uint8 WHC8 image for the
    u8→fp16 table). view: how the graph tensor is laid out relative to (H, W, C): "nchw", "nhwc" or "flat" (then
    `perm` lists, for each graph element, its position in the HWC-ordered buffer)."""

    name: str
    shape: list[int]
    offs: int
    dims: list[int]  # W, H, C
    layout: str
    dtype: str
    view: str
    perm: list[int] | None = None


@dataclass
class Network:
    name: str
    layers: list[Layer]
    weights_size: int
    io_size: int
    inputs: list[TensorBinding]
    outputs: list[TensorBinding]
    weight_format: str  # "fp16" | "8bit"
    input_convert: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, int] = field(default_factory=dict)  # validate.Hardware fields the table was checked for
    weights_transposed: bool = False  # `is_weight_transposed`: kernels stored with kx and ky exchanged


# ---------------------------------------------------------------------------------------------------------
# JSON twin: generic dataclass <-> dict driven by the field tables and dataclass fields
# ---------------------------------------------------------------------------------------------------------

FORMAT = "npuc-dmp-layers"
VERSION = 1


def network_to_dict(net: Network) -> dict[str, Any]:
    from dataclasses import asdict

    return {"format": FORMAT, "version": VERSION, **asdict(net)}


def network_from_dict(data: dict[str, Any]) -> Network:
    """Rebuild a Network from its JSON twin, already checked against `schema.LAYERS_JSON` (every field present
    or defaulted, of its type and range, no unknown field)."""
    layers = []
    for raw in data["layers"]:
        layer = Layer(**raw)
        if layer.conv is not None:
            layer.conv = ConvConf(**{**layer.conv, "runs": [Run(**r) for r in layer.conv["runs"]]})
        layers.append(layer)
    fields_ = {k: v for k, v in data.items() if k not in ("format", "version")}
    net = Network(**{**fields_, "layers": layers})
    net.inputs = [TensorBinding(**b) for b in net.inputs]
    net.outputs = [TensorBinding(**b) for b in net.outputs]
    return net
