"""The cv18xx target (Sophgo/Cvitek CV183x/CV182x/CV181x/CV180x)."""

from npuc.compiler.targets import Target, register_target

register_target(
    Target(
        name="cv18xx",
        chips=("cv183x", "cv182x", "cv181x", "cv180x"),
        number_formats=("int8 (per-channel multiplier+rshift)", "bf16"),
        artifact=".cvimodel (FlatBuffer + TIU/TDMA cmdbufs)",
        status=(
            "reads, inspects (--disasm) and simulates cvimodels from their bytes; tpu-mlir's int8 files match the "
            "vendor simulator bit for bit; code generation (npuc build) is not implemented yet"
        ),
    )
)
