"""A few dozen seeded mutations of every format `bench/fuzz.py` knows (its library: `tests/fuzzing.py`), read
the way the CLI reads them: each must read fine or end in npuc's one-line error (exit 2). An internal error,
a MemoryError, a message on more than one line, a crash, or a case that outruns its CPU allowance fails the
format's test, naming the case (rerun it with `bench/fuzz.py --formats KIND --seed 21 --count N`).

Each format runs in a child process whose address space is capped at 1 GiB above what Python and npuc's
libraries map at start, and whose CPU time is capped per case (RLIMIT_CPU ends it with SIGXCPU): hangs and
memory blow-ups are bounded without any wall-clock assertion.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fuzzing import FORMATS, case_rng, make_case, make_seeds, outcome
from golden import GOLDEN_ROOT

from npuc.compiler.errors import CorruptFileError

CASES = 50  # per format
SEED = 21
MEMORY_LIMIT = 1 << 30
CPU_PER_CASE = 20  # seconds; a valid case takes well under one
TESTS = Path(__file__).resolve().parent

# Two marked JSON lines per case on stdout (started, then its outcome), each flushed, so a child ended by a
# limit still says which case it was reading.
CHILD = """
import json, os, resource, sys, tempfile
from pathlib import Path
sys.path.insert(0, {tests!r})
import numpy, onnx, onnxruntime
import fuzzing
pages = int(open('/proc/self/statm').read().split()[0])
cap = pages * os.sysconf('SC_PAGE_SIZE') + {memory}
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
kind, original = {kind!r}, Path({original!r})
rng = fuzzing.case_rng({seed}, kind)
with tempfile.TemporaryDirectory(prefix='npuc-fuzz-test-') as scratch:
    for i in range({cases}):
        case = fuzzing.make_case(kind, original, Path(scratch), i, rng)
        used = resource.getrusage(resource.RUSAGE_SELF)
        spent = int(used.ru_utime + used.ru_stime) + 1
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        soft = spent + {cpu} if hard == resource.RLIM_INFINITY else min(spent + {cpu}, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        print("fuzz-case", json.dumps({{"case": i, "start": True}}), flush=True)
        what, detail = fuzzing.outcome(kind, case)
        print("fuzz-case", json.dumps({{"case": i, "outcome": what, "detail": detail}}), flush=True)
        fuzzing.remove_case(case, Path(scratch))
"""


@pytest.fixture(scope="session")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_seeds(tmp_path_factory.mktemp("fuzz-seeds"))


def fuzz_format(kind: str, original: Path, cases: int = CASES, seed: int = SEED) -> dict[int, tuple[str, str]]:
    """Case number -> (outcome, detail) for `cases` mutations of `kind`; fails naming the case if the child
    ends early (a crash, or a case over its CPU allowance or the memory cap)."""
    script = CHILD.format(
        tests=str(TESTS), memory=MEMORY_LIMIT, kind=kind, original=str(original), seed=seed, cases=cases,
        cpu=CPU_PER_CASE,
    )  # fmt: skip
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    lines = [json.loads(line.split(" ", 1)[1]) for line in run.stdout.splitlines() if line.startswith("fuzz-case ")]
    results = {r["case"]: (r["outcome"], r["detail"]) for r in lines if "outcome" in r}
    if run.returncode != 0:
        started = max((r["case"] for r in lines), default=None)
        cause = (
            f"killed by SIGXCPU: over {CPU_PER_CASE} s of CPU (a hang)"
            if run.returncode == -signal.SIGXCPU
            else f"exit {run.returncode}" + (f" ({signal.Signals(-run.returncode).name})" if run.returncode < 0 else "")
        )
        pytest.fail(f"{kind}: the fuzzing child ended at case {started}: {cause}; stderr: {run.stderr[-800:]}")
    return results


@pytest.mark.parametrize("kind", list(FORMATS))
def test_mutations_read_or_fail_in_one_line(kind: str, seeds: dict[str, Path]) -> None:
    source = FORMATS[kind][0]
    assert source in seeds, f"no seed for {kind}: the vendor files are read from {GOLDEN_ROOT} (set NPUC_SHARED)"
    results = fuzz_format(kind, seeds[source])
    assert sorted(results) == list(range(CASES))
    defects = {i: r for i, r in results.items() if r[0] not in ("ok", "user")}
    assert defects == {}, f"{kind}: {len(defects)} of {CASES} cases are defects: {defects}"
    # the mutations reach the readers' checks: some cases are refused
    assert any(what == "user" for what, _ in results.values()), f"{kind}: no case was refused: {results}"


def test_outcome_tells_defects_from_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The classification the tests above rely on: only a one-line UserError counts as a clean refusal. A
    UserError escapes the control characters quoted into it (compiler/errors.py), so text from a damaged file
    cannot break its line; an empty message is still a defect."""
    import fuzzing

    raised: list[BaseException] = []

    def reader(path: Path) -> None:
        raise raised[-1]

    monkeypatch.setitem(fuzzing.FORMATS, "probe", ("npz", reader))
    for exc, expected in (
        (CorruptFileError("probe.bin: bad magic"), "user"),
        (CorruptFileError("probe.bin: bad magic\nTraceback (most recent call last):"), "user"),
        (CorruptFileError("probe.bin:3: '  type: \rottom'"), "user"),
        (CorruptFileError(""), "multiline"),
        (KeyError("shape"), "internal"),
        (MemoryError(), "memory"),
    ):
        raised.append(exc)
        assert outcome("probe", tmp_path / "probe.bin")[0] == expected, exc
    assert str(CorruptFileError("a\nb\rc")) == "a\\nb\\rc"


def test_cases_are_deterministic(seeds: dict[str, Path], tmp_path: Path) -> None:
    """The same seed makes the same cases (a failure names a case that reruns)."""
    made = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        rng = case_rng(SEED, "cvimodel")
        made.append([make_case("cvimodel", seeds["cvimodel"], tmp_path / run, i, rng).read_bytes() for i in range(5)])
    assert made[0] == made[1]
    assert len(set(made[0])) == 5
