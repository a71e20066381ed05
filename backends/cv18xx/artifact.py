"""`.cvimodel` files as artifacts: inspect (header, sections, tensors, --disasm) and run from the bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from npuc.compiler.artifacts import ArtifactKind, ArtifactOptions, TensorSpec, register_artifact

from .container import read_cvimodel
from .inspect import describe_cvimodel

MAGIC = b"CviModel"


def _matches(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(len(MAGIC)) == MAGIC or path.suffix.lower() == ".cvimodel"


def _describe(path: Path, options: ArtifactOptions) -> str:
    return describe_cvimodel(read_cvimodel(path), disasm=options.disasm)


def _inputs(path: Path, options: ArtifactOptions) -> list[TensorSpec]:
    from .sim import DTYPES

    prog = read_cvimodel(path).body.programs[0]
    tensors = {t.name: t for t in prog.tensor_map}
    specs = []
    for name in prog.input_tensors:
        t = tensors[name]
        specs.append(TensorSpec(name, tuple(t.shape.dim[:4]), str(np.dtype(DTYPES[t.dtype]))))
    return specs


def _run(path: Path, feeds: dict[str, np.ndarray], options: ArtifactOptions) -> dict[str, np.ndarray]:
    from .sim import run_cvimodel

    return run_cvimodel(read_cvimodel(path), feeds)


register_artifact(ArtifactKind("cvimodel", _matches, _describe, _inputs, _run))
