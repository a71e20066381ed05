"""The bm1880 target (Bitmain BM1880, BMNNSDK v1)."""

from npuc.compiler.targets import BuildRequest, BuildResult, Target, register_target


def _build(request: BuildRequest) -> BuildResult:
    from .build import build

    return build(request)


register_target(
    Target(
        name="bm1880",
        chips=("bm1880",),
        quants=("int8",),
        options=("name", "opt", "weights", "input_shapes_list", "weight_scale"),
        uses_calib=True,
        number_formats=("int8 (per-layer power-of-two shift, BMNet rules; or per-channel power-of-two weight gains)",),
        artifact=".bmodel (protobuf + BMKernel cmdbuf)",
        status=(
            "builds int8 .bmodels (conv incl. depthwise/grouped, max/avg pool, FC, eltwise add/max/mul incl. "
            "per-channel, ReLU/LeakyReLU/PReLU, other activations as 256-entry lookups, concat, reshape, "
            "slice/split/transposes keeping the last axis as GDMA copies, nearest upsample; one command per input "
            "shape; --opt none|layer-group|layer-group-weight, groups incl. residual blocks) from ONNX or Caffe "
            "with a cali_table or BMNet table; reads/inspects all three containers and simulates bmodels from "
            "their bytes; softmax/output transposes are left to the host, softmax inside the net is rejected"
        ),
        build=_build,
    )
)
