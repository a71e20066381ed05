"""Write the DV700 output folder: `<NET>_gen.h`, `<NET>_gen.cpp` (from templates/dmp/*.j2), the packed
`<NET>_weights.bin` and the `<NET>_layers.json` twin of the layer table, atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from npuc.compiler.fileio import atomic_write_tree
from npuc.compiler.sanitize import c_comment, c_string

from .layers import ACT_NAMES, CONV_FIELDS, RUN_FIELDS, Field, Layer, Network, kernel_wh, network_to_dict, unpack2

TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "dmp"
INCLUDE_DIR = Path(__file__).resolve().parent / "include"
LAYERS_SUFFIX = "_layers.json"
TITLES = {
    "LT_CONV": "Convolution Layer",
    "LT_FLATTEN": "Flatten Layer",
    "LT_SOFTMAX": "SoftMax Layer",
    "LT_CUSTOM": "Custom Layer",
    "LT_COPY_CONCAT": "Copy Concatenate Layer",
    "LT_CONCAT": "Concatenate Layer",
}


def _fmt(f: Field, value: int) -> str:
    return hex(value) if f.hexed else str(value)


def _doc_rows(index: int, layer: Layer) -> list[list[str]]:
    dim_in = "x".join(map(str, layer.input_dim))
    dim_out = "x".join(map(str, layer.output_dim))
    if layer.conv is None:
        return [[f"{index}", c_comment(layer.name).replace("|", "/"), layer.type, dim_in, dim_out, "-", "-"]]
    rows = []
    for r, run in enumerate(layer.conv.runs):
        kw, kh = kernel_wh(run.p)
        parts = []
        if run.conv_enable:
            parts.append(f"conv {kw}x{kh} s{unpack2(run.conv_stride)[0]}" + (" dw" if run.conv_enable == 3 else ""))
        if run.pool_enable:
            parts.append(f"pool{run.pool_enable} {'x'.join(map(str, unpack2(run.pool_size)))}")
        if run.actfunc:
            parts.append(ACT_NAMES.get(run.actfunc, str(run.actfunc)))
        mem = f"{run.weight_size}" if run.weight_size else "-"
        names = c_comment(", ".join(run.ops)).replace("|", "/")
        rows.append([f"{index}-{r}", names, "CONV", dim_in, dim_out, "; ".join(parts) or "-", mem])
    return rows


def _custom_fields(params: dict[str, Any]) -> list[dict[str, str]]:
    return [{"name": k, "ctype": "size_t" if k.endswith("_offs") else "float"} for k in params]


def _layer_view(index: int, layer: Layer, output_slots: dict[int, int]) -> dict[str, Any]:
    view: dict[str, Any] = {
        "index": index,
        "title": TITLES.get(layer.type, layer.type),
        "name": c_string(layer.name),
        "ops": [c_comment(op) for op in layer.ops],
        "doc": _doc_rows(index, layer),
        "output_slot": output_slots.get(index),
        **{k: getattr(layer, k) for k in ("type", "conv", "input_offs", "output_offs", "output_size")},
        **{k: getattr(layer, k) for k in ("input_dim", "output_dim", "is_output", "is_f32_output")},
        "is_input_hw_layout": layer.is_input_hw_layout,
        "softmax_axis": layer.softmax_axis,
        "custom_type": layer.custom_type,
        "custom_values": [
            repr(float(v)) + "f" if not k.endswith("_offs") else str(v) for k, v in layer.custom_params.items()
        ],
        "input_layers": layer.input_layers,
    }
    if layer.conv is not None:
        conf = layer.conv
        view["topo_bits"] = format(conf.topo, "032b")
        view["conv_fields"] = [
            {"name": f.name, "value": _fmt(f, getattr(conf, f.name)), "comment": f.comment} for f in CONV_FIELDS
        ]
        view["runs"] = [
            {
                "index": r,
                "ops": [c_comment(op) for op in run.ops],
                "weight_offs": run.weight_offs,
                "fields": [
                    {"name": f.name, "value": _fmt(f, getattr(run, f.name)), "comment": f.comment} for f in RUN_FIELDS
                ],
            }
            for r, run in enumerate(conf.runs)
        ]
    return view


def render_sources(net: Network, source: str) -> tuple[str, str]:
    """(header, source) text of the generated C++ class."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    output_slots = {}
    for binding in net.outputs:
        for i, layer in enumerate(net.layers):
            if layer.output_offs == binding.offs and layer.is_output and i not in output_slots:
                output_slots[i] = len(output_slots)
    customs = {}
    for layer in net.layers:
        if layer.type == "LT_CUSTOM" and layer.custom_type not in customs:
            customs[layer.custom_type] = {"type": layer.custom_type, "fields": _custom_fields(layer.custom_params)}
    ctx = {
        "name": net.name,
        "source": c_comment(source),
        "layers": [_layer_view(i, layer, output_slots) for i, layer in enumerate(net.layers)],
        "customs": list(customs.values()),
        "weights_size": net.weights_size,
        "io_size": net.io_size,
        "weight_format": net.weight_format,
        "weights_transposed": net.weights_transposed,
        "num_outputs": len(output_slots),
    }
    return env.get_template("net_gen.h.j2").render(ctx), env.get_template("net_gen.cpp.j2").render(ctx)


def write_output(out_dir: Path, net: Network, blob: bytes, source: str) -> list[Path]:
    """Write the four files into `out_dir` (replaced as a whole, via a temporary sibling folder)."""
    header, cpp = render_sources(net, source)
    table = json.dumps(network_to_dict(net), indent=1, sort_keys=True) + "\n"
    files = {
        f"{net.name}_gen.h": header.encode(),
        f"{net.name}_gen.cpp": cpp.encode(),
        f"{net.name}_weights.bin": blob,
        f"{net.name}{LAYERS_SUFFIX}": table.encode(),
    }
    out_dir = Path(out_dir)
    atomic_write_tree(out_dir, files, what="the dmp target")
    return [out_dir / fname for fname in files]
