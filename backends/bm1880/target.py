"""The bm1880 target (Bitmain BM1880, BMNNSDK v1)."""

from npuc.compiler.targets import Target, register_target

register_target(
    Target(
        name="bm1880",
        chips=("bm1880",),
        number_formats=("int8 (per-layer power-of-two shift, BMNet rules)",),
        artifact=".bmodel (protobuf + BMKernel cmdbuf)",
        status=(
            "reads and inspects all three bmodel containers and decodes every command buffer (--disasm); "
            "BMNet calibration tables read and write; npuc run simulates bmodels from their bytes; "
            "code generation is not implemented yet"
        ),
    )
)
