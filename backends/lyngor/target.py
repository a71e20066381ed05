"""The lyngor target (Lynxi KA200 "apu"): fp16 artifact trees, or a delegate to the vendor's compiler."""

from npuc.compiler.targets import Target, register_target

from .build import build_tree

register_target(
    Target(
        name="lyngor",
        chips=("ka200",),
        quants=("fp16", "float16"),
        options=(
            "input_dtype",
            "output_dtype",
            "input_layout",
            "input_shapes_list",
            "parallel_mode",
            "run_batch",
            "delegate",
        ),  # fmt: skip
        number_formats=("fp16",),
        artifact="output folder: net_params.json, Net_0/top_graph.json, Net_0/apu_0/apu_x/apu.json + npuc payload",
        status=(
            "writes the documented Lyngor manifests with npuc's own fp16 program (single or multi-resolution) "
            "that `npuc run` simulates from the files; the vendor's binaries are not public, so trees for real "
            "KA200 hardware come from delegate mode (build_lyngor.py for the vendor's lyn.Builder)"
        ),
        build=build_tree,
    )
)
