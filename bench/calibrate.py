"""Calibration throughput and peak memory on a resnet18-shaped 224x224 model, at 20 and 200 samples.

    .venv/bin/python bench/calibrate.py [--method kl] [--batch 1] [--counts 20,200] [--jobs 1,2]

Each count runs once per `--jobs` value (worker processes, passes/calibration/shards.py); the speed-up of the largest
worker count over one process is printed per count. Peak RSS is the driver's and, separately, the largest
worker's.
Each sample count runs in a fresh process so its peak RSS (getrusage ru_maxrss) is its own. The samples are
smooth random pictures stored as .npz. Flat memory means the 200-sample peak equals the 20-sample peak
(within the allocator's noise): statistics are fixed-size histograms and samples are loaded one at a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

INCUMBENT = "tpu-mlir run_calibration (issue figures): ~1 sample/s with KL + tune, 1.1 GB peak RSS"
INCUMBENT_SAMPLES_PER_S = 1.0
MODEL = "resnet18_224"


def make_samples(folder: Path, count: int, shape: tuple[int, ...]) -> None:
    """`count` .npz samples of smooth, image-like noise (low-frequency pattern plus grain)."""
    rng = np.random.default_rng(2024)
    folder.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0 : shape[2], 0 : shape[3]].astype(np.float32) / shape[2]
    for i in range(count):
        f = rng.uniform(1, 6, size=(shape[1], 2)).astype(np.float32)
        phase = rng.uniform(0, 6.28, size=(shape[1], 1, 1)).astype(np.float32)
        pattern = np.sin(f[:, :1, None] * 6.28 * yy + f[:, 1:, None] * 6.28 * xx + phase)
        x = (pattern + 0.3 * rng.standard_normal(shape[1:], dtype=np.float32))[None].astype(np.float32)
        np.savez(folder / f"{i:04d}.npz", input=x)


def run_one(model: Path, data: Path, count: int, method: str, batch: int, jobs: int) -> dict:
    """Calibrate in this process (and its workers) and report samples/s and peak RSS."""
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate

    start = time.perf_counter()
    options = CalibrationOptions(method=method, batch=batch)
    result = calibrate(model, [data], options=options, limit=count, jobs=jobs)
    seconds = time.perf_counter() - start
    return {
        "jobs": jobs,
        "worker_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
        "samples": result.samples,
        "tensors": len(result.stats.tensors),
        "seconds": round(seconds, 2),
        "samples_per_s": round(result.samples / seconds, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="kl")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--counts", default="20,200")
    parser.add_argument("--jobs", default="1,2")
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "DATA", "COUNT", "JOBS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        model, data, count, jobs = args.child
        print(json.dumps(run_one(Path(model), Path(data), int(count), args.method, args.batch, int(jobs))))
        return 0

    from npuc.models.make_models import make_all

    counts = [int(c) for c in args.counts.split(",")]
    with tempfile.TemporaryDirectory(prefix="npuc-bench-cal-") as tmp:
        model = make_all(tmp, [MODEL])[MODEL]
        data = Path(tmp) / "samples"
        make_samples(data, max(counts), (1, 3, 224, 224))
        print(f"model {MODEL} (generated), method {args.method}, batch {args.batch}")
        print(f"{'samples':>8} {'jobs':>5} {'seconds':>8} {'samples/s':>10} {'peak RSS MB':>12} {'worker MB':>10}")
        results = []
        for count in counts:
            per_jobs = {}
            for jobs in [int(j) for j in args.jobs.split(",")]:
                child = [sys.executable, __file__, "--method", args.method, "--batch", str(args.batch)]
                out = subprocess.run(
                    [*child, "--child", str(model), str(data), str(count), str(jobs)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                r = json.loads(out.stdout.strip().splitlines()[-1])
                results.append(r)
                per_jobs[jobs] = r
                print(
                    f"{r['samples']:>8} {jobs:>5} {r['seconds']:>8} {r['samples_per_s']:>10} {r['peak_rss_mb']:>12} "
                    f"{r['worker_rss_mb']:>10}"
                )
            if len(per_jobs) > 1:
                most = max(per_jobs)
                speedup = per_jobs[min(per_jobs)]["seconds"] / per_jobs[most]["seconds"]
                print(f"{count} samples: --jobs {most} is {speedup:.2f}x --jobs {min(per_jobs)}")
    print(f"incumbent: {INCUMBENT}")
    best = max(results, key=lambda r: r["samples"])
    rss = [r["peak_rss_mb"] for r in results]
    print(
        f"goal >= 10x the incumbent: {best['samples_per_s'] / INCUMBENT_SAMPLES_PER_S:.0f}x at {best['samples']} "
        f"samples; peak RSS spread over {', '.join(str(c) for c in counts)} samples: {max(rss) - min(rss):.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
