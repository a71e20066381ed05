"""Lyngor output trees (npuc's or the vendor's) as artifacts: detected by net_params.json; inspect; run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npuc.compiler.artifacts import ArtifactKind, ArtifactOptions, TensorSpec, register_artifact

from . import manifest as mf
from .sim import pick_resolution, run_tree


def _matches(path: Path) -> bool:
    return mf.is_tree(path)


def _fmt(shape: tuple[int, ...] | list[int]) -> str:
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def describe_tree(tree: mf.LyngorTree) -> str:
    net, top, apu, doc = tree.net_params, tree.top_graph, tree.apu, tree.apu_doc
    dynamic = str(net["is_dynamic_shape"]).lower() if "is_dynamic_shape" in net else "not recorded"
    lines = [
        f"lyngor tree   {tree.root} ({'npuc payload' if apu else 'vendor build'})",
        f"target        {net['target']}  build_mode {net.get('build_mode', 'not recorded')}  "
        f"version {net.get('version', 'not recorded')}",
        f"nets          {net['net_num']}  chips {net['chip_num']}  parallel {net['parallel_mode']}  "
        f"run_batch {net['run_batch']}  dynamic shape {dynamic}",
        "inputs",
    ]
    nodes = list(apu["inputs"].values()) if apu else []
    for i, (name, spec) in enumerate(top["main"]["inputs"].items()):
        transpose = nodes[i]["transpose_axis"] if nodes else None
        extra = f"  transpose_axis {tuple(transpose)}" if transpose else ""
        lines.append(f"  {name:<24} {spec['dtype']:<8} {_fmt(spec['shape']):<18} batch {spec['batch']}{extra}")
    lines.append("outputs")
    names = [n["name"] for n in apu["outputs"].values()] if apu else []
    for i, (key, spec) in enumerate(top["outputs"].items()):
        label = f"{key} ({names[i]})" if names else key
        lines.append(f"  {label:<24} {spec['dtype']:<8} {_fmt(spec['shape'])}")
    if doc:
        lines.append(
            f"apu.json      batch {doc['batch_size']}  cmd {doc['cmd_size']} bytes  image {doc['image_size']} bytes "
            f"({len(doc['sub_image_size'])} part(s))"
        )
        for key, node in [*doc["inputs"].items(), *doc["outputs"].items()]:
            lines.append(f"  {key:<8} {node['name']:<22} {node['dtype']:<8} {_fmt(node['shape'])}")
    if apu:
        lines.append(
            f"program       {apu['cmd_file']} {apu['cmd_size']} bytes, {apu['dat_file']} {apu['dat_size']} bytes "
            f"(fp16, {apu['core_num']} logical core(s))"
        )
        lines.append(f"resolutions   {apu['resolution_num']} (default res{apu['default_resolution']})")
        in_names = {k: v["name"] for k, v in apu["inputs"].items()}
        for key, res in apu["resolution_config"].items():
            shapes = ", ".join(f"{in_names[k]} {_fmt(s)}" for k, s in res["input_shape_ex"].items())
            lines.append(f"  {key}  {shapes}  cores {res['core_ids']}")
    return "\n".join(lines)


def _describe(path: Path, options: ArtifactOptions) -> str:
    return describe_tree(mf.read_tree(path))


def tree_inputs(path: Path, options: ArtifactOptions) -> list[TensorSpec]:
    """Inputs of the resolution chosen by options.input_shapes (fed shapes by name), else the default."""
    tree = mf.read_tree(path)
    if tree.apu is None:
        return [TensorSpec(n, tuple(s["shape"]), s["dtype"]) for n, s in tree.top_graph["main"]["inputs"].items()]
    index = pick_resolution(tree, options.input_shapes)
    res = tree.apu["resolution_config"][f"res{index}"]
    return [
        TensorSpec(node["name"], tuple(res["input_shape_ex"][key]), node["dtype"])
        for key, node in tree.apu["inputs"].items()
    ]


def _run(path: Path, feeds: dict[str, np.ndarray], options: ArtifactOptions) -> dict[str, np.ndarray]:
    return run_tree(path, feeds)


register_artifact(ArtifactKind("lyngor", _matches, _describe, tree_inputs, _run))
