"""onnxruntime as the BPU's arithmetic for an exported QDQ model: every Quantize/DequantizeLinear runs as written
and the convolutions in float, so the result is the int8 grid's and not the host CPU's. onnxruntime's extended
optimizations fuse QDQ into QLinearConv/QGemm, whose x86 kernels on CPUs without VNNI sum u8*s8 pairs in int16
with saturation (VPMADDUBSW): measured on MTCNN R-Net per tensor, face output cosine 0.9956 -> 0.9873 on such a
CPU and unchanged on a VNNI one. The BPU accumulates in int32, so the basic level (constant folding, no QDQ
fusion) is the faithful one."""

from __future__ import annotations

from typing import Any


def qdq_session(model: bytes | str, optimized_to: str | None = None) -> Any:  # noqa: ANN401 - lazily imported type
    """An onnxruntime session on `model` (bytes or path) that keeps its QDQ pairs unfused; `optimized_to` saves
    the graph onnxruntime runs (to see what it fused)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if optimized_to is not None:
        options.optimized_model_filepath = optimized_to
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
