"""The resource bombs of issue 21 as fixed regression cases: each runs the CLI in a child process whose address
space is capped at 1 GiB above what Python and npuc's libraries map at start, and whose CPU time is capped
(RLIMIT_CPU kills it with SIGXCPU past the cap: no wall-clock assertion). A bomb must end in exit 2 and one
line; a valid deep model must finish."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from golden import GOLDEN_ROOT
from onnx import TensorProto, helper, numpy_helper
from test_constant_budget import _bomb

import npuc
from npuc.models.make_models import make_model

MEMORY_LIMIT = 1 << 30
CPU_SECONDS = 10  # a bomb is refused within this (the bound; start-up imports included)
CHAIN_CPU_SECONDS = 60  # a valid 5000-layer model is built within a minute of CPU
# The CLI's own libraries are mapped before the cap is set, so it bounds what the command allocates.
CAPPED_CLI = """
import os, resource, sys
import numpy, onnx, onnxruntime
pages = int(open('/proc/self/statm').read().split()[0])
cap = pages * os.sysconf('SC_PAGE_SIZE') + {memory}
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))
from npuc.cli.app import main
main(sys.argv[1:])
"""


def capped_cli(*args: str, cwd: Path, cpu: int = CPU_SECONDS) -> subprocess.CompletedProcess:
    script = CAPPED_CLI.format(memory=MEMORY_LIMIT, cpu=cpu)
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=cwd, check=False)


def assert_one_line(run: subprocess.CompletedProcess, message: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr[-600:])
    assert run.stderr.startswith("npuc: error: ") and run.stderr.count("\n") == 1, run.stderr[-600:]
    assert message in run.stderr, run.stderr


def _tinycnn(folder: Path) -> Path:
    path = folder / "tinycnn.onnx"
    path.write_bytes(make_model("tinycnn").SerializeToString())
    return path


def _npy_header(shape: tuple[int, ...]) -> bytes:
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def test_npz_claiming_1e11_elements(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as z:
        z.writestr("input.npy", _npy_header((100_000_000_000,)))
    run = capped_cli("run", str(_tinycnn(tmp_path)), "--input", "huge.npz", cwd=tmp_path)
    assert_one_line(run, "huge.npz")


def test_npz_zip_bomb(tmp_path: Path) -> None:
    """1.2 GB of zeros in a 1.2 MB member whose header tells the truth: refused before it is expanded."""
    count = 300_000_000
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("input.npy", "w", force_zip64=True) as member:
            member.write(_npy_header((count,)))
            chunk = bytes(1 << 24)
            for _ in range(count * 4 // len(chunk)):
                member.write(chunk)
            member.write(bytes(count * 4 % len(chunk)))
    assert (tmp_path / "bomb.npz").stat().st_size < 10 << 20
    run = capped_cli("run", str(_tinycnn(tmp_path)), "--input", "bomb.npz", cwd=tmp_path)
    assert_one_line(run, "bomb.npz")


def test_cvimodel_with_a_tensor_far_beyond_any_board(tmp_path: Path) -> None:
    from npuc.backends.cv18xx.container import read_cvimodel, write_cvimodel

    out = tmp_path / "m.cvimodel"
    npuc.build(_tinycnn(tmp_path), "cv18xx", out, quant="bf16")
    model = read_cvimodel(out.read_bytes())
    io = next(t for t in model.body.programs[0].tensor_map if t.offset >> 40 >= 3)
    io.offset |= 1 << 38  # one flipped bit: 256 GiB into its region
    program = model.body.programs[0]
    program.shared_gmem = program.private_gmem = (1 << 32) - 1
    out.write_bytes(write_cvimodel(model))
    run = capped_cli("run", str(out), "--random-input", cwd=tmp_path)
    assert_one_line(run, "m.cvimodel: programs[0].shared_gmem: gmem region 0 of 4294967295 bytes")


def test_constant_of_shape_of_1e11_elements(tmp_path: Path) -> None:
    run = capped_cli("inspect", str(_bomb(tmp_path / "bomb.onnx", "ConstantOfShape")), cwd=tmp_path)
    assert_one_line(run, "makes a tensor of shape [100000, 1000000]")


@pytest.mark.parametrize("linked", ["weights", "prototxt"])
def test_caffe_files_linked_to_dev_zero(tmp_path: Path, linked: str) -> None:
    lenet = GOLDEN_ROOT / "bm1880"
    zero = tmp_path / ("zero.prototxt" if linked == "prototxt" else "zero.caffemodel")
    zero.symlink_to("/dev/zero")
    prototxt = zero if linked == "prototxt" else lenet / "lenet_deploy.prototxt"
    weights = zero if linked == "weights" else lenet / "lenet_float.caffemodel"
    args = ("build", str(prototxt), "--weights", str(weights), "--target", "bm1880", "-o", "m.bmodel")
    assert_one_line(capped_cli(*args, cwd=tmp_path), f"{zero.name}: not a regular file")
    assert not (tmp_path / "m.bmodel").exists()


def test_yaml_alias_bomb(tmp_path: Path) -> None:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    lines += ["model_parameters:", "  onnx_model: m.onnx", "  output_model_file_prefix: *i"]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    assert (tmp_path / "bomb.yaml").stat().st_size < 1200
    run = capped_cli("build", "--config", "bomb.yaml", "--target", "bpu", "-o", "out", cwd=tmp_path)
    assert_one_line(run, "bomb.yaml: line 9: invalid YAML (more than 64 aliases")


def _chain(path: Path, layers: int) -> Path:
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        weights.append(numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.3).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], weights)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.mark.parametrize(
    "command",
    [
        ("inspect",),
        ("build", "--target", "lyngor", "-o", "out"),
        ("build", "--target", "dmp", "-o", "out"),
        ("build", "--target", "cv18xx", "--quant", "bf16", "-o", "out.cvimodel"),
    ],
)
def test_5000_layer_chain_within_the_cpu_limit(tmp_path: Path, command: tuple[str, ...]) -> None:
    model = _chain(tmp_path / "chain.onnx", 5000)
    run = capped_cli(command[0], str(model), *command[1:], cwd=tmp_path, cpu=CHAIN_CPU_SECONDS)
    assert run.returncode == 0, (run.returncode, run.stderr[-600:])  # SIGXCPU past the limit: -24
