"""npuc's cv18xx build of the golden smallcnn, with tpu-mlir's calibration table for int8."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from golden import GOLDEN_ROOT

from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.compiler.targets import BuildRequest
from npuc.frontends.onnx import import_onnx
from npuc.passes.rewrite.canonicalize import canonicalize

GOLDEN = GOLDEN_ROOT / "cv18xx"


def build_smallcnn(chip: str, quant: str = "int8") -> tuple[bytes, dict[str, Any]]:
    """(cvimodel bytes, build summary)."""
    source = GOLDEN / "smallcnn.onnx"
    graph = import_onnx(source, None, [])
    canonicalize(graph)
    table = GOLDEN / "smallcnn_cali_table.txt" if quant == "int8" else None
    return compile_cvimodel(
        BuildRequest(graph, source, Path("unused.cvimodel"), chip=chip, quant=quant, calib_table=table)
    )
