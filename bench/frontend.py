"""Frontend benchmark: import + canonicalize time and peak memory per real model.

Each model runs in a fresh child process so its peak RSS is its own. Run: `make bench` or
`python bench/frontend.py [NAME...]`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

MODELS = ["pplcnet_orientation", "mbv3_textline_cls", "mtcnn_pnet", "mtcnn_rnet", "ppocrv6_det_tiny", "yolov8n_320",
          "ppocrv4_rec", "ddddocr_crnn"]  # fmt: skip
CHAIN_LENGTHS = (1000, 2000, 5000)  # Conv+Relu chains: time must grow linearly with depth

_CHILD = """
import json, resource, sys, time
from npuc.models.fetch import fetch_model, get_model
from npuc.frontends.onnx import import_onnx
from npuc.passes.rewrite.canonicalize import canonicalize
name = sys.argv[1]
path, spec = fetch_model(name), get_model(name)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
graph = import_onnx(path, {spec.input_name: spec.input_shape})
t1 = time.perf_counter()
canonicalize(graph)
t2 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"name": name, "import_s": t1 - t0, "canon_s": t2 - t1, "ops": len(graph.ops),
                  "peak_mb": peak / 1024, "delta_mb": (peak - base) / 1024, "bytes": path.stat().st_size}))
"""


def main(names: list[str]) -> None:
    print(f"{'model':<22} {'size MB':>8} {'import s':>9} {'canon s':>8} {'IR ops':>7} {'peak RSS MB':>12}")
    for name in names:
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", _CHILD, name], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{r['name']:<22} {r['bytes'] / 1e6:>8.2f} {r['import_s']:>9.3f} {r['canon_s']:>8.3f} "
            f"{r['ops']:>7} {r['peak_mb']:>12.1f}   (process {time.perf_counter() - start:.1f} s)"
        )


# what each command runs on a chain; {table}: a table with threshold 1 for every tensor
CHAIN_COMMANDS = {
    "inspect": ["inspect", "{model}"],
    "cv18xx int8": ["build", "{model}", "--target", "cv18xx", "--calib", "{table}", "-o", "{out}.cvimodel"],
    "cv18xx bf16": ["build", "{model}", "--target", "cv18xx", "--quant", "bf16", "-o", "{out}.cvimodel"],
    "bm1880": ["build", "{model}", "--target", "bm1880", "--calib", "{table}", "-o", "{out}.bmodel"],
    "bpu": ["build", "{model}", "--target", "bpu", "--calib", "{table}", "-o", "{out}_bpu"],
    "dmp": ["build", "{model}", "--target", "dmp", "-o", "{out}_dmp"],
    "lyngor": ["build", "{model}", "--target", "lyngor", "-o", "{out}_lyngor"],
}


def _chain(n: int, folder: Path) -> tuple[Path, Path]:
    """A Conv+Relu chain of n layers (4 channels, 8x8) and a table giving every tensor threshold 1."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, x, rows = [], [], "x", ["x 1.0 -1.0 1.0"]
    for i in range(n):
        inits.append(numpy_helper.from_array(np.full((4, 4, 1, 1), 0.1, np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"]), helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        rows += [f"c{i} 1.0 -1.0 1.0", f"r{i} 1.0 0.0 1.0"]
        x = f"r{i}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])]
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "chain", inputs, outputs, inits)
    model, table = folder / f"chain{n}.onnx", folder / f"chain{n}.cali_table"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model)
    table.write_text("\n".join(rows) + "\n")
    return model, table


def deep_chains() -> None:
    """CPU seconds of `npuc inspect` and of a build for every target on Conv+Relu chains of growing depth: time
    must grow linearly with depth (issue: a 5000-layer chain within a minute of CPU per command)."""
    import resource
    import tempfile

    print(f"{'chain layers':>12} " + " ".join(f"{name:>12}" for name in CHAIN_COMMANDS) + "   (CPU seconds)")
    with tempfile.TemporaryDirectory(prefix="npuc-bench-chain-") as tmp:
        for n in CHAIN_LENGTHS:
            model, table = _chain(n, Path(tmp))
            cells = []
            for name, args in CHAIN_COMMANDS.items():
                out = Path(tmp) / f"{n}_{name.replace(' ', '_')}"
                argv = [a.format(model=model, table=table, out=out) for a in args]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run([sys.executable, "-m", "npuc", *argv], capture_output=True, check=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cells.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
            print(f"{n:>12} " + " ".join(f"{cpu:>12.2f}" for cpu in cells))


if __name__ == "__main__":
    main(sys.argv[1:] or MODELS)
    if not sys.argv[1:]:
        deep_chains()
