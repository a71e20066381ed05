"""DV700 output folders as artifacts: detected by their `<NET>_layers.json` twin; inspect prints the layer
table, run simulates it from the JSON table and the `.bin` bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from npuc.compiler.artifacts import ArtifactKind, ArtifactOptions, TensorSpec, register_artifact
from npuc.compiler.errors import CorruptFileError
from npuc.compiler.fileio import read_limited
from npuc.compiler.schema import check

from .codegen import LAYERS_SUFFIX
from .layers import ACT_NAMES, FORMAT, Network, kernel_wh, network_from_dict, unpack2
from .schema import LAYERS_JSON

MAX_TABLE_BYTES = 64 << 20


def _table_path(path: Path) -> Path | None:
    if path.is_file() and path.name.endswith(LAYERS_SUFFIX):
        return path
    if path.is_dir():
        found = sorted(path.glob(f"*{LAYERS_SUFFIX}"))
        return found[0] if len(found) == 1 else None
    return None


def _matches(path: Path) -> bool:
    table = _table_path(path)
    if table is None:
        return False
    with table.open("rb") as f:
        return FORMAT.encode() in f.read(4096)


def load_network(path: Path) -> tuple[Network, bytes]:
    """The layer table and weights bytes of an output folder (or its `_layers.json`)."""
    table = _table_path(path)
    if table is None:
        raise CorruptFileError(f"{path}: no single *{LAYERS_SUFFIX} file; pass a dmp output folder")
    try:
        data = json.loads(read_limited(table, "DMP layer table", MAX_TABLE_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"{table}: not valid JSON ({exc}); regenerate the output") from None
    net = network_from_dict(check(data, LAYERS_JSON, str(table), "the layer table is damaged, rebuild the output"))
    _check_permutations(net, table)
    weights = table.parent / f"{net.name}_weights.bin"
    if not weights.is_file():
        raise CorruptFileError(f"{weights} is missing; the folder must hold the weights next to the layer table")
    if weights.stat().st_size != net.weights_size:
        raise CorruptFileError(
            f"{weights}: {weights.stat().st_size} bytes, but the layer table reserves {net.weights_size}"
        )
    return net, read_limited(weights, "DMP weights file", net.weights_size)


def _check_permutations(net: Network, table: Path) -> None:
    """A flat binding's `perm` must reorder its whole buffer: one position per element, each used once."""
    for binding in net.inputs + net.outputs:
        if binding.perm is None:
            continue
        size = int(np.prod(binding.dims))
        perm = np.asarray(binding.perm, np.int64)
        if binding.view != "flat" or perm.size != size or not np.array_equal(np.sort(perm), np.arange(size)):
            raise CorruptFileError(
                f"{table}: binding '{binding.name}' perm is not a permutation of its {size}-element "
                f"{binding.view} buffer; the layer table is damaged, rebuild the output"
            )


def describe_network(net: Network) -> str:
    lines = [
        f"DMP DV700 network C{net.name}: {len(net.layers)} layers, weights {net.weights_size} bytes "
        f"({net.weight_format}), io {net.io_size} bytes",
        f"{'id':>5}  {'type':<15} {'in (WxHxC)':<14} {'out':<14} {'in_offs':>9} {'out_offs':>9}  detail",
    ]
    for i, layer in enumerate(net.layers):
        dims_in, dims_out = "x".join(map(str, layer.input_dim)), "x".join(map(str, layer.output_dim))
        head = f"{i:>5}  {layer.type:<15} {dims_in:<14} {dims_out:<14} {layer.input_offs:>9} {layer.output_offs:>9}"
        if layer.conv is None:
            extra = layer.custom_type or (f"axis {layer.softmax_axis}" if layer.softmax_axis is not None else "")
            lines.append(f"{head}  {layer.name} {extra}".rstrip())
            continue
        lines.append(f"{head}  {layer.name} topo=0x{layer.conv.topo:x} mode={layer.conv.output_mode}")
        for r, run in enumerate(layer.conv.runs):
            kw, kh = kernel_wh(run.p)
            desc = [f"m={run.m}"]
            if run.conv_enable:
                desc.append(f"conv{run.conv_enable} {kw}x{kh} stride {unpack2(run.conv_stride)}")
                desc.append(f"w@{run.weight_offs}+{run.weight_size} fmt{run.weight_fmt}")
            if run.pool_enable:
                desc.append(f"pool{run.pool_enable} {unpack2(run.pool_size)}")
            if run.actfunc:
                desc.append(ACT_NAMES.get(run.actfunc, str(run.actfunc)))
            lines.append(f"{'':>5}  run {r}: " + ", ".join(desc))
    for b in net.outputs:
        lines.append(f"output {b.name}: {b.shape} from io offset {b.offs} ({b.layout}, {b.dtype})")
    return "\n".join(lines)


def _describe(path: Path, options: ArtifactOptions) -> str:
    return describe_network(load_network(path)[0])


def _inputs(path: Path, options: ArtifactOptions) -> list[TensorSpec]:
    net, _ = load_network(path)
    return [TensorSpec(b.name, tuple(b.shape), "uint8" if b.layout == "u8" else "float32") for b in net.inputs]


def _run(path: Path, feeds: dict[str, np.ndarray], options: ArtifactOptions) -> dict[str, np.ndarray]:
    from .sim import run_network

    net, blob = load_network(path)
    return run_network(net, blob, feeds)


register_artifact(ArtifactKind("dmp", _matches, _describe, _inputs, _run))
