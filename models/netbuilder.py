"""A tiny seeded ONNX graph builder: layers append nodes and initializers with deterministic names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
IR_VERSION = 8  # opset 13 needs IR >= 7; 8 keeps the files loadable by onnxruntime >= 1.10
PRODUCER = "npuc.models.make_models"


@dataclass
class NetBuilder:
    """Collects nodes and weights of one model; ``rng`` is the only source of weight values."""

    name: str
    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _count: int = 0

    def _fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        name = self._fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs: object) -> list[str]:
        outs = [self._fresh(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=outs[0], **attrs))
        return outs

    def op(self, op: str, *inputs: str, **attrs: object) -> str:
        return self.node(op, inputs, **attrs)[0]

    def normal(self, shape: Sequence[int], std: float, mean: float = 0.0) -> np.ndarray:
        return (self.rng.standard_normal(tuple(shape)) * std + mean).astype(np.float32)

    # -- layers ------------------------------------------------------------------------------------------

    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        k: int | tuple[int, int] = 3,
        stride: int = 1,
        pads: Sequence[int] | None = None,
        group: int = 1,
        dilation: int = 1,
        bias: bool = True,
        gain: float = 2.0,
    ) -> str:
        kh, kw = (k, k) if isinstance(k, int) else k
        if pads is None:
            ph, pw = dilation * (kh - 1) // 2, dilation * (kw - 1) // 2
            pads = (ph, pw, ph, pw)
        fan_in = cin // group * kh * kw
        w = self.const("w", self.normal((cout, cin // group, kh, kw), np.sqrt(gain / fan_in)))
        inputs = [x, w] + ([self.const("b", self.normal((cout,), 0.1))] if bias else [])
        return self.op(
            "Conv",
            *inputs,
            kernel_shape=[kh, kw],
            strides=[stride, stride],
            pads=list(pads),
            group=group,
            dilations=[dilation, dilation],
        )

    def batchnorm(self, x: str, c: int, gamma: float = 1.0) -> str:
        scale = self.const("bn_scale", self.normal((c,), 0.1 * gamma, gamma))
        beta = self.const("bn_bias", self.normal((c,), 0.1))
        mean = self.const("bn_mean", self.normal((c,), 0.1))
        var = self.const("bn_var", self.rng.uniform(0.5, 1.5, c).astype(np.float32))
        return self.op("BatchNormalization", x, scale, beta, mean, var, epsilon=1e-5)

    def gemm(self, x: str, cin: int, cout: int) -> str:
        w = self.const("fc_w", self.normal((cout, cin), np.sqrt(1.0 / cin)))
        b = self.const("fc_b", self.normal((cout,), 0.1))
        return self.op("Gemm", x, w, b, transB=1)

    def build(self, inputs: dict[str, tuple[int, ...]], outputs: dict[str, str], opset: int = OPSET) -> onnx.ModelProto:
        """Finish: rename the listed tensors to the public output names and wrap in a model."""
        renames = {inner: public for public, inner in outputs.items()}
        for node in self.nodes:
            node.output[:] = [renames.get(o, o) for o in node.output]
            node.input[:] = [renames.get(i, i) for i in node.input]
        graph = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
            initializer=self.inits,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset)],
            producer_name=PRODUCER,
            producer_version="1",
        )
        model.ir_version = IR_VERSION
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        # Declared outputs must end up with a full static shape (intermediates keep theirs as value_info).
        for out in inferred.graph.output:
            dims = out.type.tensor_type.shape.dim
            if not dims or not all(d.HasField("dim_value") for d in dims):
                raise ValueError(f"{self.name}: shape inference left output {out.name} without a static shape")
        return inferred
