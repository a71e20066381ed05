"""The checked .npy / .npz reader: damaged, hostile and oversized files end in one CorruptFileError."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from npuc.compiler.arrays import MAX_ARRAY_BYTES, load_arrays
from npuc.compiler.errors import CorruptFileError, UserError

MEMORY_LIMIT = 1 << 30  # the bombs below must be refused inside 1 GiB of address space beyond the interpreter's


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def _npy_bytes(header: str, data: bytes = b"") -> bytes:
    text = header.encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    body = text + b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body + data


def test_plain_files_round_trip(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = load_arrays(_npz(tmp_path / "a.npz", x=x, y=x.T.copy()))
    assert list(got) == ["x", "y"] and np.array_equal(got["x"], x) and np.array_equal(got["y"], x.T)
    np.save(tmp_path / "b.npy", np.asfortranarray(x))
    assert np.array_equal(load_arrays(tmp_path / "b.npy")[""], x)


@pytest.mark.parametrize(
    "header, match",
    [
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 1000000), }", "more than the"),
        ("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (2,), }", "plain number"),
        ("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", "plain number"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (2,", "not a .npy array"),
        ("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", "not a .npy array|negative"),
        ("__import__('os').system('echo pwned')", "not a .npy array"),
    ],
)
def test_hostile_npy_headers_are_refused(tmp_path: Path, header: str, match: str) -> None:
    path = tmp_path / "h.npy"
    path.write_bytes(_npy_bytes(header, b"\0" * 8))
    with pytest.raises(CorruptFileError, match=match):
        load_arrays(path)


def test_header_and_data_must_agree(tmp_path: Path) -> None:
    path = tmp_path / "short.npy"
    path.write_bytes(_npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", b"\0" * 12))
    with pytest.raises(CorruptFileError, match="16 data bytes"):
        load_arrays(path)


def test_zip_bomb_is_refused_from_its_declared_size(tmp_path: Path) -> None:
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:  # 1.5 GiB of zeros, a few MB on disk
            f.write(_npy_bytes(f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({3 << 29},), }}"))
            chunk = bytes(1 << 24)
            for _ in range(96):
                f.write(chunk)
    assert path.stat().st_size < 8 << 20
    with pytest.raises(CorruptFileError, match=f"exceed the {MAX_ARRAY_BYTES}-byte limit"):
        load_arrays(path)


def test_member_that_lies_about_its_size_is_refused(tmp_path: Path) -> None:
    """A member whose .npy header claims more elements than the member holds (a forged header)."""
    path = tmp_path / "lie.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", _npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000,), }", b"\0" * 8))
    with pytest.raises(CorruptFileError, match="header promises 8000000 data bytes"):
        load_arrays(path)


def test_seeded_byte_mutations_end_cleanly(tmp_path: Path) -> None:
    """Every single-byte mutation of a small .npz loads or fails with one CorruptFileError/UserError."""
    rng = np.random.default_rng(11)
    good = io.BytesIO()
    np.savez_compressed(good, x=rng.standard_normal((2, 3, 8, 8)).astype(np.float32), n=np.arange(5))
    data = good.getvalue()
    outcomes = {"ok": 0, "refused": 0}
    for k in range(300):
        mutated = bytearray(data)
        pos = int(rng.integers(len(mutated)))
        mutated[pos] = int(rng.integers(256))
        path = tmp_path / f"m{k}.npz"
        path.write_bytes(bytes(mutated))
        try:
            load_arrays(path)
            outcomes["ok"] += 1
        except UserError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100 and sum(outcomes.values()) == 300


def test_bombs_stay_within_a_memory_limit(tmp_path: Path) -> None:
    """The same refusals in a child process whose address space is capped: nothing large is allocated."""
    header = _npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }")
    (tmp_path / "huge.npy").write_bytes(header)
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as z:
        z.writestr("x.npy", header)
    script = (
        "import resource\n"
        "from npuc.compiler.arrays import load_arrays\n"
        "from npuc.compiler.errors import UserError\n"
        "import os\n"
        "rss = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE')\n"
        f"resource.setrlimit(resource.RLIMIT_AS, (rss + {MEMORY_LIMIT}, rss + {MEMORY_LIMIT}))\n"
        "for name in ('huge.npy', 'huge.npz'):\n"
        "    try:\n"
        f"        load_arrays({str(tmp_path)!r} + '/' + name)\n"
        "    except UserError as exc:\n"
        "        print('refused', name)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0, run.stderr[-500:]
    assert run.stdout.split("\n")[:2] == ["refused huge.npy", "refused huge.npz"]
