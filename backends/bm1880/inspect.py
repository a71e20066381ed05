"""Human-readable summary of a BM1880 bmodel (what `npuc inspect` prints)."""

from __future__ import annotations

from collections import Counter

from .cmdbuf import decode_cmdbuf, format_instruction
from .container import BModel, TensorInfo

CONTAINER_NAMES = {
    "proto+weights": "protobuf + weight area (magic 0xFF55AADD)",
    "proto": "protobuf with embedded weights (magic 0xFF55AAFF)",
    "json": "legacy JSON v0.1.1 (magic 0x55AAAA55)",
}


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _tensor_line(kind: str, tensor: TensorInfo, index: int) -> str:
    name = tensor.name or f"#{index}"
    threshold = f"{tensor.threshold:.6g}" if tensor.threshold else "unset"
    fmt = "" if tensor.fmt is None else f" fmt={tensor.fmt}"
    return (
        f"    {kind} {name}: shape {_shape(tensor.shape)} offset {tensor.offset} "
        f"({tensor.size} B) threshold {threshold}{fmt}"
    )


def describe_bmodel(model: BModel, disasm: bool = False) -> str:
    """Net, chip, container, weight blobs and, per command, shapes, neuron size, I/O and instruction mix."""
    lines = [
        f"net {model.net_name!r}  chip {model.chip}  fmt {model.fmt}  node_num {model.node_num}  "
        f"type {model.type!r}  version {model.version!r}",
        f"container: {CONTAINER_NAMES.get(model.container, model.container)}",
        f"weight blobs: {len(model.weights)}"
        + "".join(f"\n    blob {i}: {len(blob)} B" for i, blob in enumerate(model.weights)),
    ]
    for lib in model.libraries:
        lines.append(f"library {lib.name!r}: x86_64 {len(lib.lib_x86_64)} B, armv8 {len(lib.lib_armv8)} B")
    lines.append(f"commands: {len(model.commands)}")
    for index, command in enumerate(model.commands):
        instructions = decode_cmdbuf(command.cmdbuf, f"command {index} cmdbuf")
        mix = Counter(i.mnemonic for i in instructions)
        mix_text = ", ".join(f"{mix[k]} {k}" for k in sorted(mix))
        shapes = ", ".join(_shape(t.shape) for t in command.inputs)
        lines.append(
            f"  command {index}: input {shapes}  neuron_size {command.neuron_size}  "
            f"weight blob {command.weight_index}  cmdbuf {len(command.cmdbuf)} B ({mix_text})"
        )
        lines.extend(_tensor_line("input ", t, i) for i, t in enumerate(command.inputs))
        lines.extend(_tensor_line("output", t, i) for i, t in enumerate(command.outputs))
        if disasm:
            lines.extend("      " + format_instruction(i) for i in instructions)
    return "\n".join(lines) + "\n"
