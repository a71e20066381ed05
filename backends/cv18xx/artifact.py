"""`.cvimodel` artifacts: inspect (header, sections, tensors, --disasm, DDR traffic) and run from the bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npuc.compiler.artifacts import ArtifactKind, ArtifactOptions, TensorSpec, register_artifact
from npuc.compiler.errors import UserError

from .container import read_cvimodel

MAGIC = b"CviModel"


def _matches(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(len(MAGIC)) == MAGIC or path.suffix.lower() == ".cvimodel"


def _describe(path: Path, options: ArtifactOptions) -> str:
    from .inspect import describe_cvimodel
    from .traffic import describe_traffic

    model = read_cvimodel(path)
    try:
        traffic = describe_traffic(model)
    except UserError as exc:  # an odd descriptor must not hide the rest of the listing
        traffic = f"DDR traffic: not counted ({exc})\n"
    return describe_cvimodel(model, disasm=options.disasm) + traffic


def _inputs(path: Path, options: ArtifactOptions) -> list[TensorSpec]:
    from .container import DTYPES

    model = read_cvimodel(path)
    prog = model.body.programs[0]
    tensors = {t.name: t for t in prog.tensor_map}
    specs = []
    for name in prog.input_tensors:
        t = tensors[name]
        dtype = str(np.dtype(DTYPES[t.dtype]))
        aligned_for = model.chip if t.aligned else None
        specs.append(TensorSpec(name, tuple(t.shape.dim[:4]), dtype, t.pixel_format or None, aligned_for))
    return specs


def _run(path: Path, feeds: dict[str, np.ndarray], options: ArtifactOptions) -> dict[str, np.ndarray]:
    from .sim import run_cvimodel

    return run_cvimodel(read_cvimodel(path), feeds)


register_artifact(ArtifactKind("cvimodel", _matches, _describe, _inputs, _run))
