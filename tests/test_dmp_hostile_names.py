"""Node names and paths reach the generated DMP C++ only through one sanitiser per context (C string literal,
comment): hostile names compile and inject nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npuc.backends.dmp.codegen import INCLUDE_DIR

HOSTILE = [
    "conv\nint injected_a = 1; //",
    "relu */ int injected_b = 2; /*",
    'quote" ; int injected_c = 3; //',
    "trail\\",
    "tri??/",
    "héllo ✓ \u2028 end",
]


def _model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name=HOSTILE[0], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name=HOSTILE[1]),
        helper.make_node("MaxPool", ["r"], ["p"], name=HOSTILE[2], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Relu", ["p"], ["q"], name=HOSTILE[3]),
        helper.make_node("Flatten", ["q"], ["f"], name=HOSTILE[4]),
        helper.make_node("Relu", ["f"], ["y"], name=HOSTILE[5]),
    ]
    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_hostile_names_compile_and_inject_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "weird *" / " dir"  # the model path, printed in a comment, holds "*/"
    folder.mkdir(parents=True)
    model = _model(folder / "m.onnx")
    out = tmp_path / "out"
    build = [sys.executable, "-m", "npuc", "build", str(model), "--target", "dmp", "-o", str(out)]
    run = subprocess.run(build, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    sources = sorted(p for p in out.iterdir() if p.suffix in (".cpp", ".h"))
    assert len(sources) == 2
    for path in sources:  # with comments removed and string literals emptied, no injected code remains
        bare = subprocess.run(["g++", "-x", "c++", "-fpreprocessed", "-E", "-P", str(path)], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
        code = re.sub(r'"(\\.|[^"\\])*"', '""', bare)
        assert "injected" not in code, [line for line in code.splitlines() if "injected" in line]
    assert "injected_a" in sources[0].read_text() + sources[1].read_text()  # the names are there, harmless
    cpp = next(p for p in out.iterdir() if p.suffix == ".cpp")
    compiled = subprocess.run(["g++", "-std=c++14", "-fsyntax-only", "-Wall", "-I", str(INCLUDE_DIR), str(cpp)],
                              capture_output=True, text=True, check=False)  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr[-2000:]
