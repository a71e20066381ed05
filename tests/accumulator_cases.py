"""The model that makes a 32-bit accumulator wrap, shared by the int8 reference / vendor simulator test and the
QDQ exact export test."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from npuc.models.netbuilder import NetBuilder

CHANNELS = 4
INPUT_SHAPE = (1, 3, 8, 8)


def saturating_bias_model(head: str) -> tuple[onnx.ModelProto, str]:
    """(model, the ReLU tensor to call all-zero): conv -> relu -> a 1x1 conv (`head` "conv") or a fully connected
    layer ("gemm"), every weight and bias positive and the head's bias large. With the ReLU at tpu-mlir's all-zero
    threshold (1e-5) the head's int32 bias saturates and the products beside it push the sum out of int32."""
    b = NetBuilder("wrap", np.random.default_rng(3))
    dead = b.op("Relu", b.conv("input", 3, CHANNELS, k=3))
    if head == "conv":
        out = b.conv(dead, CHANNELS, CHANNELS, k=1)
    else:
        out = b.gemm(b.op("Flatten", dead, axis=1), CHANNELS * INPUT_SHAPE[2] * INPUT_SHAPE[3], 8)
    model = b.build({"input": INPUT_SHAPE}, {"output": out}, opset=14)
    last_bias = [node for node in model.graph.node if node.op_type in ("Conv", "Gemm")][-1].input[2]
    for init in model.graph.initializer:
        values = (np.abs(numpy_helper.to_array(init)) + 0.05) * (100 if init.name == last_bias else 1)
        init.CopyFrom(numpy_helper.from_array(values.astype(np.float32), init.name))
    return model, dead


def wrap_feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"input": rng.uniform(0.0, 1.0, INPUT_SHAPE).astype(np.float32)} for _ in range(2)]
