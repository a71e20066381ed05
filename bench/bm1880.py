"""BM1880 builds: time, artifact size, neuron area and DDR traffic per model and --opt level.

    .venv/bin/python bench/bm1880.py [--models lenet,pnet,resnet18] [--run]

Models: the golden float LeNet (without its final ELU, with the golden BMNet table), the MTCNN P-Net ONNX at
1x3x12x12 and 1x3x288x384 in one bmodel, and the generated resnet18_224. P-Net and resnet18 thresholds are
max-abs statistics from npuc's float interpreter on real pictures (P-Net) or seeded noise (resnet18).
"DDR bytes" counts every byte the GDMAs move (activations in and out, weights) in one inference of the
largest shape; "neuron" is that command's neuron area. --run also simulates each build once and reports the
output difference from opt=none (all three levels must agree exactly).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from npuc.backends.bm1880.build import compile_bmodel
from npuc.backends.bm1880.container import write_bmodel
from npuc.backends.bm1880.quantize import load_thresholds
from npuc.backends.bm1880.sim import run_bmodel
from npuc.compiler.ir import Graph
from npuc.frontends.onnx import import_onnx
from npuc.passes.calibration.calibrate import max_abs_thresholds
from npuc.passes.rewrite.canonicalize import canonicalize

OPTS = ("none", "layer-group", "layer-group-weight")
GOLDEN_BM1880 = Path(__file__).resolve().parents[1].parent / "shared" / "golden" / "bm1880"


def _graph(path: Path, shapes: dict | None = None) -> Graph:
    graph = import_onnx(path, shapes)
    canonicalize(graph)
    return graph


def lenet(tmp: Path) -> tuple[list[Graph], dict[str, float], np.ndarray]:
    model = onnx.load(str(GOLDEN_BM1880 / "lenet_float.onnx"))
    (elu,) = [n for n in model.graph.node if n.op_type == "Elu"]
    model.graph.node.remove(elu)
    model.graph.output[0].name = elu.input[0]
    onnx.save(model, str(tmp / "lenet.onnx"))
    x = np.fromfile(GOLDEN_BM1880 / "lenet_input_1_1_28_28.bin", np.float32).reshape(1, 1, 28, 28)
    return [_graph(tmp / "lenet.onnx")], load_thresholds(GOLDEN_BM1880 / "bmnet_lenet_calibration.prototxt"), x


def pnet(tmp: Path) -> tuple[list[Graph], dict[str, float], np.ndarray]:
    from npuc.models.fetch import fetch_model
    from npuc.models.images import model_inputs

    path = fetch_model("mtcnn_pnet")
    feeds = model_inputs("mtcnn_pnet", 8)
    table = max_abs_thresholds(_graph(path, {"input_1": feeds[0]["input_1"].shape}), feeds)
    graphs = [_graph(path, {"input_1": s}) for s in ((1, 12, 12, 3), (1, 288, 384, 3))]
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 288, 384)).astype(np.float32)
    return graphs, table, x


def resnet18(tmp: Path) -> tuple[list[Graph], dict[str, float], np.ndarray]:
    from npuc.models.make_models import make_all

    graph = _graph(make_all(tmp, ["resnet18_224"])["resnet18_224"])
    rng = np.random.default_rng(0)
    feeds = [{graph.inputs[0]: rng.standard_normal(graph.shape(graph.inputs[0])).astype(np.float32)}]
    return [graph], max_abs_thresholds(graph, feeds), feeds[0][graph.inputs[0]]


MODELS = {"lenet": lenet, "pnet": pnet, "resnet18": resnet18}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--run", action="store_true", help="simulate each build once and compare the opt levels")
    args = parser.parse_args()
    print(f"{'model':9} {'opt':19} {'build s':>8} {'bmodel B':>10} {'neuron B':>10} {'DDR B':>11} {'groups':>6}  run")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            graphs, table, x = MODELS[name](Path(tmp))
            base = None
            for opt in OPTS:
                start = time.perf_counter()
                model, stats, _, _ = compile_bmodel(graphs, table, None, opt, name)
                data = write_bmodel(model)
                seconds = time.perf_counter() - start
                st = stats[-1]
                note = ""
                if args.run:
                    out = run_bmodel(model, {"input": x}, tuple(x.shape))
                    base = base or out
                    same = all(np.array_equal(out[k], base[k]) for k in base)
                    note = "identical to none" if same else "DIFFERS from none"
                print(f"{name:9} {opt:19} {seconds:8.2f} {len(data):10d} {st.neuron_size:10d} {st.ddr_bytes:11d} "
                      f"{st.groups:6d}  {note}")  # fmt: skip


if __name__ == "__main__":
    main()
