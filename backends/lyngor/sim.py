"""Simulate an npuc Lyngor tree from its files: fp16 arithmetic with the float reference kernels.

Every op runs the float kernel on fp16 values and its float results are rounded to fp16 (round to nearest
even) before the next op reads them; weights come from npuc_weight.bin as fp16 and inputs are cast from their
fed dtype to fp16. Outputs are returned in the manifest's output dtype (float16 by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np

from npuc.compiler import interp
from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.ir import Graph, Op
from npuc.compiler.kernels import FLOAT_KERNELS, KernelFn
from npuc.compiler.numformats.bf16_fp16 import round_to_fp16

from . import manifest as mf
from .payload import read_program, read_weights
from .program import decode_section


def _fp16(kernel: KernelFn) -> KernelFn:
    def run(op: Op, args: list[np.ndarray]) -> list[np.ndarray]:
        return [round_to_fp16(o) if o.dtype == np.float32 else o for o in kernel(op, args)]

    return run


FP16_KERNELS: Mapping[str, KernelFn] = MappingProxyType({kind: _fp16(fn) for kind, fn in FLOAT_KERNELS.items()})


def pick_resolution(tree: mf.LyngorTree, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The resolution whose fed input shapes equal `shapes` (by input name); the default one when empty."""
    apu = tree.apu
    assert apu is not None
    if not shapes:
        return int(apu["default_resolution"])
    names = {k: v["name"] for k, v in apu["inputs"].items()}
    for i in range(apu["resolution_num"]):
        res = apu["resolution_config"][f"res{i}"]
        if all(tuple(shapes.get(names[k], ())) == tuple(s) for k, s in res["input_shape_ex"].items()):
            return i
    offered = [
        {names[k]: list(s) for k, s in apu["resolution_config"][f"res{i}"]["input_shape_ex"].items()}
        for i in range(apu["resolution_num"])
    ]
    given = {k: list(v) for k, v in shapes.items()}
    raise UserError(f"{tree.root}: input shapes {given} match no compiled resolution; this artifact takes {offered}")


def load_resolution(tree: mf.LyngorTree, index: int) -> Graph:
    """Decode resolution `index`'s program section and the weights it reads, from the files."""
    apu = tree.apu
    assert apu is not None
    folder = tree.apu_x
    rel = f"{mf.NET_DIR}/{mf.APU_DIR}/{mf.APU_X_DIR}"
    sections = read_program((folder / apu["cmd_file"]).read_bytes(), f"{rel}/{apu['cmd_file']}")
    weights = read_weights((folder / apu["dat_file"]).read_bytes(), f"{rel}/{apu['dat_file']}")
    section = apu["resolution_config"][f"res{index}"]["cmd_section"]
    if section >= len(sections):
        raise UserError(f"{rel}/npuc_apu.json: res{index}.cmd_section {section} but the program has {len(sections)}")
    graph = decode_section(sections[section], weights, f"{rel}/{apu['cmd_file']} section {section}")
    expected_in = [n["name"] for n in apu["inputs"].values()]
    if sorted(graph.inputs) != sorted(expected_in) or len(graph.outputs) != len(apu["outputs"]):
        raise UserError(f"{rel}: program section {section} does not have npuc_apu.json's inputs/outputs; rebuild it")
    return graph


def run_tree(root: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs (by model output name) of the npuc tree at `root` for `feeds` (by model input name)."""
    tree = mf.read_tree(root)
    if tree.producer != "npuc" or tree.apu is None:
        raise UserError(
            f"{root}: a vendor-built Lyngor tree; its binaries (apu_lib.bin, cmd.bin) are not public, so npuc can "
            "inspect it but not run it — run it on a KA200 with lyn.load(...)"
        )
    nodes_in = list(tree.apu["inputs"].values())
    names = [n["name"] for n in nodes_in]
    unknown = sorted(set(feeds) - set(names))
    missing = [n for n in names if n not in feeds]
    if unknown or missing:
        raise UserError(f"{root}: feeds {sorted(feeds)} do not match the inputs {names}; give one array per input")
    arrays = {n: np.asarray(feeds[n]) for n in names}
    index = pick_resolution(tree, {n: a.shape for n, a in arrays.items()})
    graph = load_resolution(tree, index)
    internal = {}
    for node in nodes_in:
        value = arrays[node["name"]]
        if str(value.dtype) != node["dtype"]:
            raise UserError(
                f"input '{node['name']}': the artifact is fed {node['dtype']}, given {value.dtype}; convert it with "
                f".astype('{node['dtype']}') or rebuild with another --input-dtype"
            )
        if node["transpose_axis"] is not None:
            axes = node["transpose_axis"]
            valid = isinstance(axes, (list, tuple)) and all(
                isinstance(a, int) and not isinstance(a, bool) for a in axes
            )
            if not valid or sorted(axes) != list(range(value.ndim)):
                raise CorruptFileError(
                    f"input '{node['name']}': transpose_axis {axes} is not a permutation of its {value.ndim} axes"
                )
            value = value.transpose(axes)
        target = graph.tensors[node["name"]].dtype
        value = value.astype(target)
        internal[node["name"]] = round_to_fp16(value) if value.dtype.kind == "f" else value
    outputs = interp.run(graph, internal, kernels=FP16_KERNELS)
    result = {}
    for node, name in zip(tree.apu["outputs"].values(), graph.outputs):
        value = outputs[name]
        result[node["name"]] = value.astype(node["dtype"]) if value.dtype.kind == "f" else value
    return result
