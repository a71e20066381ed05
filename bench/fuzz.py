"""Mutated files of every kind npuc reads, through the API the CLI uses: outcome counts per format.

    .venv/bin/python bench/fuzz.py [--count 10000] [--formats cvimodel,npz] [--seed 0]

Seeds are made here from the bundled tinycnn (built for each target) and a calibration of it. Each case is
one seeded mutation (bit flips, byte runs, truncation, a chunk repeated; for the JSON/YAML inside folder
artifacts and configs, and for the op list inside the Lyngor program file (`lyngor_program`, re-wrapped with
a valid CRC), a value replaced by one of another type or out of range) read the way the CLI would (`npuc
inspect`, `npuc run`, the table readers, `build --config`). Outcomes:
- `ok` (read fine) and `user` (npuc.UserError: exit 2, one line) are the only acceptable ones;
- `internal` (any other exception: exit 1), `hang` (over --timeout seconds), `memory` (MemoryError under the
  --memory-gib address-space limit) are defects; the first few signatures of each are printed.
Each format runs in a child process of its own, so a limit hit in one does not stop the others.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import signal
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

# ---- seeds ----------------------------------------------------------------------------------------------


def make_seeds(folder: Path) -> dict[str, Path]:
    """One valid file (or folder) of each kind, built from the bundled tinycnn."""
    import npuc
    from npuc.models.make_models import make_model

    model = folder / "tinycnn.onnx"
    model.write_bytes(make_model("tinycnn").SerializeToString())
    data = folder / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.savez(data / f"{i}.npz", input=rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    table = folder / "tinycnn.cali_table"
    npuc.calibrate(model, [data], table, bmnet=folder / "tinycnn_bmnet.prototxt")
    (folder / "q.qtable").write_text("# op_name   quantize_mode\nrelu_9 BF16\n")
    (folder / "cfg.yaml").write_text(
        "model_parameters:\n  onnx_model: tinycnn.onnx\n  march: bernoulli2\n  output_model_file_prefix: m\n"
        "input_parameters:\n  input_name: input\n  input_shape: 1x3x32x32\n  input_type_rt: nv12\n"
        "  input_type_train: rgb\n  input_layout_train: NCHW\n  norm_type: data_scale\n  scale_value: 0.0039\n"
        "calibration_parameters:\n  cal_data_dir: data\n  calibration_type: max\n"
        "compiler_parameters:\n  compile_mode: latency\n  optimize_level: O3\n"
    )
    npuc.build(model, "cv18xx", folder / "m_bf16.cvimodel", quant="bf16")
    npuc.build(model, "cv18xx", folder / "m_int8.cvimodel", calib=table)
    npuc.build(model, "bm1880", folder / "m.bmodel", calib=table)
    npuc.build(model, "lyngor", folder / "lyngor")
    npuc.build(model, "dmp", folder / "dmp")
    shared = os.environ.get("NPUC_SHARED") or Path(__file__).resolve().parents[2] / "shared"  # as tests/golden.py
    golden = Path(shared) / "golden" / "bm1880"
    vendor = {}
    if golden.is_dir():  # the SDK's own files, when the golden set sits beside the repository
        for name in ("lenet_deploy.prototxt", "lenet_float.caffemodel", "mtcnn_det2_rnet_nchw.bmodel"):
            (folder / name).write_bytes((golden / name).read_bytes())
        vendor = {
            "caffe_prototxt": folder / "lenet_deploy.prototxt",
            "caffemodel": folder / "lenet_float.caffemodel",
            "bmodel_vendor": folder / "mtcnn_det2_rnet_nchw.bmodel",
        }
    return {
        **vendor,
        "onnx": model,
        "cvimodel": folder / "m_int8.cvimodel",
        "cvimodel_bf16": folder / "m_bf16.cvimodel",
        "bmodel": folder / "m.bmodel",
        "table": table,
        "bmnet_table": folder / "tinycnn_bmnet.prototxt",
        "qtable": folder / "q.qtable",
        "npz": data / "0.npz",
        "lyngor": folder / "lyngor",
        "dmp": folder / "dmp",
        "hb_yaml": folder / "cfg.yaml",
    }


# ---- mutations ------------------------------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0 or not out:  # bit flips
        for _ in range(rng.randint(1, 8)):
            if out:
                out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # a run of random bytes
        at = rng.randrange(len(out))
        out[at : at + rng.randint(1, 16)] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == 2:  # truncation
        del out[rng.randrange(len(out)) :]
    else:  # a chunk repeated
        at = rng.randrange(len(out))
        out[at:at] = out[at : at + rng.randint(1, 64)] * rng.randint(1, 4)
    return bytes(out)


ODD_VALUES = (None, -1, 0, 2**31, 2**63, 1e300, "1", "abc", [], {}, [1, 2], {"a": 1}, True, -(2**40))


def mutate_json(value: object, rng: random.Random) -> object:
    """The document with one value somewhere in it replaced by an odd one."""
    if isinstance(value, dict) and value and rng.random() < 0.85:
        key = rng.choice(list(value))
        return {**value, key: mutate_json(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.85:
        i = rng.randrange(len(value))
        return [*value[:i], mutate_json(value[i], rng), *value[i + 1 :]]
    return rng.choice(ODD_VALUES)


def mutate_tree(seed: Path, out: Path, rng: random.Random) -> None:
    """A copy of the folder artifact with one file damaged: its JSON mutated, or its bytes."""
    import shutil

    shutil.copytree(seed, out)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    victim = rng.choice(files)
    data = victim.read_bytes()
    if victim.suffix == ".json" and rng.random() < 0.8:
        try:
            victim.write_text(json.dumps(mutate_json(json.loads(data), rng)))
            return
        except ValueError:
            pass
    victim.write_bytes(mutate_bytes(data, rng))


def mutate_program(seed: Path, out: Path, rng: random.Random) -> None:
    """A copy of a Lyngor tree whose program section (the op list) has one JSON value replaced, re-wrapped with a
    valid header and CRC and the sizes updated, so the damage reaches the op-list reader."""
    import shutil

    from npuc.backends.lyngor.payload import read_program, write_program

    shutil.copytree(seed, out)
    apu_x = out / "Net_0" / "apu_0" / "apu_x"
    sections = read_program((apu_x / "npuc_prog.bin").read_bytes(), "seed")
    doc = mutate_json(json.loads(sections[0]), rng)
    data = write_program([json.dumps(doc).encode(), *sections[1:]])
    (apu_x / "npuc_prog.bin").write_bytes(data)
    for name, holder in (("npuc_apu.json", lambda d: d), ("apu.json", lambda d: d["apu_x"])):
        manifest = json.loads((apu_x / name).read_text())
        holder(manifest)["cmd_size"] = len(data)
        (apu_x / name).write_text(json.dumps(manifest))


def mutate_yaml(seed: Path, out: Path, rng: random.Random) -> None:
    lines = seed.read_text().splitlines()
    i = rng.randrange(len(lines))
    if rng.random() < 0.6 and ":" in lines[i]:
        key = lines[i].split(":", 1)[0]
        lines[i] = f"{key}: {json.dumps(rng.choice(ODD_VALUES))}"
    else:
        out.write_bytes(mutate_bytes(seed.read_bytes(), rng))
        return
    out.write_text("\n".join(lines) + "\n")


# ---- how each kind is read ------------------------------------------------------------------------------


def _feeds() -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)}


def _inspect_and_run(path: Path) -> None:
    import npuc

    npuc.inspect(path, disasm=True)
    npuc.run(path, _feeds())


def _read_table(path: Path) -> None:
    from npuc.passes.calibration.calitable import read_table

    read_table(path)


def _read_bmnet(path: Path) -> None:
    from npuc.backends.bm1880.calibration import load_calibration

    load_calibration(path)


def _read_qtable(path: Path) -> None:
    from npuc.passes.calibration.qtable import read_qtable

    read_qtable(path)


def _read_npz(path: Path) -> None:
    from npuc.compiler.arrays import load_arrays

    load_arrays(path)


def _run_bmodel_zeros(path: Path) -> None:
    """A bmodel from another tool: inspect it, then run its first command on zeros of its own input shape."""
    import npuc
    from npuc.backends.bm1880.container import load_bmodel
    from npuc.backends.bm1880.sim import input_name, run_bmodel

    npuc.inspect(path, disasm=True)
    model = load_bmodel(path)
    if model.commands and model.commands[0].inputs:
        shape = model.commands[0].inputs[0].shape
        run_bmodel(model, {input_name(0): np.zeros(shape, np.int8)})  # already quantized: no threshold needed


def _caffe_prototxt(path: Path) -> None:
    from npuc.frontends.caffe import import_caffe

    import_caffe(path, path.parent / "lenet_float.caffemodel", {"data": (1, 1, 28, 28)})


def _caffemodel(path: Path) -> None:
    from npuc.frontends.caffe import import_caffe

    import_caffe(path.parent / "lenet_deploy.prototxt", path, {"data": (1, 1, 28, 28)})


def _build_config(path: Path) -> None:
    import npuc

    npuc.build(None, "bpu", path.parent / "out_bpu", config=path)


def _onnx(path: Path) -> None:
    import npuc

    npuc.inspect(path)
    npuc.build(path, "lyngor", path.parent / "out_lyngor")


FORMATS: dict[str, tuple[str, Callable[[Path], None]]] = {  # kind -> (seed, reader)
    "cvimodel": ("cvimodel", _inspect_and_run),
    "cvimodel_bf16": ("cvimodel_bf16", _inspect_and_run),
    "bmodel": ("bmodel", _inspect_and_run),
    "onnx": ("onnx", _onnx),
    "table": ("table", _read_table),
    "bmnet_table": ("bmnet_table", _read_bmnet),
    "qtable": ("qtable", _read_qtable),
    "npz": ("npz", _read_npz),
    "lyngor": ("lyngor", _inspect_and_run),
    "lyngor_program": ("lyngor", _inspect_and_run),
    "dmp": ("dmp", _inspect_and_run),
    "hb_yaml": ("hb_yaml", _build_config),
    "caffe_prototxt": ("caffe_prototxt", _caffe_prototxt),
    "caffemodel": ("caffemodel", _caffemodel),
    "bmodel_vendor": ("bmodel_vendor", _run_bmodel_zeros),
}


class Hang(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise Hang()


def run_format(kind: str, seeds: dict[str, str], count: int, seed: int, timeout: int, memory_gib: float) -> dict:
    """Mutate and read `count` cases of one kind; outcome counts and defect signatures."""
    import shutil

    from npuc.compiler.errors import UserError

    limit = int(memory_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    source, reader = FORMATS[kind]
    original = Path(seeds[source])
    rng = random.Random(f"{seed}-{kind}")
    outcomes: Counter = Counter()
    signatures: Counter = Counter()
    with tempfile.TemporaryDirectory(prefix=f"npuc-fuzz-{kind}-") as scratch:
        for i in range(count):
            case = Path(scratch) / f"case{i}{original.suffix}"
            if kind == "lyngor_program":
                mutate_program(original, case, rng)
            elif original.is_dir():
                mutate_tree(original, case, rng)
            elif kind in ("caffe_prototxt", "caffemodel"):
                partner = "lenet_float.caffemodel" if kind == "caffe_prototxt" else "lenet_deploy.prototxt"
                if not (Path(scratch) / partner).exists():
                    shutil.copy(original.parent / partner, Path(scratch) / partner)
                case = Path(scratch) / (f"case{i}.prototxt" if kind == "caffe_prototxt" else f"case{i}.caffemodel")
                case.write_bytes(mutate_bytes(original.read_bytes(), rng))
            elif kind == "hb_yaml":
                for extra in ("tinycnn.onnx", "data"):
                    if not (Path(scratch) / extra).exists():
                        src = original.parent / extra
                        (shutil.copytree if src.is_dir() else shutil.copy)(src, Path(scratch) / extra)
                mutate_yaml(original, case, rng)
            else:
                data = mutate_bytes(original.read_bytes(), rng)
                if kind.startswith("cvimodel") and len(data) >= 48 and rng.random() < 0.9:
                    data = data[:14] + hashlib.md5(data[48:]).digest() + data[30:]  # past the checksum
                case.write_bytes(data)
            signal.alarm(timeout)
            try:
                reader(case)
                outcomes["ok"] += 1
            except UserError:
                outcomes["user"] += 1
            except Hang:
                outcomes["hang"] += 1
                signatures[("hang", f"case {i}")] += 1
            except MemoryError:
                outcomes["memory"] += 1
                signatures[("memory", f"case {i}")] += 1
            except Exception as exc:  # noqa: BLE001 - the defect being counted
                outcomes["internal"] += 1
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                where = f"{Path(frame.filename).name}:{frame.lineno}"
                signatures[("internal", f"{type(exc).__name__} at {where}: {str(exc)[:80]}")] += 1
            finally:
                signal.alarm(0)
            if case.is_dir():
                shutil.rmtree(case, ignore_errors=True)
            else:
                case.unlink(missing_ok=True)
            for out in Path(scratch).glob("out_*"):
                shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink()
    return {"kind": kind, "outcomes": dict(outcomes), "signatures": signatures.most_common(8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=10)
    parser.add_argument("--memory-gib", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=2)
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
            jobs = [pool.submit(run_format, k, seeds, args.count, args.seed, args.timeout, args.memory_gib)
                    for k in kinds if k not in missing]  # fmt: skip
            print(f"{'format':<14} {'cases':>6} {'ok':>6} {'user':>6} {'internal':>8} {'hang':>5} {'memory':>6}")
            for job in jobs:
                r = job.result()
                o = r["outcomes"]
                counts = " ".join(f"{o.get(k, 0):>{w}}" for k, w in (("ok", 6), ("user", 6), ("internal", 8),
                                                                     ("hang", 5), ("memory", 6)))  # fmt: skip
                print(f"{r['kind']:<14} {sum(o.values()):>6} {counts}", flush=True)
                for (what, sig), n in r["signatures"]:
                    print(f"    {n:>5} {what}: {sig}")


if __name__ == "__main__":
    main()
