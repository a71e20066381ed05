"""Real models on bm1880: `npuc calibrate` defaults on a few pictures, `npuc build --target bm1880`, then the
written bmodel simulated from its bytes on other pictures against onnxruntime.

    .venv/bin/python bench/bm1880_real.py [--models pplcnet_orientation,mbv3_textline_cls] [--calib 8] [--eval 16]
                                          [--weight-scale layer|channel]  (default: what `npuc build` picks)

The bmodel's output is the net before its host tail (softmax), so it is compared with the same tensor of the
float model (added as an onnxruntime output): per-picture cosine (mean, worst) and top-1 agreement. A table
already in the work folder is reused (calibration is the slow part); delete it to calibrate again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import npuc
from npuc.backends.bm1880.container import load_bmodel
from npuc.backends.bm1880.sim import run_bmodel
from npuc.models.fetch import fetch_model
from npuc.models.images import model_inputs
from npuc.passes.quantization.qsim import output_cosines

# model -> (input shape, the float tensor the bmodel's output is: the logits before the host's softmax)
MODELS = {
    "pplcnet_orientation": ((1, 3, 224, 224), "Add.9"),
    "mbv3_textline_cls": ((1, 3, 48, 192), "linear_1.tmp_1"),
}


def measure(name: str, n_calib: int, n_eval: int, work: Path, weight_scale: str | None = None) -> str:
    shape, logits = MODELS[name]
    model = fetch_model(name)
    feeds = model_inputs(name, n_calib + n_eval)
    input_name = next(iter(feeds[0]))
    data, table, bmodel = work / "data", work / "table.txt", work / f"{name}.bmodel"
    data.mkdir(parents=True, exist_ok=True)
    spent = 0.0
    if not table.is_file():
        for i, feed in enumerate(feeds[:n_calib]):
            np.savez(data / f"{i:02d}.npz", **feed)
        start = time.perf_counter()
        npuc.calibrate(model, [data], table, input_shapes={input_name: list(shape)})
        spent = time.perf_counter() - start
    dims = ",".join(map(str, shape))
    option = ["--option", f"weight_scale={weight_scale}"] if weight_scale else []
    built = subprocess.run([sys.executable, "-m", "npuc", "build", str(model), "--target", "bm1880", "--calib",
                            str(table), "--input-shape", f"{input_name}:{dims}", *option, "--json", "-o", str(bmodel)],
                           check=True, capture_output=True, text=True)  # fmt: skip
    rule = json.loads(built.stdout)["details"]["weight_scale"]
    float_model = onnx.load(model)
    float_model.graph.output.append(onnx.helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(float_model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    written = load_bmodel(bmodel)
    cosines, probs, agree = [], [], 0
    for feed in feeds[n_calib:]:
        ref = dict(zip(names, session.run(None, feed)))[logits].reshape(1, -1)
        (got,) = run_bmodel(written, {"input": feed[input_name]}).values()
        got = got.reshape(1, -1)
        cosines.append(float(output_cosines(ref, got)[0]))
        probs.append(float(output_cosines(_softmax(ref), _softmax(got))[0]))  # what the host's softmax returns
        agree += int(np.argmax(got) == np.argmax(ref))
    how = "asked" if weight_scale else "the default"
    return (
        f"{name} (weight_scale={rule}, {how}): calibrated on {n_calib} pictures ({spent:.0f} s), {n_eval} others: "
        f"logit cosine mean "
        f"{np.mean(cosines):.5f} worst {min(cosines):.5f}; softmax output cosine mean {np.mean(probs):.5f} "
        f"worst {min(probs):.5f}; top-1 {agree}/{n_eval}"
    )


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--calib", type=int, default=8)
    parser.add_argument("--eval", type=int, default=16)
    parser.add_argument("--work", type=Path, default=Path("build/bm1880_real"))
    parser.add_argument("--weight-scale", choices=("layer", "channel"), help="default: what npuc build picks")
    args = parser.parse_args()
    for name in args.models.split(","):
        print(measure(name, args.calib, args.eval, args.work / name, args.weight_scale), flush=True)


if __name__ == "__main__":
    main()
