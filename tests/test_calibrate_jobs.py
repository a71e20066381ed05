"""Calibration over worker processes (`--jobs`) and a Ray cluster (`--ray`): the table never changes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from npuc.models.make_models import make_model
from npuc.passes.calibration import shards
from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate
from npuc.passes.calibration.calitable import write_table

METHODS = ("kl", "max", "mse", "percentile")
SAMPLES = 40


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("jobs")
    model = root / "tinycnn.onnx"
    model.write_bytes(make_model("tinycnn").SerializeToString())
    data = root / "samples"
    data.mkdir()
    rng = np.random.default_rng(3)
    for k in range(SAMPLES):  # different scales per sample: chunk ranges differ, the merge must restore the whole
        x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32) * (0.5 + k / 10)
        np.savez(data / f"{k:03d}.npz", input=x)
    return model, data


def _table_bytes(tmp: Path, model: Path, data: Path, method: str, **where) -> bytes:
    result = calibrate(model, [data], options=CalibrationOptions(method=method), **where)
    path = tmp / f"{method}_{sorted(where.items())}.txt"
    write_table(result.table, path)
    return path.read_bytes()


def test_workers_are_capped_by_the_sample_count() -> None:
    assert shards.effective_jobs(8, 15) == 1  # fewer than MIN_SAMPLES_PER_JOB each: stay in this process
    assert shards.effective_jobs(2, 40) == 2
    assert shards.effective_jobs(None, 10_000) == shards.default_jobs()
    chunks = shards.chunk_files([Path(f"{k}") for k in range(41)], jobs=2, batch=4)
    assert [len(c) for c in chunks] == [8, 8, 8, 8, 8, 1] and sum(chunks, ()) == tuple(str(k) for k in range(41))


@pytest.mark.parametrize("method", METHODS)
def test_two_processes_give_the_one_process_table(tmp_path: Path, workload: tuple[Path, Path], method: str) -> None:
    model, data = workload
    one = _table_bytes(tmp_path, model, data, method, jobs=1)
    two = _table_bytes(tmp_path, model, data, method, jobs=2)
    assert one == two and b"threshold" in one.lower()


def test_jobs_out_of_range_is_a_user_error(tmp_path: Path, workload: tuple[Path, Path]) -> None:
    model, data = workload
    run = subprocess.run(
        [sys.executable, "-m", "npuc", "calibrate", str(model), "--data", str(data), "-o", str(tmp_path / "t"),
         "--jobs", "0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and "--jobs 0 must be between 1 and 1024" in run.stderr


def test_an_unguarded_script_gets_one_clear_error(tmp_path: Path, workload: tuple[Path, Path]) -> None:
    """Spawned workers re-run a script's top level; without the `__main__` guard they cannot start, and the
    caller gets a UserError saying so, not a BrokenProcessPool."""
    model, data = workload
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import npuc\n"
        f"npuc.calibrate({str(model)!r}, [{str(data)!r}], {str(tmp_path / 't.txt')!r}, method='kl', jobs=2)\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    # Exception lines only: the resource tracker may still print its own shutdown warnings after the exit.
    errors = [line for line in run.stderr.splitlines() if line.startswith(("npuc.", "concurrent.", "RuntimeError"))]
    assert errors and "BrokenProcessPool" not in run.stderr, run.stderr
    assert errors[-1].startswith("npuc.compiler.errors.UserError: a calibration worker process stopped")
    assert "--jobs 1" in errors[-1]
    assert not (tmp_path / "t.txt").exists()


def test_ray_without_the_extra_names_the_install(tmp_path: Path, workload: tuple[Path, Path]) -> None:
    model, data = workload
    blocker = tmp_path / "noray"
    blocker.mkdir()
    (blocker / "ray.py").write_text("raise ImportError('no ray here')\n")  # shadows an installed ray
    run = subprocess.run(
        [sys.executable, "-m", "npuc", "calibrate", str(model), "--data", str(data), "-o", str(tmp_path / "t"),
         "--ray", "auto"],
        capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(blocker)},
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "pip install 'npuc[ray]'" in run.stderr
    assert not (tmp_path / "t").exists()


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and two worker nodes on this machine, one CPU each (Ray's own multi-node test harness)."""
    import ray  # part of the dev install: its absence fails these tests
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, workers
    ray.shutdown()
    cluster.shutdown()


def test_ray_cluster_gives_the_one_process_table(tmp_path: Path, workload: tuple[Path, Path], ray_cluster) -> None:
    cluster, _ = ray_cluster
    model, data = workload
    for method in METHODS:
        here = _table_bytes(tmp_path, model, data, method, jobs=1)
        assert _table_bytes(tmp_path, model, data, method, ray_address=cluster.address) == here, method


def test_ray_survives_a_lost_worker(tmp_path: Path, workload: tuple[Path, Path], ray_cluster) -> None:
    cluster, workers = ray_cluster
    model, data = workload
    here = _table_bytes(tmp_path, model, data, "kl", jobs=1)
    done: list[int] = []
    killed = threading.Event()

    def progress(label: str, total: int):
        def advance(n: int) -> None:
            done.append(n)
            if len(done) == 2 and not killed.is_set():  # mid-run: tasks are still queued or running
                cluster.remove_node(workers[0])
                killed.set()

        return advance

    result = calibrate(model, [data], options=CalibrationOptions(method="kl"), ray_address=cluster.address,
                       progress=progress)  # fmt: skip
    write_table(result.table, tmp_path / "lost.txt")
    assert killed.is_set() and sum(done) == SAMPLES  # one pass: the ranges bin the global histogram's grid
    assert (tmp_path / "lost.txt").read_bytes() == here


@pytest.mark.parametrize(("jobs", "threads"), [(1, 1), (2, 2), (None, 0)])
def test_jobs_counts_cores_in_process_too(
    jobs: int | None, threads: int, tmp_path: Path, workload: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--jobs N is the cores used: with too few samples for workers the one session gets N threads (--jobs 1:
    one thread, what `make -j1` users expect); no --jobs: onnxruntime's default, every core."""
    from npuc.passes.calibration import calibrate as calibrate_module

    made: list[int] = []
    real = calibrate_module.TensorTap

    def tap(plan, batch, threads=0):  # noqa: ANN001, ANN202
        made.append(threads)
        return real(plan, batch, threads=threads)

    monkeypatch.setattr(calibrate_module, "TensorTap", tap)
    model, data = workload
    calibrate(model, [data], options=CalibrationOptions(method="max"), limit=8, jobs=jobs)
    assert made == [threads]


def test_workers_share_the_cores_asked_for(workload: tuple[Path, Path]) -> None:
    model, data = workload
    files = sorted(data.glob("*.npz"))
    pre = shards.Preprocess()
    jobs = shards.shard_jobs(model, None, files, pre, 1, 2048, 2, None, cores=4)
    assert {job.threads for job in jobs} == {2}
    assert {job.threads for job in shards.shard_jobs(model, None, files, pre, 1, 2048, 2, None, cores=2)} == {1}
