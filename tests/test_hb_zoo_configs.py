"""Real hb_mapper YAMLs from public model zoos (../shared/golden/horizon/) build as they stand.

Each YAML is copied unchanged into a folder that holds what its paths name: a small generated ONNX model at
`onnx_model` and raw float32 calibration files (hb_mapper's `cal_data_type: float32` samples, NCHW RGB 0..255)
in `cal_data_dir`. The build then calibrates from those files and writes the hbDNN contract for the YAML's march.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from golden import GOLDEN_ROOT

from npuc.models.make_models import make_model

HORIZON = GOLDEN_ROOT / "horizon"
ZOO = {
    "1_rdkzoo_yolov8_detect_nv12.yaml": "bayes-e",
    "4_rdkzoo_MobileNetV3_config.yaml": "bayes-e",
    "6_sunriseX3_yolov5s_config_X3.yaml": "bernoulli2",
}
SHAPE = (1, 3, 32, 32)  # tinycnn's input


def test_every_zoo_config_is_listed() -> None:
    assert sorted(p.name for p in HORIZON.glob("*.yaml")) == sorted(ZOO)


def _stage(tmp_path: Path, name: str) -> dict:
    shutil.copy(HORIZON / name, tmp_path / name)
    config = yaml.safe_load((HORIZON / name).read_text())
    model = tmp_path / config["model_parameters"]["onnx_model"]
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_bytes(make_model("tinycnn").SerializeToString())
    samples = tmp_path / config["calibration_parameters"]["cal_data_dir"]
    samples.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for k in range(4):  # raw float32 pixels, no header, as hb_mapper's preprocessing scripts write them
        rng.uniform(0, 255, SHAPE).astype(np.float32).tofile(samples / f"sample_{k}.rgb")
    return config


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_config_builds_as_it_stands(tmp_path: Path, name: str) -> None:
    config = _stage(tmp_path, name)
    run = subprocess.run(
        [sys.executable, "-m", "npuc", "build", "--config", str(tmp_path / name)],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    model = config["model_parameters"]
    out = tmp_path / model["working_dir"] / f"{model['output_model_file_prefix']}_bpu"
    contracts = list(out.glob("*.json"))
    assert contracts, sorted(p.name for p in out.iterdir())
    contract = json.loads(contracts[0].read_text())
    assert contract["march"] == ZOO[name]
    table = tmp_path / model["working_dir"] / f"{model['output_model_file_prefix']}_cali_table.txt"
    assert table.is_file() and "threshold" in table.read_text().lower()
    if "node_info" in model:  # per-node int16 placement is named as deliberately ignored, not dropped silently
        assert "model_parameters.node_info: per-node BPU/CPU placement and int16 types are not modelled" in run.stdout


def test_raw_sample_of_the_wrong_size_is_one_line(tmp_path: Path) -> None:
    name = "6_sunriseX3_yolov5s_config_X3.yaml"
    config = _stage(tmp_path, name)
    folder = tmp_path / config["calibration_parameters"]["cal_data_dir"]
    np.zeros(10, np.float32).tofile(folder / "sample_1.rgb")
    run = subprocess.run(
        [sys.executable, "-m", "npuc", "build", "--config", str(tmp_path / name)],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "sample_1.rgb: 40 bytes, but input" in run.stderr and "needs 12288" in run.stderr
