"""tpu-mlir run live, for the benches' side-by-side rows: `TPU_MLIR_VENV` names a venv with tpu-mlir installed.

    python3.10 -m venv /tmp/tpumlir && /tmp/tpumlir/bin/pip install tpu-mlir==1.30.2 torch \
        onnx==1.14.1 onnxruntime==1.16.3 onnxsim psutil scipy "setuptools<70"  # tpu_mlir imports pkg_resources
    mv /tmp/tpumlir/lib/python3.10/site-packages/tpu_mlir/lib/third_party/libc.so.6{,.aside}  # older than the system's
    TPU_MLIR_VENV=/tmp/tpumlir .venv/bin/python bench/vs_tpumlir.py

The flow is tpu-mlir's documented one with its defaults: `model_transform` (ONNX -> top MLIR), `run_calibration`
on the same samples npuc calibrates on (written as .npz files, so no preprocessing differs), then
`model_deploy --quantize INT8 --chip cv183x`. CPU seconds are the children's user + system time.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import numpy as np


class ToolFailed(RuntimeError):
    """A tpu-mlir tool exited non-zero (its crash is a result of the comparison, not the bench's failure)."""


def venv() -> Path | None:
    """The tpu-mlir venv from TPU_MLIR_VENV, or None when it is not set (the benches then print their stored rows)."""
    path = os.environ.get("TPU_MLIR_VENV")
    if not path:
        return None
    if not (Path(path) / "bin" / "model_deploy").is_file():
        raise SystemExit(f"TPU_MLIR_VENV={path}: no bin/model_deploy there; install tpu-mlir into that venv")
    return Path(path)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_tool(tool: str, args: list[str], cwd: Path) -> float:
    """Run one tpu-mlir tool in `cwd`; its CPU seconds. A failure raises ToolFailed with the tool's last lines."""
    home = venv()
    assert home is not None
    env = {**os.environ, "PATH": f"{home / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(home)}
    before = _children_cpu()
    done = subprocess.run([str(home / "bin" / tool), *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stdout + done.stderr).splitlines() if not line.lstrip().startswith("#")]
        raise ToolFailed(f"tpu-mlir {tool} failed (exit {done.returncode}): " + " | ".join(lines[-3:])[-400:])
    return _children_cpu() - before


def write_samples(feeds: list[dict[str, np.ndarray]], folder: Path) -> Path:
    """The calibration samples as .npz files in `folder` (tpu-mlir's run_calibration reads a folder of them)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, feed in enumerate(feeds):
        np.savez(folder / f"{i:04d}.npz", **feed)
    return folder


def transform(model: Path, feeds: list[dict[str, np.ndarray]], folder: Path, name: str) -> tuple[Path, float]:
    """`model_transform` of the ONNX model at the samples' shapes: the top MLIR and its CPU seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    shapes = ",".join(f"[{','.join(str(d) for d in v.shape)}]" for v in feeds[0].values())
    mlir = folder / f"{name}.mlir"
    seconds = run_tool(
        "model_transform",
        ["--model_name", name, "--model_def", str(model), "--input_shapes", f"[{shapes}]", "--mlir", str(mlir)],
        folder,
    )
    return mlir, seconds


def calibrate(mlir: Path, samples: Path, count: int, chip: str = "cv183x") -> tuple[Path, float]:
    """`run_calibration` with its defaults (KL, tune 5) on `count` samples: the table and its CPU seconds."""
    table = mlir.with_suffix(".cali_table")
    args = [str(mlir), "--dataset", str(samples), "--input_num", str(count), "--chip", chip, "-o", str(table)]
    return table, run_tool("run_calibration", args, mlir.parent)


def deploy(mlir: Path, table: Path, chip: str = "cv183x") -> tuple[Path, float]:
    """`model_deploy --quantize INT8` for `chip`: the cvimodel and its CPU seconds."""
    out = mlir.with_name(f"{mlir.stem}_{chip}_int8.cvimodel")
    args = ["--mlir", str(mlir), "--quantize", "INT8", "--calibration_table", str(table), "--chip", chip]
    return out, run_tool("model_deploy", [*args, "--model", str(out)], mlir.parent)


def build_int8(
    model: Path, calib: list[dict[str, np.ndarray]], folder: Path, name: str, chip: str = "cv183x"
) -> tuple[Path, dict[str, float]]:
    """tpu-mlir's default int8 cvimodel of `model` calibrated on `calib`, and the CPU seconds of each step."""
    mlir, t_transform = transform(model, calib, folder, name)
    table, t_calibrate = calibrate(mlir, write_samples(calib, folder / "samples"), len(calib), chip)
    cvimodel, t_deploy = deploy(mlir, table, chip)
    return cvimodel, {"transform": t_transform, "calibrate": t_calibrate, "deploy": t_deploy}
