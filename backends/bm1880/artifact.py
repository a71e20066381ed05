"""`.bmodel` files (all three BM1880 containers) as artifacts: inspect (--disasm for the cmdbufs) and run.

`run` simulates one command from the file's bytes (sim.py). The command is picked by input shape: the
`shape` run option (`npuc run X.bmodel --shape 1,3,24,24`), else an `--input-shape input:1,3,24,24`, else
the shape of the array fed, else the first command. Input names are `input`, `input1`, ... (the format has
none); float inputs are quantized with the command's input threshold, int8 inputs are taken as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npuc.compiler.artifacts import ArtifactKind, ArtifactOptions, TensorSpec, register_artifact

from .container import BModel, load_bmodel
from .inspect import describe_bmodel

# 0xFF55AADD / 0xFF55AAFF little-endian; the legacy JSON container starts with a u32 length then '{'
_MAGICS = (bytes.fromhex("ddaa55ff"), bytes.fromhex("ffaa55ff"))


def _matches(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.read(5)
    return head[:4] in _MAGICS or (len(head) == 5 and head[4:5] == b"{") or path.suffix.lower() == ".bmodel"


def _describe(path: Path, options: ArtifactOptions) -> str:
    return describe_bmodel(load_bmodel(path), disasm=options.disasm)


def requested_shape(options: ArtifactOptions) -> tuple[int, ...] | None:
    """The input shape asked for on the command line (`shape` option or any `--input-shape`), if any."""
    shape = options.extra.get("shape")
    if shape:
        return tuple(shape)
    if options.input_shapes:
        return tuple(next(iter(options.input_shapes.values())))
    return None


def _command_inputs(model: BModel, options: ArtifactOptions) -> list[TensorSpec]:
    from .sim import input_name, select_command

    command = select_command(model, requested_shape(options))
    return [
        TensorSpec(input_name(i), t.shape, "float32" if t.threshold > 0 else "int8")
        for i, t in enumerate(command.inputs)
    ]


def _inputs(path: Path, options: ArtifactOptions) -> list[TensorSpec]:
    return _command_inputs(load_bmodel(path), options)


def _run(path: Path, feeds: dict[str, np.ndarray], options: ArtifactOptions) -> dict[str, np.ndarray]:
    from .sim import run_bmodel

    return run_bmodel(load_bmodel(path), feeds, requested_shape(options), str(path))


register_artifact(ArtifactKind("bmodel", _matches, _describe, _inputs, _run))
