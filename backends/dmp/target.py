"""The `dmp` target: DMP DV700 generated C++ (`C<NET> : CDMP_Network`) plus packed weights.

Options read from `request.options` (all optional; `npuc build --option KEY=VALUE`):
- `name`: the network/class name (default: the model file's stem, made a C identifier);
- `convert` (alias `input_convert`): the input convert policy of the DMP network API. The network then takes
  uint8 pixels and the first conv's v1 command converts them through a 6x256-byte u8→fp16 table:
  "none" (fp16 input, the default), "div_255" (x/255), "minus_128" (x-128), "minus_128_div_128"
  ((x-128)/128), "minus_127_5_div_128" ((x-127.5)/128), "direct" (x), or "mean_scale" ((x-mean)*scale);
- `mean`, `scale`: one or three numbers (`npuc build --mean/--scale`); given without `convert` they select
  "mean_scale", as `--input-dtype uint8` does (the camera's pixels in, as on cv18xx); the named policies fix
  their own formula. `color` (`--color`): "rgb" (default) or "bgr"
  (sets to_bgr: the table is applied to the channels in reverse order);
- `transpose_weight` (default true, as the convertor's .ini): kernels stored with kx and ky exchanged and the
  commands marked so (`is_weight_transposed`, input_circular_offset 0x8000); false gives the other layout;
- `cv2_seed` (default 0: OpenCV's initial state, the convertor without --cv2_seed): the seed of the OpenCV
  k-means that makes the 8-bit LUTs, so `--quant 8bit` writes the convertor's bytes;
- `ub_size` (bytes, default 655360) and `svn_version` (default 93) of the device: every conv command is
  checked against the driver's rules for them (unified buffer tiles; non-square pooling and wide dilated
  padding need svn_version >= 93).
`request.quant`: "fp16" (default) or "8bit" (one 255-cluster fp16 LUT per layer; PReLU layers stay fp16).
"""

from __future__ import annotations

from npuc.compiler.errors import UserError
from npuc.compiler.sanitize import c_identifier
from npuc.compiler.targets import BuildRequest, BuildResult, Target, bool_option, int_option, register_target

from .codegen import write_output
from .convert import input_convert
from .layers import Network
from .lower import lower_graph
from .validate import hardware_from_options

WEIGHT_FORMATS = {"fp16": False, "8bit": True}


def build(request: BuildRequest) -> BuildResult:
    quant = request.quant or "fp16"
    if quant not in WEIGHT_FORMATS:
        raise UserError(f"--quant {quant} is not a DMP weight format; choose fp16 or 8bit")
    name = c_identifier(request.options.get("name") or request.model_path.stem)
    convert = input_convert(request.options)
    hardware = hardware_from_options(request.options)
    transposed = bool_option(request.options, "transpose_weight", True)
    seed = int_option(request.options, "cv2_seed", 0, -(2**31), 2**31 - 1)
    if "cv2_seed" in request.options and quant != "8bit":
        raise UserError("option cv2_seed seeds the 8-bit LUT clustering; use it with --quant 8bit or remove it")
    net, blob = lower_graph(
        request.graph,
        name=name,
        quantized=WEIGHT_FORMATS[quant],
        input_convert=convert,
        hardware=hardware,
        transposed=transposed,
        kmeans_seed=seed,
    )
    if convert.get("color") == "bgr":
        net.layers[0].conv.to_bgr = 1
    files = write_output(request.output, net, blob, request.model_path.name)
    cpu = cpu_layer_counts(net)
    summary = {
        "layers": len(net.layers),
        "cpu_layers": sum(cpu.values()),
        "weights_size": net.weights_size,
        "io_size": net.io_size,
        "weight_format": net.weight_format,
        "weights_transposed": net.weights_transposed,
    }
    notes = []
    if cpu:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(cpu.items()))
        notes.append(
            f"{sum(cpu.values())} of {len(net.layers)} layers are CPU custom layers ({kinds}); the host runs them"
        )
    return BuildResult(files, summary, notes, chip="dv700", quant=quant, weight_bytes=net.weights_size,
                       host_ops=sum(cpu.values()))  # fmt: skip


def cpu_layer_counts(net: Network) -> dict[str, int]:
    """How many layers of each npuc custom type the host runs (the callbacks the application links)."""
    counts: dict[str, int] = {}
    for layer in net.layers:
        if layer.type == "LT_CUSTOM":
            counts[layer.custom_type] = counts.get(layer.custom_type, 0) + 1
    return counts


register_target(
    Target(
        name="dmp",
        chips=("dv700",),
        quants=("fp16", "8bit"),
        options=(
            "name",
            "mean",
            "scale",
            "color",
            "convert",
            "input_convert",
            "input_dtype",
            "ub_size",
            "svn_version",
            "transpose_weight",
            "cv2_seed",
        ),  # fmt: skip
        number_formats=("fp16", "8bit"),
        artifact="folder: <NET>_gen.h/.cpp (C<NET> : CDMP_Network), <NET>_weights.bin, <NET>_layers.json",
        status="builds conv/depthwise/dilated/deconv/pool/add/FC/softmax/concat networks (branches into a concat "
        "as one multi-run layer; channel splits as views of the WHC8 layout; CPU custom layers for SiLU, "
        "hard-swish, hard-sigmoid, channel mul and the YOLOv8 DFL decode, counted in the build notes) into "
        "compilable C++ "
        "and vendor-packed fp16 or 8-bit LUT weights, with the u8→fp16 input convert policies, every command "
        "checked against the driver's rules (unified buffer included); runs in npuc's fp16 simulator; LRN not "
        "lowered; not checked on DV700 hardware",
        build=build,
    )
)
