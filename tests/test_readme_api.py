"""The README's Python API script runs as written and gives the CLI's bytes (issue 20's must-show)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from npuc.models.make_models import make_model

README = Path(__file__).resolve().parents[1] / "README.md"


def _api_script() -> str:
    section = README.read_text().split("## Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README: no python block under '## Python API'"
    return match.group(1)


def _cli_lines() -> list[list[str]]:
    """The CLI commands the README gives as the script's equivalent (in backticks after the block)."""
    section = README.read_text().split("## Python API", 1)[1].split("##", 1)[0]
    commands = re.findall(r"`(npuc (?:calibrate|build) [^`]+)`", section.replace("\n", " "))
    assert [c.split()[1] for c in commands] == ["calibrate", "build"], commands
    return [c.split()[1:] for c in commands]


def test_readme_api_script_gives_the_cli_bytes(tmp_path: Path) -> None:
    api, cli = tmp_path / "api", tmp_path / "cli"
    for folder in (api, cli):
        (folder / "out" / "models").mkdir(parents=True)
        (folder / "out" / "models" / "tinycnn.onnx").write_bytes(make_model("tinycnn").SerializeToString())
        rng = np.random.default_rng(0)
        (folder / "samples").mkdir()
        for i in range(12):
            np.savez(folder / "samples" / f"{i:02d}.npz", input=rng.standard_normal((1, 3, 32, 32), np.float32))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    script = subprocess.run([sys.executable, "-c", _api_script()], cwd=api, capture_output=True, text=True, env=env)
    assert script.returncode == 0, script.stderr[-2000:]
    for args in _cli_lines():
        run = subprocess.run([sys.executable, "-m", "npuc", *args], cwd=cli, capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr[-2000:]
    written = sorted(p.name for p in api.iterdir() if p.is_file())
    assert "tinycnn.cali_table" in written and "tinycnn.cvimodel" in written, written
    for name in written:
        assert (api / name).read_bytes() == (cli / name).read_bytes(), f"{name} differs between the API and the CLI"
