"""Names from a model (node, tensor, --name) reach generated sources, file names and manifests only through
`compiler/sanitize.py`: for every target, hostile names build, write nothing outside -o, and inject no code."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tokenize
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import npuc
from npuc.backends.lyngor.manifest import read_tree
from npuc.compiler.errors import UserError
from npuc.compiler.sanitize import c_comment, c_identifier, c_string, file_stem, py_string, table_field

NODE_NAMES = ["conv\nint injected_a = 1; //", "relu */ int injected_b = 2; /*", 'pool" ; int injected_c; //', "../x\\"]
# tensor names: anything but whitespace (a cali_table row is whitespace-separated: see test_calibrate_refuses...)
TENSORS = {"in": 'in*/evil();/*"../x', "w": 'w\\../"*/', "c": "c*/", "r": '"r"', "out": 'out*/../"y'}
SPACED = {**TENSORS, "in": "in\n*/ int injected_e; /*", "out": 'out\n"); import os; os.system("")  #'}


def _model(path: Path, names: dict[str, str]) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), names["w"])
    nodes = [
        helper.make_node("Conv", [names["in"], names["w"]], [names["c"]], name=NODE_NAMES[0], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", [names["c"]], [names["r"]], name=NODE_NAMES[1]),
        helper.make_node("MaxPool", [names["r"]], ["p"], name=NODE_NAMES[2], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Relu", ["p"], [names["out"]], name=NODE_NAMES[3]),
    ]
    x = helper.make_tensor_value_info(names["in"], TensorProto.FLOAT, [1, 3, 16, 16])
    y = helper.make_tensor_value_info(names["out"], TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g\n*/", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _feed(names: dict[str, str]) -> dict[str, np.ndarray]:
    return {names["in"]: np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def _c_code(path: Path) -> str:
    """A C/C++ source with comments removed and string literals emptied: what the compiler sees as code."""
    bare = subprocess.run(["g++", "-x", "c++", "-fpreprocessed", "-E", "-P", str(path)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    return re.sub(r'"(\\.|[^"\\])*"', '""', bare)


def _py_names(source: str) -> set[str]:
    """The identifiers of a Python source (string literals and comments excluded)."""
    return {t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.NAME}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


def _only_output(root: Path, out: Path) -> None:
    """Nothing but `out` (and the inputs) appeared in `root`: no name escaped the output path."""
    assert sorted(p.name for p in root.iterdir() if p.name not in ("m.onnx", "t.txt", "data")) == [out.name]


def test_float_targets_with_whitespace_in_every_name(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", SPACED)
    out = tmp_path / "lyngor"
    npuc.build(model, "lyngor", out)
    _only_output(tmp_path, out)
    tree = read_tree(out)  # manifests: JSON escapes the names, the schema reads them back
    assert SPACED["in"] in tree.top_graph["main"]["inputs"]
    np.testing.assert_allclose(npuc.run(out, _feed(SPACED))[SPACED["out"]],
                               npuc.run(model, _feed(SPACED))[SPACED["out"]], rtol=2e-2, atol=2e-2)  # fmt: skip
    delegate = tmp_path / "delegate"
    npuc.build(model, "lyngor", delegate, options={"delegate": True})
    script = (delegate / "build_lyngor.py").read_text()
    compile(script, "build_lyngor.py", "exec")
    assert not {n for n in _py_names(script) if "inject" in n or n in ("os", "system")}
    assert py_string(SPACED["in"]) in script
    cvi = tmp_path / "m.cvimodel"
    npuc.build(model, "cv18xx", cvi, quant="bf16")
    assert npuc.run(cvi, _feed(SPACED))[SPACED["out"]].shape == (1, 8, 8, 8)


def test_dmp_sources_from_hostile_tensor_names_and_name(tmp_path: Path) -> None:
    from npuc.backends.dmp.codegen import INCLUDE_DIR

    model = _model(tmp_path / "m.onnx", SPACED)
    out = tmp_path / "dmp"
    npuc.build(model, "dmp", out, options={"name": "../../evil();\n*/"})
    _only_output(tmp_path, out)
    sources = sorted(p for p in out.iterdir() if p.suffix in (".cpp", ".h"))
    assert [p.name for p in sources] == ["______evil_______gen.cpp", "______evil_______gen.h"]
    for path in sources:
        code = _c_code(path)
        assert "injected" not in code and "evil(" not in code
    compiled = subprocess.run(["g++", "-std=c++14", "-fsyntax-only", "-I", str(INCLUDE_DIR), str(sources[0])],
                              capture_output=True, text=True, check=False)  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr[-1500:]
    assert npuc.run(out, _feed(SPACED))[SPACED["out"]].shape == (1, 8, 8, 8)


def test_calibrate_refuses_names_a_table_cannot_hold(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", SPACED)
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "0.npy", _feed(SPACED)[SPACED["in"]])
    with pytest.raises(UserError, match="cannot be written into a cali_table"):
        npuc.calibrate(model, [tmp_path / "data"], tmp_path / "t.txt")
    assert not (tmp_path / "t.txt").exists()


@pytest.fixture(scope="module")
def calibrated(folder: Path) -> tuple[Path, Path]:
    model = _model(folder / "m.onnx", TENSORS)
    (folder / "data").mkdir()
    for i in range(2):
        np.save(
            folder / "data" / f"{i}.npy", np.random.default_rng(i).standard_normal((1, 3, 16, 16)).astype(np.float32)
        )
    npuc.calibrate(model, [folder / "data"], folder / "t.txt")
    return model, folder / "t.txt"


@pytest.mark.parametrize("target, out", [("cv18xx", "m.cvimodel"), ("bm1880", "m.bmodel"), ("bpu", "bpu")])
def test_int8_targets(calibrated: tuple[Path, Path], tmp_path: Path, target: str, out: str) -> None:
    model, table = calibrated
    root = tmp_path / "root"
    root.mkdir()
    options = {"name": "../../escape\n*/"} if target == "bpu" else {}
    npuc.build(model, target, root / out, calib=table, options=options)
    _only_output(root, root / out)
    if target != "bpu":  # a bmodel keeps no tensor names: its input is "input", its output the first
        x = _feed(TENSORS)[TENSORS["in"]]
        outputs = npuc.run(root / out, {TENSORS["in"] if target == "cv18xx" else "input": x})
        assert next(iter(outputs.values())).size == 8 * 8 * 8
        return
    headers = list((root / out).glob("*.h"))  # --name became a plain file name inside -o
    assert [h.name for h in headers] == [f"{file_stem(options['name'])}_hbdnn_contract.h"]
    assert "evil(" not in _c_code(headers[0])  # in comments and identifiers only as harmless text
    compiled = subprocess.run(["gcc", "-x", "c", "-fsyntax-only", "-DNPUC_HBDNN_STANDALONE", str(headers[0])],
                              capture_output=True, text=True, check=False)  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr[-1500:]
    json.loads((root / out / "hbdnn_contract.json").read_text())


def test_one_sanitiser_per_context() -> None:
    hostile = 'a\n*/ b"c\\d??/é ../'
    assert c_identifier(hostile) == "a____b_c_d________" and c_identifier("9x") == "Net_9x"
    assert len(c_identifier("x" * 300)) == 120
    assert "\n" not in c_comment(hostile) and "*/" not in c_comment(hostile) and "\\" not in c_comment(hostile)
    assert c_string(hostile).isascii() and "\n" not in c_string(hostile) and '\\"' in c_string(hostile)
    assert eval(py_string(hostile)) == hostile  # noqa: S307 - a literal, checked to be one
    assert file_stem("../..") == "_.._.." and file_stem("a/b c") == "a_b_c" and file_stem("") == "_"
    for bad in ("a b", "#x", "", "a\nb"):
        with pytest.raises(UserError, match="rename the tensor"):
            table_field(bad, "qtable")
    assert table_field('"x"*/', "qtable") == '"x"*/'
