"""The bpu target (Horizon X3, bernoulli2): the hbDNN quantization contract."""

from npuc.compiler.targets import Target, register_target

register_target(
    Target(
        name="bpu",
        chips=("x3-bernoulli2",),
        number_formats=("int8 with SHIFT or SCALE boundaries",),
        artifact="hbDNN tensor-property contract (JSON + C header) and a QDQ ONNX; the .bin needs Horizon's tools",
        status="the SHIFT/SCALE number formats exist; the contract writer and hb_mapper YAML are not implemented yet",
    )
)
