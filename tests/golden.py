"""Where the vendor golden files are (read in place, never copied into the repository).

`$NPUC_SHARED/golden` when set; else `shared/golden` beside the repository (the CI layout); else, for a
clone of a local working copy, `shared/golden` beside that working copy.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _origin_checkout() -> Path | None:
    try:
        url = subprocess.run(
            ["git", "-C", str(REPO), "config", "--get", "remote.origin.url"],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = Path(url)
    return path.resolve() if url and path.is_dir() else None


def _golden_root() -> Path:
    candidates = [REPO.parent / "shared"]
    if os.environ.get("NPUC_SHARED"):
        candidates.insert(0, Path(os.environ["NPUC_SHARED"]))
    origin = _origin_checkout()
    if origin is not None:
        candidates.append(origin.parent / "shared")
    for shared in candidates:
        if (shared / "golden").is_dir():
            return shared / "golden"
    return candidates[0] / "golden"  # tests reading it then fail naming this path


GOLDEN_ROOT = _golden_root()
