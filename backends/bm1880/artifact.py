"""`.bmodel` files (all three BM1880 containers) as artifacts: inspect, with --disasm for the cmdbufs."""

from __future__ import annotations

from pathlib import Path

from npuc.compiler.artifacts import ArtifactKind, ArtifactOptions, register_artifact

from .container import load_bmodel
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


register_artifact(ArtifactKind("bmodel", _matches, _describe))
