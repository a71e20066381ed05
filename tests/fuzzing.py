"""The mutation library of the format fuzzers (`bench/fuzz.py`, 10k cases per format; `tests/test_fuzz_formats.py`,
a few dozen in `make test`): one valid seed of each kind npuc reads, the seeded mutations, and the way each kind
is read (the API calls behind `npuc inspect`, `npuc run`, the table readers, `build --config`).

`make_case(kind, seed, scratch, i, rng)` writes case i of a kind into `scratch`; `read_case(kind, path)` reads it.
A case is acceptable when it reads fine or raises `npuc.UserError` (exit 2, one line); anything else is a defect.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from golden import GOLDEN_ROOT

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
    npuc.calibrate(model, [data], method="kl", histogram="tpu-mlir", save_stats=folder / "stats.npz")
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
    golden = GOLDEN_ROOT / "bm1880"
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
        "stats": folder / "stats.npz",
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


def _read_stats(path: Path) -> None:
    """Calibration statistics (--save-stats): read, then every threshold method over them."""
    from npuc.passes.calibration.stats_file import load_stats
    from npuc.passes.calibration.threshold_methods import THRESHOLD_METHODS, table_rows

    stats = load_stats(path)
    for method in THRESHOLD_METHODS:
        table_rows(stats, method)


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
    "stats": ("stats", _read_stats),
    "lyngor": ("lyngor", _inspect_and_run),
    "lyngor_program": ("lyngor", _inspect_and_run),
    "dmp": ("dmp", _inspect_and_run),
    "hb_yaml": ("hb_yaml", _build_config),
    "caffe_prototxt": ("caffe_prototxt", _caffe_prototxt),
    "caffemodel": ("caffemodel", _caffemodel),
    "bmodel_vendor": ("bmodel_vendor", _run_bmodel_zeros),
}


def make_case(kind: str, original: Path, scratch: Path, i: int, rng: random.Random) -> Path:
    """Case i of `kind`: a mutated copy of `original` (the kind's seed) written into `scratch`, with the files
    its reader needs beside it; returns the path to read."""
    case = scratch / f"case{i}{original.suffix}"
    if kind == "lyngor_program":
        mutate_program(original, case, rng)
    elif original.is_dir():
        mutate_tree(original, case, rng)
    elif kind in ("caffe_prototxt", "caffemodel"):
        partner = "lenet_float.caffemodel" if kind == "caffe_prototxt" else "lenet_deploy.prototxt"
        if not (scratch / partner).exists():
            shutil.copy(original.parent / partner, scratch / partner)
        case = scratch / (f"case{i}.prototxt" if kind == "caffe_prototxt" else f"case{i}.caffemodel")
        case.write_bytes(mutate_bytes(original.read_bytes(), rng))
    elif kind == "hb_yaml":
        for extra in ("tinycnn.onnx", "data"):
            if not (scratch / extra).exists():
                src = original.parent / extra
                (shutil.copytree if src.is_dir() else shutil.copy)(src, scratch / extra)
        mutate_yaml(original, case, rng)
    else:
        data = mutate_bytes(original.read_bytes(), rng)
        if kind.startswith("cvimodel") and len(data) >= 48 and rng.random() < 0.9:
            data = data[:14] + hashlib.md5(data[48:]).digest() + data[30:]  # past the checksum
        case.write_bytes(data)
    return case


def read_case(kind: str, case: Path) -> None:
    """Read a case the way the CLI would; raises what the reader raises."""
    FORMATS[kind][1](case)


def remove_case(case: Path, scratch: Path) -> None:
    """The case and whatever reading it wrote (`out_*`), so the next case starts from the same scratch."""
    if case.is_dir():
        shutil.rmtree(case, ignore_errors=True)
    else:
        case.unlink(missing_ok=True)
    for out in scratch.glob("out_*"):
        shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink()


def case_rng(seed: int, kind: str) -> random.Random:
    """The random stream a run of `kind` with `seed` draws its cases from, in order."""
    return random.Random(f"{seed}-{kind}")


def outcome(kind: str, case: Path) -> tuple[str, str]:
    """How reading a case ends, as the CLI would report it: ("ok", ""), ("user", the one line npuc prints after
    "npuc: error: "), or a defect: ("internal", exception, file:line and message), ("memory", ...), or
    ("multiline", the message) for a UserError whose message would not print as one line."""
    import traceback

    from npuc.compiler.errors import UserError

    try:
        read_case(kind, case)
    except UserError as exc:
        message = str(exc)
        if exc.exit_code != 2 or not message.strip() or message.splitlines() != [message]:  # any line break
            return "multiline", f"exit {exc.exit_code}: {message!r}"[:300]
        return "user", message
    except MemoryError:
        return "memory", "MemoryError"
    except Exception as exc:  # noqa: BLE001 - the defect being looked for
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return "internal", f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}: {str(exc)[:200]}"
    return "ok", ""
