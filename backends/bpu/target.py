"""The bpu target (Horizon X3, bernoulli2): the hbDNN I/O contract and a QDQ ONNX of npuc's int8 model."""

from npuc.compiler.targets import Target, register_target

from . import artifact  # noqa: F401 - registers the output folder as an artifact kind
from .build import build_bpu

register_target(
    Target(
        name="bpu",
        chips=("x3-bernoulli2",),
        quants=("int8",),
        options=(
            "name",
            "float_layers",
            "quant_output",
            "quanti_type",
            "march",
            "qdq_form",
            "act_scale",
            "calib_feeds",
            "calib_data",
            "calib_method",
            "calib_percentile",
            "hb_inputs",
        ),  # fmt: skip
        uses_calib=True,
        number_formats=("int8 with SHIFT or SCALE boundaries",),
        artifact="hbDNN tensor-property contract (JSON + C header) and a QDQ ONNX; the .bin needs Horizon's tools",
        status=(
            "builds the hbDNN I/O contract (JSON and C header) and an onnxruntime-runnable QDQ model of npuc's "
            "symmetric int8 quantization, with hb_mapper YAML configs and NV12/YUV444 HzPreprocess inputs; the "
            "deployable .bin is not made (it needs Horizon's closed compiler)"
        ),
        build=build_bpu,
    )
)
