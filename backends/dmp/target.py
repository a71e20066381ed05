"""The `dmp` target: DMP DV700 generated C++ (`C<NET> : CDMP_Network`) plus packed weights.

Options read from `request.options` (all optional):
- `name`: the network/class name (default: the model file's stem, made a C identifier);
- `input_convert`: DMP input conversion policy of the first conv (conv v1 u8→fp16 table):
  "none" (fp16 input, the default), "div_255" (x/255), "mean_scale" ((x - mean) * scale);
- `mean`, `scale`: one or three numbers for "mean_scale"; `color`: "rgb" (default) or "bgr" (sets to_bgr).
`request.quant`: "fp16" (default) or "8bit" (one 255-cluster fp16 LUT per layer; PReLU layers stay fp16).
"""

from __future__ import annotations

from typing import Any

from npuc.compiler.errors import UserError
from npuc.compiler.targets import BuildRequest, BuildResult, Target, register_target

from .codegen import c_identifier, write_output
from .lower import lower_graph

WEIGHT_FORMATS = {"fp16": False, "8bit": True}
CONVERT_POLICIES = ("none", "div_255", "mean_scale")


def input_convert(options: dict[str, Any]) -> dict[str, Any]:
    """The u8→fp16 conversion settings from the target options (empty when disabled)."""
    policy = options.get("input_convert", "none")
    if policy not in CONVERT_POLICIES:
        raise UserError(f"input_convert '{policy}' is not one of {', '.join(CONVERT_POLICIES)}")
    color = options.get("color", "rgb")
    if color not in ("rgb", "bgr"):
        raise UserError(f"color '{color}' must be rgb or bgr")
    if policy == "none":
        return {}
    mean, scale = (0.0, 1.0 / 255.0) if policy == "div_255" else (options.get("mean", 0.0), options.get("scale", 1.0))
    return {"policy": policy, "mean": mean, "scale": scale, "color": color}


def build(request: BuildRequest) -> BuildResult:
    quant = request.quant or "fp16"
    if quant not in WEIGHT_FORMATS:
        raise UserError(f"--quant {quant} is not a DMP weight format; choose fp16 or 8bit")
    name = c_identifier(request.options.get("name") or request.model_path.stem)
    convert = input_convert(request.options)
    net, blob = lower_graph(request.graph, name=name, quantized=WEIGHT_FORMATS[quant], input_convert=convert)
    if convert.get("color") == "bgr":
        net.layers[0].conv.to_bgr = 1
    files = write_output(request.output, net, blob, request.model_path.name)
    summary = {
        "layers": len(net.layers),
        "weights_size": net.weights_size,
        "io_size": net.io_size,
        "weight_format": net.weight_format,
    }
    return BuildResult(files, summary)


register_target(
    Target(
        name="dmp",
        chips=("dv700",),
        number_formats=("fp16", "8bit"),
        artifact="folder: <NET>_gen.h/.cpp (C<NET> : CDMP_Network), <NET>_weights.bin, <NET>_layers.json",
        status="builds conv/depthwise/dilated/pool/add/FC/softmax networks (CPU custom layers for hard-swish, "
        "hard-sigmoid, channel mul) into compilable C++ and vendor-packed fp16 or 8-bit LUT weights; runs in "
        "npuc's fp16 simulator; not checked on DV700 hardware",
        build=build,
    )
)
