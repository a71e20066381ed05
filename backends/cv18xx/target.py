"""The cv18xx target (Sophgo/Cvitek CV183x/CV182x/CV181x/CV180x)."""

from npuc.compiler.targets import Target, register_target

from .build import build

register_target(
    Target(
        name="cv18xx",
        chips=("cv183x", "cv182x", "cv181x", "cv180x"),
        quants=("int8", "bf16"),
        options=(
            "name",
            "float_layers",
            "allow_partial_table",
            "quant_input",
            "quant_output",
            "layer_group",
            "sync",
            "compress_weights",
            "input_dtype",
            "pixel_format",
            "aligned_input",
            "mean",
            "scale",
            "color",
        ),  # fmt: skip
        uses_calib=True,
        number_formats=("int8 (per-channel multiplier+rshift)", "bf16"),
        artifact=".cvimodel (FlatBuffer + TIU/TDMA cmdbufs)",
        status=(
            "reads, inspects (--disasm) and simulates cvimodels from their bytes; npuc build generates int8/bf16 "
            "cvimodels (conv, transposed conv, pooling, eltwise, ReLU family, PReLU, sigmoid/tanh/hard-swish/"
            "hard-sigmoid, FC/MatMul, concat, reshape/transpose incl. channel shuffle, nearest upsample, CPU "
            "softmax; NCHW or NHWC input, or a uint8 camera frame with fused preprocessing) with layer groups kept "
            "in local memory and VLC-compressed filters; "
            "every build runs on the vendor simulator bit for bit"
        ),
        build=build,
    )
)
