"""The Python API the CLI stands on: same bytes as the command line, UserError instead of exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from samples import random_samples

from npuc.models.make_models import make_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("api") / "tinycnn.onnx"
    path.write_bytes(make_model("tinycnn").SerializeToString())
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npuc", *args], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("target, extra", [("cv18xx", {"quant": "bf16"}), ("lyngor", {}), ("dmp", {})])
def test_api_build_writes_the_cli_bytes(model: Path, tmp_path: Path, target: str, extra: dict) -> None:
    import npuc

    flags = [f"--{k}={v}" for k, v in extra.items()]
    cli, api = tmp_path / "cli.out", tmp_path / "api.out"
    assert _cli("build", str(model), "--target", target, *flags, "-o", str(cli)).returncode == 0
    result = npuc.build(model, target, api, depfile=tmp_path / "api.d", **extra)
    assert result.target == target and all(Path(a).is_relative_to(api) for a in result.artifacts)

    def files(root: Path) -> dict[str, bytes]:
        if root.is_file():
            return {"": root.read_bytes()}
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    assert files(cli) == files(api) and files(api)
    assert (tmp_path / "api.d").read_text().endswith(f": {model}\n")


def test_api_raises_user_errors(model: Path, tmp_path: Path) -> None:
    import npuc

    with pytest.raises(npuc.UserError, match="--quant fp16 is not a number format of target 'cv18xx'"):
        npuc.build(model, "cv18xx", tmp_path / "x.cvimodel", quant="fp16")
    with pytest.raises(npuc.UserError, match="match no op or tensor"):
        npuc.build(model, "cv18xx", tmp_path / "x.cvimodel", quant="bf16", options={"float_layers": ["nosuch"]})
    assert not list(tmp_path.iterdir())


def test_api_inspect_and_run(model: Path, tmp_path: Path) -> None:
    import npuc

    (artifact,) = npuc.build(model, "cv18xx", tmp_path / "m.cvimodel", quant="bf16").artifacts
    assert npuc.inspect(artifact).rstrip("\n") == _cli("inspect", str(artifact)).stdout.rstrip("\n")
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    ours = npuc.run(artifact, {"input": x})["output"]
    reference = npuc.run(model, {"input": x})["output"]
    assert ours.shape == (1, 10, 1, 1) and np.corrcoef(ours.ravel(), reference.ravel())[0, 1] > 0.999


def test_version_and_lazy_import() -> None:
    import tomllib

    import npuc

    run = _cli("--version")
    assert run.returncode == 0 and run.stdout.strip() == f"npuc {npuc.__version__}"
    project = tomllib.loads((Path(npuc.__file__).parent / "pyproject.toml").read_text())["project"]
    assert project["version"] == npuc.__version__  # one version: compiler/version.py mirrors the package's
    probe = "import sys, npuc; print('npuc.api' in sys.modules, 'onnx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]  # `import npuc` loads nothing heavy until the API is used


def test_api_calibrate_writes_the_cli_table(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import npuc

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")  # the table's header carries a time
    data = random_samples(tmp_path / "data", (1, 3, 32, 32), 6)
    cli, api = tmp_path / "cli.txt", tmp_path / "api.txt"
    run = _cli("calibrate", str(model), "--data", str(data), "-o", str(cli), "--save-stats", str(tmp_path / "c.npz"))
    assert run.returncode == 0, run.stderr
    done = npuc.calibrate(model, [data], api, save_stats=tmp_path / "a.npz")  # both choose the method (auto)
    assert cli.read_text() == api.read_text() and done.result.samples == 6 and done.result.table is not None
    assert any(line.startswith("threshold method ") for line in done.details)
    run = _cli("calibrate", str(model), "--data", str(data), "-o", str(tmp_path / "j.txt"), "--json")
    record = json.loads(run.stdout)  # --json: the API's record, same table
    same = {k: v for k, v in done.record(tmp_path / "j.txt").items() if k != "details"}  # details hold speeds
    assert {k: v for k, v in record.items() if k != "details"} == same and len(record["details"]) == len(done.details)
    assert record["method"].startswith("auto (") and record["samples"] == 6 and not run.stderr
    npuc.calibrate(model, [data], api, method="kl")  # what merging the statistics gives (KL, no samples to measure)
    assert any("calibrated" in line for line in done.details)
    merged = npuc.merge_calibration([tmp_path / "a.npz"], tmp_path / "m.txt")
    assert (tmp_path / "m.txt").read_text() == api.read_text() and merged is not None
    with pytest.raises(npuc.UserError, match="nothing to write"):
        npuc.calibrate(model, [data])
    with pytest.raises(npuc.UserError, match="--target-cos needs at least 2 samples"):
        npuc.calibrate(model, [data / "0.npy"], tmp_path / "t.txt", target_cos=0.99)
