"""ONNX models as artifacts: `npuc inspect model.onnx` reports ops, params, shapes and FLOPs;
`npuc run model.onnx` executes the canonical float IR."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from npuc.compiler.artifacts import ArtifactKind, ArtifactOptions, TensorSpec, register_artifact

if TYPE_CHECKING:  # the frontend and the interpreter load when an ONNX file is read, not to recognise others
    import numpy as np

    from npuc.compiler.ir import Graph


def load_canonical(path: Path, options: ArtifactOptions, notes: list[str] | None = None) -> Graph:
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.rewrite.canonicalize import canonicalize

    graph = import_onnx(path, options.input_shapes, notes, options.output_names)
    canonicalize(graph)
    return graph


def _fmt_shape(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def describe(path: Path, options: ArtifactOptions) -> str:
    from npuc.compiler import interp
    from npuc.compiler.stats import op_flops, op_params
    from npuc.frontends.onnx_load import load_model

    model = load_model(path)
    onnx_ops = Counter(node.op_type for node in model.graph.node)
    opsets = ", ".join(f"{e.domain or 'ai.onnx'} {e.version}" for e in model.opset_import)
    notes: list[str] = []
    graph = load_canonical(path, options, notes)
    lines = [
        f"model     {path}",
        f"producer  {model.producer_name or '-'} {model.producer_version}".rstrip(),
        f"opset     {opsets}",
        f"onnx ops  {sum(onnx_ops.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(onnx_ops.items())),
        *(f"note      {n}" for n in notes),
        "",
        "inputs",
    ]
    for name in graph.inputs:
        layout = graph.input_layouts.get(name, "nchw")
        shape = interp.external_shape(graph, name)
        lines.append(f"  {name:<28} {graph.tensors[name].dtype:<8} {_fmt_shape(shape):<18} {layout}")
    lines.append("outputs")
    for name in graph.outputs:
        lines.append(f"  {name:<28} {graph.tensors[name].dtype:<8} {_fmt_shape(graph.shape(name))}")
    lines += ["", f"npuc IR after canonicalization: {len(graph.ops)} ops", ""]
    header = f"  {'#':>4}  {'op':<34} {'kind':<18} {'output':<20} {'params':>10} {'MFLOPs':>10}"
    lines.append(header)
    total_params = total_flops = 0
    for i, op in enumerate(graph.ops):
        params, flops = op_params(graph, op), op_flops(graph, op)
        total_params += params
        total_flops += flops
        kind = op.kind + (f"+{op.attrs.act.kind}" if getattr(op.attrs, "act", None) else "")
        detail = getattr(op.attrs, "kind", None) or getattr(op.attrs, "mode", None)
        if op.kind == "activation":
            detail = op.attrs.act.kind
        label = f"{kind}({detail})" if isinstance(detail, str) else kind
        out = _fmt_shape(graph.shape(op.outputs[0]))
        lines.append(f"  {i:>4}  {op.name[:34]:<34} {label[:18]:<18} {out:<20} {params:>10} {flops / 1e6:>10.2f}")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(graph.summary().items()))
    lines += [
        "",
        f"ops       {kinds}",
        f"params    {total_params:,}",
        f"FLOPs     {total_flops / 1e9:.3f} G",
    ]
    return "\n".join(lines)


def inputs(path: Path, options: ArtifactOptions) -> list[TensorSpec]:
    from npuc.compiler import interp

    graph = load_canonical(path, options)
    return [TensorSpec(n, interp.external_shape(graph, n), graph.tensors[n].dtype) for n in graph.inputs]


def run(path: Path, feeds: dict[str, np.ndarray], options: ArtifactOptions) -> dict[str, np.ndarray]:
    from npuc.compiler import interp

    return interp.run(load_canonical(path, options), feeds)


def _is_onnx(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".onnx"


register_artifact(ArtifactKind("onnx", _is_onnx, describe, inputs, run))
