"""Mutated files of every kind npuc reads, through the API the CLI uses: outcome counts per format.

    .venv/bin/python bench/fuzz.py [--count 10000] [--formats cvimodel,npz] [--seed 0]

Seeds are made here from the bundled tinycnn (built for each target) and a calibration of it. Each case is
one seeded mutation (bit flips, byte runs, truncation, a chunk repeated; for the JSON/YAML inside folder
artifacts and configs, and for the op list inside the Lyngor program file (`lyngor_program`, re-wrapped with
a valid CRC), a value replaced by one of another type or out of range) read the way the CLI would (`npuc
inspect`, `npuc run`, the table readers, `build --config`). Outcomes:
- `ok` (read fine) and `user` (npuc.UserError: exit 2, one line) are the only acceptable ones;
- `internal` (any other exception: exit 1), `hang` (over --timeout seconds of CPU, or 30 times that of wall
  time for a case blocked without computing), `memory` (MemoryError under the
  --memory-gib address-space limit), `multiline` (a UserError whose message is empty or not one line) are
  defects; the first few signatures of each are printed (and each new one on stderr when it is first seen).
Each format runs in a child process of its own, so a limit hit in one does not stop the others. The seeds,
mutations and readers are `tests/fuzzing.py`, shared with the per-format fuzz tests of `make test`.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fuzzing import FORMATS, case_rng, make_case, make_seeds, outcome, remove_case  # noqa: E402


class Hang(BaseException):  # not an Exception: `outcome` must not count it as an internal error
    pass


def _alarm(signum: int, frame: object) -> None:
    raise Hang()


WALL_FACTOR = 30  # a wall-clock backstop: on a shared machine a low-priority case may wait long for a core


def run_format(
    kind: str, seeds: dict[str, str], count: int, seed: int, timeout: int, memory_gib: float, progress: int = 0
) -> dict:
    """Mutate and read `count` cases of one kind; outcome counts and defect signatures."""
    limit = int(memory_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)  # wall time: a case blocked in a read
    signal.signal(signal.SIGPROF, _alarm)  # CPU time of the process: a case that computes without end
    original = Path(seeds[FORMATS[kind][0]])
    rng = case_rng(seed, kind)
    outcomes: Counter = Counter()
    signatures: Counter = Counter()
    with tempfile.TemporaryDirectory(prefix=f"npuc-fuzz-{kind}-") as scratch:
        for i in range(count):
            case = make_case(kind, original, Path(scratch), i, rng)
            signal.setitimer(signal.ITIMER_PROF, timeout)
            signal.alarm(timeout * WALL_FACTOR)
            try:
                what, detail = outcome(kind, case)
            except Hang:
                what, detail = "hang", ""
            finally:
                signal.alarm(0)
                signal.setitimer(signal.ITIMER_PROF, 0)
            outcomes[what] += 1
            if what not in ("ok", "user"):
                signature = (what, f"case {i}" if what in ("hang", "memory") else detail[:120])
                if progress and signature not in signatures:  # each new defect as soon as it is seen
                    print(f"defect {kind} case {i}: {what}: {detail}", file=sys.stderr, flush=True)
                signatures[signature] += 1
            remove_case(case, Path(scratch))
            if progress and (i + 1) % progress == 0:  # partial counts on stderr, for a run stopped early
                print(f"progress {kind} {i + 1}/{count} {json.dumps(dict(outcomes))}", file=sys.stderr, flush=True)
    return {"kind": kind, "outcomes": dict(outcomes), "signatures": signatures.most_common(8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=10, help="CPU seconds a case may take")
    parser.add_argument("--memory-gib", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--progress", type=int, default=500, help="outcome counts on stderr every N cases (0: none)")
    args = parser.parse_args()
    kinds = args.formats.split(",")
    unknown = [k for k in kinds if k not in FORMATS]
    if unknown:
        sys.exit(f"unknown format(s) {unknown}; choose from {', '.join(FORMATS)}")
    with tempfile.TemporaryDirectory(prefix="npuc-fuzz-seeds-") as folder:
        seeds = {k: str(v) for k, v in make_seeds(Path(folder)).items()}
        missing = [k for k in kinds if FORMATS[k][0] not in seeds]
        if missing:  # the vendor's files are not in this checkout: say so instead of failing mid-table
            print(f"skipped {', '.join(missing)}: no vendor seed (set NPUC_SHARED to the folder holding golden/)")
        with ProcessPoolExecutor(args.jobs) as pool:
            jobs = [pool.submit(run_format, k, seeds, args.count, args.seed, args.timeout, args.memory_gib,
                                args.progress)
                    for k in kinds if k not in missing]  # fmt: skip
            columns = (("ok", 6), ("user", 6), ("internal", 8), ("hang", 5), ("memory", 6), ("multiline", 9))
            print(f"{'format':<14} {'cases':>6} " + " ".join(f"{k:>{w}}" for k, w in columns))
            for job in jobs:
                r = job.result()
                o = r["outcomes"]
                counts = " ".join(f"{o.get(k, 0):>{w}}" for k, w in columns)
                print(f"{r['kind']:<14} {sum(o.values()):>6} {counts}", flush=True)
                for (what, sig), n in r["signatures"]:
                    print(f"    {n:>5} {what}: {sig}")


if __name__ == "__main__":
    main()
