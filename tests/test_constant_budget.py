"""A tiny model that asks constant folding for a huge tensor is refused before anything is allocated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _bomb(path: Path, op: str) -> Path:
    shape = numpy_helper.from_array(np.array([100000, 1000000], np.int64), "shape")
    if op == "ConstantOfShape":
        value = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
        maker = helper.make_node("ConstantOfShape", ["shape"], ["big"], name="maker", value=value)
    else:
        maker = helper.make_node("Expand", ["x", "shape"], ["big"], name="maker")
    add = helper.make_node("Add", ["x", "big"], ["y"])
    graph = helper.make_graph([maker, add], "bomb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand"])
def test_huge_constant_is_refused_within_a_memory_limit(tmp_path: Path, op: str) -> None:
    model = _bomb(tmp_path / "bomb.onnx", op)
    assert model.stat().st_size < 300
    script = (
        "import os, resource, sys\n"
        "rss = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE')\n"
        "resource.setrlimit(resource.RLIMIT_AS, (rss + (2 << 30), rss + (2 << 30)))\n"
        "from npuc.cli.app import main\n"
        f"main(['inspect', {str(model)!r}])\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 2, run.stderr[-400:]
    assert (
        run.stderr.count("\n") == 1 and f"node 'maker' ({op}) makes a tensor of shape [100000, 1000000]" in run.stderr
    )
