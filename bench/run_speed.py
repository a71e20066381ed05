"""`npuc run` on cvimodels against the vendor's CV18xx simulator: CPU seconds side by side, outputs compared.

    .venv/bin/python bench/run_speed.py [--models onet_int8,pplcnet_bf16] [--golden] [--repeat 3] [--work DIR]

Models: npuc's cv183x builds of MTCNN O-Net and PP-LCNet (fetched, int8 KL-calibrated on 8 of their real
pictures) in int8 and bf16 and of the generated resnet18_224 in int8 (KL-calibrated on 4 photos), fed one
real picture the calibration did not see; with --golden also every tpu-mlir-built cvimodel under
$NPUC_SHARED/golden/cv18xx*/ (seeded random inputs). --work keeps the builds and their inputs in DIR and
reuses them on the next run (to time two versions of npuc on the same files).

Columns, each the best of --repeat paired runs (the machine is shared: user + sys CPU time, not wall time):
- `npuc run`: the whole `python -m npuc run MODEL --input FEEDS -o OUT` process (getrusage of the child):
  interpreter start, imports, reading the file, simulating, writing the outputs;
- `vendor`: the whole vendor process as tests/vendor/cv18xx_sim.run_vendor starts it (interpreter, numpy,
  the three libraries, CVI_NN_RegisterModel + CVI_NN_Forward, reading and writing the .npz files);
- `npuc sim` / `vendor sim`: the same without the interpreter start and imports: read_cvimodel +
  run_cvimodel in this process, and the runner's run() timed inside its child.
Both children run with compiled bytecode allowed (PYTHONDONTWRITEBYTECODE dropped), as an installed npuc runs.
`same` says whether every output has the vendor's bits.

Measured (two shared, busy cores; CPU s, npuc / vendor), before -> after the simulator work of issue 23:
  model          npuc run process             simulator only
  onet_int8      0.62 -> 0.41 / 0.17          0.07 -> 0.03 / 0.04
  onet_bf16      1.22 -> 0.44 / 0.22          0.68 -> 0.06 / 0.10
  pplcnet_int8   1.26 -> 0.79 / 1.41          0.68 -> 0.32 / 1.28
  pplcnet_bf16   4.23 -> 0.95 / 2.13          3.74 -> 0.50 / 2.01
  resnet18_int8  4.39 -> 1.28 / 3.08          3.45 -> 0.86 / 2.98
  yolov8n 640    6.98 -> 1.66 / 10.98         6.44 -> 1.16 / 10.92
The simulation is faster than the vendor's on every model here (golden sets included); a small model's
`npuc run` process is not: of its ~0.4 s, numpy's import is 0.10 s (the vendor runner pays it too) and
typer's is 0.15 s (typer >= 0.2x builds its option converters with pydantic), against the vendor's 0.17 s.
Since typer is held below 0.27 (no pydantic), `npuc run` on an artifact starts no OpenBLAS thread pool (the
simulators compute on one BLAS thread), a command line loads only its command's module, and the VLC decoder
finds each block's 16 unary ends by lowest-set-bit steps (26 -> 17 ms for 300 K int8 weights), AVX-512 machine,
`--models onet_int8,onet_bf16,pplcnet_int8 --repeat 5` (npuc run / vendor): onet_int8 0.49 -> 0.32-0.33 / 0.30-0.31,
onet_bf16 0.58 -> 0.36-0.39 / 0.36-0.37, pplcnet_int8 0.67 / 1.58; simulator only 0.05 / 0.10, 0.05 / 0.17,
0.32 / 1.35. What is left of a small model's process: interpreter + numpy 0.11 s, typer 0.03, npuc's modules
0.05, parse + read + simulate + write 0.10 (min of 8 runs).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NPUC_SHARED") or ROOT.parent / "shared")
VENDOR_DIR = ROOT / "tests" / "vendor"
BUILT = ("onet_int8", "onet_bf16", "pplcnet_int8", "pplcnet_bf16", "resnet18_int8")
REAL = {"onet": "mtcnn_onet", "pplcnet": "pplcnet_orientation"}
CALIBRATION_PICTURES = 8
# the runner's run() timed inside its own child: interpreter start and imports excluded
VENDOR_TIMED = (
    "import sys, time; sys.path.insert(0, sys.argv[1]); import cv18xx_sim_runner as r; from pathlib import Path; "
    "t = time.process_time(); r.run(*(Path(a) for a in sys.argv[2:])); print(time.process_time() - t)"
)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _child_cpu(cmd: list[str]) -> tuple[float, str]:
    """(user + sys CPU seconds of the child, its stdout); a failure raises with its last stderr line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError((done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, done.stdout


def _calibrated_build(name: str, quant: str, folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    import npuc
    from npuc.models.fetch import REAL_MODELS, fetch_model
    from npuc.models.images import model_inputs

    real = REAL[name]
    model, shapes = fetch_model(real), REAL_MODELS[real].input_shapes
    out = folder / f"{name}_{quant}.cvimodel"
    table = None
    if quant == "int8":
        data = folder / f"{name}_data"
        data.mkdir(exist_ok=True)
        for i, feed in enumerate(model_inputs(real, CALIBRATION_PICTURES)):
            np.savez(data / f"{i}.npz", **feed)
        table = folder / f"{name}_table.txt"
        npuc.calibrate(model, [data], table, method="kl", input_shapes=shapes)
    npuc.build(model, "cv18xx", out, chip="cv183x", quant=quant, calib=table, input_shapes=shapes)
    return out, model_inputs(real, CALIBRATION_PICTURES + 1)[-1]  # a picture the calibration did not see


def _resnet_build(folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    import npuc
    from npuc.models.images import IMAGENET_MEAN, IMAGENET_STD, load_image, normalize, resize, to_layout
    from npuc.models.make_models import make_all

    model = make_all(folder, ["resnet18_224"])["resnet18_224"]
    data = folder / "resnet_data"
    data.mkdir(exist_ok=True)
    photos = [to_layout(normalize(resize(load_image(name), 224, 224), 1 / 255, IMAGENET_MEAN, IMAGENET_STD), "nchw")
              for name in ("astronaut", "coffee", "chelsea", "rocket", "retina")]  # fmt: skip
    for i, photo in enumerate(photos[:4]):
        np.savez(data / f"{i}.npz", input=photo)
    table = folder / "resnet_table.txt"
    npuc.calibrate(model, [data], table, method="kl")
    out = folder / "resnet18_int8.cvimodel"
    npuc.build(model, "cv18xx", out, chip="cv183x", calib=table)
    return out, {"input": photos[4]}


def _random_feeds(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    from npuc.backends.cv18xx.container import DTYPES, read_cvimodel

    model = read_cvimodel(path)
    prog = model.body.programs[0]
    tensors = {t.name: t for t in prog.tensor_map}
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in prog.input_tensors:
        t = tensors[name]
        dtype, shape = np.dtype(DTYPES[t.dtype]), tuple(int(d) for d in t.shape.dim[:4])
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[name] = rng.integers(0 if dtype.kind == "u" else -128, 128, shape).astype(dtype)
    return feeds


def _models(names: list[str], golden: bool, folder: Path) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    models = {}
    for name in names:
        path, feeds_path = folder / f"{name}.cvimodel", folder / f"{name}_feeds.npz"
        if path.exists() and feeds_path.exists():  # built by an earlier run with the same --work
            with np.load(feeds_path) as saved:
                models[name] = (path, {k: saved[k] for k in saved.files})
            continue
        start = time.perf_counter()
        build = folder / name
        build.mkdir(parents=True, exist_ok=True)
        built, feeds = _resnet_build(build) if name == "resnet18_int8" else _calibrated_build(*name.split("_"), build)
        built.replace(path)
        np.savez(feeds_path, **feeds)
        models[name] = (path, feeds)
        print(f"built {name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if golden:
        for path in sorted(SHARED.glob("golden/cv18xx*/*.cvimodel")):
            models[f"{path.parent.name}/{path.stem}"] = (path, _random_feeds(path))
    return models


def _same(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> bool:
    return set(ours) == set(theirs) and all(
        np.array_equal(np.ascontiguousarray(ours[k]).view(np.uint8).ravel(),
                       np.ascontiguousarray(theirs[k]).view(np.uint8).ravel()) for k in ours
    )  # fmt: skip


def measure(path: Path, feeds: dict[str, np.ndarray], repeat: int, folder: Path) -> dict[str, object]:
    """Best-of-`repeat` CPU seconds of both processes and both simulators on one model, and whether they agree."""
    from npuc.backends.cv18xx.container import read_cvimodel
    from npuc.backends.cv18xx.sim import run_cvimodel

    sys.path.insert(0, str(VENDOR_DIR))
    import cv18xx_sim

    lib_dir = cv18xx_sim.ensure_simulator()
    feeds_path, ours_path, theirs_path = folder / "feeds.npz", folder / "ours.npz", folder / "theirs.npz"
    np.savez(feeds_path, **feeds)
    npuc_cmd = [sys.executable, "-m", "npuc", "run", str(path), "--input", str(feeds_path), "-o", str(ours_path)]
    vendor_cmd = [sys.executable, str(cv18xx_sim.RUNNER), str(lib_dir), str(path.resolve()), str(feeds_path),
                  str(theirs_path)]  # fmt: skip
    timed_cmd = [sys.executable, "-c", VENDOR_TIMED, str(VENDOR_DIR), *vendor_cmd[2:]]
    times: dict[str, list[float]] = {"npuc": [], "vendor": [], "npuc_sim": [], "vendor_sim": []}
    for _ in range(repeat):
        times["npuc"].append(_child_cpu(npuc_cmd)[0])
        times["vendor"].append(_child_cpu(vendor_cmd)[0])
        start = time.process_time()
        run_cvimodel(read_cvimodel(path), feeds)
        times["npuc_sim"].append(time.process_time() - start)
        times["vendor_sim"].append(float(_child_cpu(timed_cmd)[1].strip().splitlines()[-1]))
    with np.load(ours_path) as ours, np.load(theirs_path) as theirs:
        same = _same({k: ours[k] for k in ours.files}, {k: theirs[k] for k in theirs.files})
    return {**{k: min(v) for k, v in times.items()}, "same": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BUILT), help=f"of {', '.join(BUILT)}; '' for none")
    parser.add_argument("--golden", action="store_true", help="also every tpu-mlir cvimodel in the golden sets")
    parser.add_argument("--repeat", type=int, default=3, help="paired runs per model; the best of each is shown")
    parser.add_argument("--work", type=Path, help="keep the builds here and reuse them (default: a temporary folder)")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(BUILT))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(BUILT)}")
    with tempfile.TemporaryDirectory(prefix="npuc-bench-run-speed-") as tmp:
        models = _models(names, args.golden, args.work or Path(tmp))
        print(f"CPU seconds (user + sys), best of {args.repeat}; ratio = npuc / vendor")
        print(f"{'model':<72} {'npuc run':>9} {'vendor':>8} {'ratio':>6} {'npuc sim':>9} {'vendor sim':>11}"
              f" {'ratio':>6}  same")  # fmt: skip
        for name, (path, feeds) in models.items():
            try:
                r = measure(path, feeds, args.repeat, Path(tmp))
            except RuntimeError as exc:
                print(f"{name:<72} failed: {exc}")
                continue
            print(
                f"{name:<72} {r['npuc']:>9.2f} {r['vendor']:>8.2f} {r['npuc'] / r['vendor']:>6.2f}"
                f" {r['npuc_sim']:>9.2f} {r['vendor_sim']:>11.2f} {r['npuc_sim'] / r['vendor_sim']:>6.2f}"
                f"  {'yes' if r['same'] else 'NO'}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
