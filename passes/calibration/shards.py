"""The calibration passes split over workers: local processes (`--jobs N`) or a Ray cluster (`--ray ADDR`).

The samples are cut into contiguous chunks; each chunk is one task that runs the pinned model over its samples
and returns its statistics: ranges (with the global histogram's grid, all a one-pass run needs), or, in a second
pass, histograms over merged, frozen ranges. Merging is exact (min/max and integer counts,
passes/calibration/histogram.py), so the table is byte-identical to a one-process run whatever the number of
workers, the chunking or the order in which tasks finish.

The task itself (passes/calibration/calibrate.py `run_shard`) is handed in: this module knows workers, not models.
Ray does the scheduling, retries and object transfer for the cluster case: a task lost with its worker runs
again elsewhere, and since every task is a pure function of its chunk the result does not change.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from npuc.compiler.errors import UserError
from npuc.frontends.onnx import InputShapes
from npuc.passes.calibration.histogram import CalibrationStats
from npuc.passes.calibration.preprocess import Preprocess

# Fewer samples than this per worker cost more in start-up (an interpreter, onnxruntime, the model) than they save.
MIN_SAMPLES_PER_JOB = 16
CHUNKS_PER_JOB = 4  # several chunks per worker: progress moves and a slow worker does not hold the rest
RAY_TASK_RETRIES = 3
RAY_EXTRA_HINT = "pip install 'npuc[ray]'"


@dataclass(frozen=True)
class ShardJob:
    """Everything a worker needs to run one chunk; plain data, so it pickles to any process or machine."""

    model_path: str
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    batch: int
    bins: int
    pre: Preprocess
    files: tuple[str, ...]
    ranges: CalibrationStats | None  # None: pass 1 (ranges); else pass 2 (histograms over these frozen ranges)
    threads: int
    first: int = 0  # the place of files[0] in the whole sample list: pass 1 numbers the samples from it
    histogram: str = "global"  # the histogram geometry (passes/calibration/histogram.py)
    grid: bool = False  # pass 1 also bins the global histogram's grid (then there is no pass 2)
    observed: tuple[tuple[str, str], ...] = ()  # the driver's plan: ONNX tensor -> table name (empty: plan anew)


def default_jobs() -> int:
    """The cores this process may use (the CPU affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def effective_jobs(requested: int | None, samples: int) -> int:
    """Workers worth starting for `samples` samples: at most `requested` (default: all cores)."""
    if requested is not None and not 1 <= requested <= 1024:
        raise UserError(f"--jobs {requested} must be between 1 and 1024")
    wanted = default_jobs() if requested is None else requested
    return max(1, min(wanted, samples // MIN_SAMPLES_PER_JOB))


def chunk_files(files: Sequence[Path], jobs: int, batch: int) -> list[tuple[str, ...]]:
    """Contiguous chunks, whole batches each, about CHUNKS_PER_JOB per worker."""
    count = max(1, min(len(files), jobs * CHUNKS_PER_JOB))
    size = -(-len(files) // count)
    size = -(-size // batch) * batch
    return [tuple(str(f) for f in files[i : i + size]) for i in range(0, len(files), size)]


# ---------------------------------------------------------------------------------------------------------
# Executors: each runs `task` on every job and yields (job index, statistics) as tasks finish

Task = Callable[[ShardJob], CalibrationStats]  # a module-level function: it is pickled by reference


Warm = tuple[Callable[..., None], tuple]  # (a module-level function, its arguments): what a worker does first


class LocalProcesses:
    """A pool of worker processes on this machine (spawned: onnxruntime's threads do not survive a fork).

    The workers start at once, each running `warm` (the imports its tasks need, say) while the caller goes on:
    their interpreter start and set-up overlap the driver's own instead of following it."""

    def __init__(self, jobs: int, warm: Warm | None = None) -> None:
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            # A spawned worker re-running an unguarded script's top level: stop before the pool makes its queues,
            # whose semaphores would outlive this process (the parent then reports the stopped worker).
            raise UserError("a calibration worker cannot start calibrations of its own; see the parent's error")
        self.jobs = jobs
        initializer, initargs = warm or (None, ())
        self.pool = ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=initializer,
                                        initargs=initargs)  # fmt: skip
        for _ in range(jobs):  # the pool spawns a worker per task waiting for one: all of them, now
            self.pool.submit(_started)

    def map(self, task: Task, jobs: Sequence[ShardJob]) -> Iterator[tuple[int, CalibrationStats]]:
        try:
            futures = {self.pool.submit(task, job): k for k, job in enumerate(jobs)}
            for future in as_completed(futures):
                yield futures[future], future.result()
        except BrokenProcessPool:
            raise UserError(
                "a calibration worker process stopped (killed, out of memory, or started from a Python script "
                'whose code is not under `if __name__ == "__main__":`, which spawned workers need); guard the '
                "script, or calibrate in one process with --jobs 1 (jobs=1)"
            ) from None

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


class RayCluster:
    """Tasks on a Ray cluster (`auto`: the one `ray start` made here; else its address)."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise UserError(f"--ray needs the ray extra, which is not installed; run: {RAY_EXTRA_HINT}") from None
        self.ray = ray
        if not ray.is_initialized():
            try:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                message = " ".join(str(exc).split())[:200]
                hint = "start one with: ray start --head"
                raise UserError(f"--ray {address}: cannot join the cluster ({message}); {hint}") from None
        self.jobs = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def map(self, task: Task, jobs: Sequence[ShardJob]) -> Iterator[tuple[int, CalibrationStats]]:
        remote = self.ray.remote(max_retries=RAY_TASK_RETRIES, retry_exceptions=False)(task)
        refs = {remote.remote(job): k for k, job in enumerate(jobs)}
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            yield refs[done[0]], self.ray.get(done[0])

    def close(self) -> None:
        pass  # the cluster outlives the job; the driver disconnects at exit


def _started() -> None:
    """The task that makes the pool start a worker."""


def open_executor(jobs: int, ray_address: str | None, warm: Warm | None = None) -> LocalProcesses | RayCluster:
    """Ray's workers are the cluster's, already running; local ones start now, each running `warm` first."""
    return RayCluster(ray_address) if ray_address else LocalProcesses(jobs, warm)


def run_pass(
    executor: LocalProcesses | RayCluster,
    task: Task,
    jobs: Sequence[ShardJob],
    advance: Callable[[int], None],
) -> CalibrationStats:
    """Run one pass's chunks and merge their statistics in chunk order (the bytes do not depend on it)."""
    results: dict[int, CalibrationStats] = {}
    for k, stats in executor.map(task, jobs):
        results[k] = stats
        advance(len(jobs[k].files))
    merged = results[0]
    for k in range(1, len(jobs)):
        merged = merged.merge(results[k])
    return merged


def shard_jobs(
    model_path: str | Path,
    input_shapes: InputShapes | None,
    files: Sequence[Path],
    pre: Preprocess,
    batch: int,
    bins: int,
    workers: int,
    ranges: CalibrationStats | None,
    histogram: str = "global",
    cores: int | None = None,
    grid: bool = False,
    observed: tuple[tuple[str, str], ...] = (),
) -> list[ShardJob]:
    """The chunks of one pass; each worker's onnxruntime gets its share of `cores` (default: every core)."""
    shapes = tuple(sorted((name, tuple(int(d) for d in dims)) for name, dims in (input_shapes or {}).items()))
    threads = max(1, (cores or default_jobs()) // workers)
    chunks = chunk_files(files, workers, batch)
    starts = [sum(len(c) for c in chunks[:k]) for k in range(len(chunks))]
    path = str(Path(model_path).resolve())
    return [
        ShardJob(path, shapes, batch, bins, pre, chunk, ranges, threads, start, histogram, grid, observed)
        for chunk, start in zip(chunks, starts)
    ]
