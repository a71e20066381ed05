"""Real model x target: does it build, how close is it to onnxruntime, does the vendor simulator agree.

    .venv/bin/python bench/coverage.py [--models yolov8n_320,picodet_layout] [--targets cv18xx,lyngor]

For every real model of `npuc.models.fetch` (fetched into the cache on first use) and every target format:
- `ops`: how many ops the target cannot run (`npuc.check`, a trial build per format); "model" when the model
  as a whole does not build (its input, say);
- `cos`: where it builds, the built artifact runs on npuc's simulator on one real picture the calibration did
  not see (int8 formats: `npuc calibrate` defaults on 8 pictures, the qtable it writes included), and the
  worst output cosine to onnxruntime is printed;
- `vendor`: cv18xx only, whether the vendor's simulator gives the same bits (needs the pinned tpu-mlir wheel;
  tests/vendor/cv18xx_sim.py fetches it), else "-".
Slow models (PicoDet bf16 simulates ~11k TIU instructions) take a minute each.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION_PICTURES = 8


def _vendor():  # noqa: ANN202 - the harness module, or None when the simulator cannot be fetched here
    sys.path.insert(0, str(ROOT / "tests" / "vendor"))
    try:
        import cv18xx_sim

        cv18xx_sim.ensure_simulator()
        return cv18xx_sim
    except Exception as exc:  # noqa: BLE001 - reported, then the column reads "-"
        print(f"vendor simulator unavailable ({exc}); the vendor column reads '-'", file=sys.stderr)
        return None


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def _table(name: str, model: Path, shapes: list[str], folder: Path) -> Path:
    """`npuc calibrate` with its defaults on the model's first pictures (writes the qtable too, if any)."""
    from npuc.models.images import model_inputs

    data = folder / "data"
    data.mkdir(exist_ok=True)
    for i, feed in enumerate(model_inputs(name, CALIBRATION_PICTURES)):
        np.savez(data / f"{i}.npz", **feed)
    table = folder / "table.txt"
    cmd = [sys.executable, "-m", "npuc", "calibrate", str(model), "--data", str(data), "-o", str(table)]
    done = subprocess.run([*cmd, *(a for s in shapes for a in ("--input-shape", s))], capture_output=True, text=True)
    if done.returncode != 0:  # the row says so; the other models still run
        raise CalibrationFailed((done.stderr.strip().splitlines() or ["no message"])[-1][:60])
    return table


def _float_tensors(model: Path, feed: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """onnxruntime's values of the ONNX tensors `names`: a bmodel's outputs stop before its host tail (a final
    softmax runs on the host) and are named after those tensors."""
    import onnx
    import onnxruntime as ort

    graph = onnx.load(str(model))
    produced = {out for node in graph.graph.node for out in node.output}
    names = [n for n in names if n in produced]
    if not names:
        return {}
    graph.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    return dict(zip(names, ort.InferenceSession(graph.SerializeToString()).run(names, feed), strict=True))


def _as_artifact_dtypes(artifact: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Integer inputs (token ids) in the type the artifact declares (npuc run refuses another type)."""
    from npuc.compiler.artifacts import ArtifactOptions, detect

    kind = detect(artifact)
    declared = {} if kind.inputs is None else {s.name: s.dtype for s in kind.inputs(artifact, ArtifactOptions())}
    return {
        name: x.astype(declared[name]) if name in declared and x.dtype.kind in "iu" else x for name, x in feed.items()
    }


class CalibrationFailed(Exception):
    pass


def measure(name: str, targets: list[str], vendor) -> list[tuple[str, str, str, str, str]]:  # noqa: ANN001
    import onnxruntime as ort

    import npuc
    from npuc.compiler.targets import get_target
    from npuc.models.fetch import fetch_model, get_model
    from npuc.models.images import model_inputs

    model, spec = fetch_model(name), get_model(name)
    shapes = [f"{n}:{','.join(map(str, s))}" for n, s in spec.input_shapes.items()]
    feed = model_inputs(name, CALIBRATION_PICTURES + 1)[-1]
    session = ort.InferenceSession(str(model))
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True))
    rows = []
    with tempfile.TemporaryDirectory(prefix="npuc-coverage-") as scratch:
        folder = Path(scratch)
        table = None
        for target in targets:
            for (tname, quant), gaps in npuc.check(model, target, input_shapes=shapes).items():
                if gaps:
                    judged = [g for g in gaps if g.op is not None and g.judged]
                    rows.append((name, tname, quant, str(len(judged)) if judged else "model", "-", "-"))
                    continue
                calib = None
                if get_target(tname).uses_calib and quant == "int8":
                    try:
                        table = table or _table(name, model, shapes, folder)
                    except CalibrationFailed as exc:
                        rows.append((name, tname, quant, "0", f"calibrate: {exc}", "-"))
                        continue
                    calib = table
                out = folder / f"{tname}_{quant}"
                result = npuc.build(model, tname, out, quant=quant, calib=calib, input_shapes=shapes)
                artifact = out if out.is_dir() else result.artifacts[0]  # a folder target runs as the folder
                fed = feed
                if tname == "bm1880":  # BMNet inputs are NCHW and unnamed (the build notes it)
                    from npuc.backends.bm1880.sim import input_name

                    x = feed[spec.input_name]
                    fed = {input_name(0): x.transpose(0, 3, 1, 2) if spec.layout == "nhwc" else x}
                fed = _as_artifact_dtypes(Path(artifact), fed)
                try:
                    got = npuc.run(artifact, fed)
                except npuc.UserError as exc:
                    rows.append((name, tname, quant, "0", f"no run: {exc}"[:40], "-"))
                    continue
                reference = want if any(k in got for k in want) else _float_tensors(model, feed, list(got))
                common = [k for k in reference if k in got]
                if not common:
                    rows.append((name, tname, quant, "0", "names?", "-"))
                    continue
                cos = min(_cosine(got[k], reference[k]) for k in common)
                same = "-"
                if tname == "cv18xx" and vendor is not None:
                    theirs = vendor.run_vendor(artifact, feed)
                    same = "yes" if all(
                        np.array_equal(np.asarray(got[k]).ravel().view(np.uint8), v.ravel().view(np.uint8))
                        for k, v in theirs.items()
                    ) else "NO"  # fmt: skip
                rows.append((name, tname, quant, "0", f"{cos:.4f}", same))
    return rows


def main() -> None:
    from npuc.models.fetch import REAL_MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(REAL_MODELS))
    parser.add_argument("--targets", default="cv18xx,bm1880,bpu,dmp,lyngor")
    args = parser.parse_args()
    vendor = _vendor() if "cv18xx" in args.targets.split(",") else None
    print(f"{'model':<22} {'target':<8} {'format':<7} {'ops':>5} {'cos':>8} {'vendor':>7}")
    for name in args.models.split(","):
        for row in measure(name, args.targets.split(","), vendor):
            print(f"{row[0]:<22} {row[1]:<8} {row[2]:<7} {row[3]:>5} {row[4]:>8} {row[5]:>7}", flush=True)


if __name__ == "__main__":
    main()
