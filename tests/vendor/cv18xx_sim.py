"""Harness for the vendor CV18xx simulator (specs/cv18xx-simulator.md): fetch it once, run cvimodels on it.

``ensure_simulator()`` downloads the pinned ``tpu-mlir`` wheel with pip, extracts exactly the three shared
libraries into ``$NPUC_CACHE/cv18xx-sim`` (default ``~/.cache/npuc``), checks their sha256 and deletes the
wheel; a lock file and an atomic rename make parallel workers safe. ``run_vendor(path, feeds)`` runs one model
in a child process (``cv18xx_sim_runner.py``) and returns its outputs; any crash, bad exit or timeout raises
``VendorSimError`` naming the model.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

PACKAGE = "tpu-mlir"
VERSION = "1.30.2"
# wheel member -> sha256 of the extracted library
LIBRARIES = {
    "tpu_mlir/lib/libcviruntime.so": "35e519bd94a245a6c9d9ac1ace3805af6868fa3cbff6db685655b0b49f3977e9",
    "tpu_mlir/lib/libcvikernel.so": "1b775c141d731dead245baae0650e9f1897e8a6e3c064d0be16a3cb6638fb98c",
    "tpu_mlir/lib/libcvicmodel.so": "7725407af2fabc71134dec4f1ff1b897e8f1b92aaf5bbc702326da3afef36566",
}
MAX_LIBRARY_BYTES = 64 << 20  # each is about 1-2 MB; a larger member means the wrong wheel
PIP_TIMEOUT_S = 900
RUN_TIMEOUT_S = 120.0  # a corrupt cmdbuf can make the simulator spin forever
RUNNER = Path(__file__).with_name("cv18xx_sim_runner.py")


class VendorSimError(RuntimeError):
    """The vendor simulator could not be fetched, or a model failed or crashed on it."""


def cache_dir() -> Path:
    """The cache root: $NPUC_CACHE, or ~/.cache/npuc (never inside the repository)."""
    env = os.environ.get("NPUC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "npuc"


def simulator_dir() -> Path:
    return cache_dir() / "cv18xx-sim"


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _installed(folder: Path) -> bool:
    return all((folder / Path(m).name).is_file() for m in LIBRARIES)


def _download_wheel(dest: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.10",
        "--disable-pip-version-check", "-q", "-d", str(dest), f"{PACKAGE}=={VERSION}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise VendorSimError(f"pip download {PACKAGE}=={VERSION} timed out after {PIP_TIMEOUT_S} s") from None
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode or len(wheels) != 1:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise VendorSimError(
            f"could not fetch the vendor CV18xx simulator: pip download {PACKAGE}=={VERSION} exited "
            f"{proc.returncode} ({' | '.join(tail)}); check network access to PyPI"
        )
    return wheels[0]


def _extract_libraries(wheel: Path, dest: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf:
            for member, digest in LIBRARIES.items():
                info = zf.getinfo(member)
                if info.file_size > MAX_LIBRARY_BYTES:
                    raise VendorSimError(f"{wheel.name}: {member} is {info.file_size} bytes, not a library")
                target = dest / Path(member).name
                with zf.open(info) as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                if _sha256(target) != digest:
                    raise VendorSimError(f"{wheel.name}: {member} does not have the pinned sha256 {digest}")
    except (KeyError, zipfile.BadZipFile) as exc:
        raise VendorSimError(f"{wheel.name} is not the expected {PACKAGE} wheel: {exc}") from None


def ensure_simulator() -> Path:
    """The folder holding the three vendor libraries, fetching them on first use."""
    folder = simulator_dir()
    if _installed(folder):
        return folder
    with _locked(cache_dir() / "locks" / "cv18xx-sim.lock"):
        if _installed(folder):  # another worker finished while we waited
            return folder
        tmp_root = cache_dir() / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tmp_root, prefix="cv18xx-sim-") as tmp:
            wheel = _download_wheel(Path(tmp) / "wheel")
            staged = Path(tmp) / "libs"
            staged.mkdir()
            _extract_libraries(wheel, staged)
            wheel.unlink()  # 312 MB; only the three libraries are kept
            if folder.exists():
                shutil.rmtree(folder)
            staged.rename(folder)
    return folder


def run_vendor(
    path: str | os.PathLike[str], feeds: Mapping[str, np.ndarray], timeout_s: float = RUN_TIMEOUT_S
) -> dict[str, np.ndarray]:
    """Run a .cvimodel on the vendor simulator; outputs by name, in the model's order (bf16 as raw uint16)."""
    model = Path(path).resolve()
    if not model.is_file():
        raise VendorSimError(f"no such cvimodel: {model}")
    lib_dir = ensure_simulator()
    with tempfile.TemporaryDirectory(prefix="npuc-cv18xx-sim-") as tmp:
        feeds_path, out_path = Path(tmp) / "feeds.npz", Path(tmp) / "out.npz"
        np.savez(feeds_path, **{k: np.asarray(v) for k, v in feeds.items()})
        cmd = [sys.executable, str(RUNNER), str(lib_dir), str(model), str(feeds_path), str(out_path)]
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise VendorSimError(f"vendor CV18xx simulator timed out after {timeout_s} s on {model}") from None
        if proc.returncode or not out_path.is_file():
            how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited {proc.returncode}"
            # the simulator prints raw header bytes; its last stderr lines say what went wrong
            text = (proc.stderr.strip() or proc.stdout.strip()).decode(errors="replace")
            tail = " | ".join(text.splitlines()[-3:])
            raise VendorSimError(f"vendor CV18xx simulator {how} on {model}: {tail}")
        with np.load(out_path) as out:
            return {name: out[name] for name in out.files}
