"""Bad input to the lyngor target: unsupported dtypes, inconsistent resolution shape lists, corrupted trees.
Each must be a one-line UserError (exit code 2), never another exception."""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from golden import GOLDEN_ROOT

from npuc.backends.lyngor.build import build_tree
from npuc.backends.lyngor.manifest import read_tree
from npuc.backends.lyngor.payload import read_program, write_program
from npuc.backends.lyngor.sim import run_tree
from npuc.compiler.errors import UserError
from npuc.compiler.targets import BuildRequest
from npuc.frontends.onnx import import_onnx
from npuc.passes.rewrite.canonicalize import canonicalize

GOLDEN = GOLDEN_ROOT
SMALLCNN = GOLDEN / "cv18xx" / "smallcnn.onnx"
APU_X = Path("Net_0/apu_0/apu_x")
X = np.load(GOLDEN / "cv18xx" / "smallcnn_in.npz")["input"]


def one_line_error(fn: Callable[[], object], match: str) -> str:
    with pytest.raises(UserError, match=match) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 2
    return message


def request(model: Path, out: Path, options: dict, shapes: dict | None = None) -> BuildRequest:
    graph = import_onnx(model, shapes)
    canonicalize(graph)
    return BuildRequest(graph=graph, model_path=model, output=out, options=options)


@pytest.fixture(scope="module")
def good_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lyngor") / "good"
    build_tree(request(SMALLCNN, out, {}))
    return out


@pytest.fixture
def tree(good_tree: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    shutil.copytree(good_tree, copy)
    return copy


# ---- build options -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, match",
    [
        ({"input_dtype": "int8"}, r"option input_dtype: 'int8' for input 'input' is not supported; choose one of "
                                  r"uint8, int16, float16, float32"),
        ({"input_dtype": {"input": "float64"}}, "'float64' for input 'input' is not supported"),
        ({"input_dtype": {"image": "uint8"}}, "'image' is not a model input"),
        ({"output_dtype": "int8"}, "option output_dtype: 'int8' is not supported"),
        ({"input_layout": "hwc"}, "option input_layout: 'hwc'"),
        ({"parallel_mode": "PP"}, "not DP or MP"),
        ({"run_batch": 0}, "run_batch: 0 is not an integer >= 1"),
        ({"batch": 2}, "unknown lyngor option 'batch'"),
    ],
)  # fmt: skip
def test_bad_build_options(tmp_path: Path, options: dict, match: str) -> None:
    one_line_error(lambda: build_tree(request(SMALLCNN, tmp_path / "out", options)), match)
    assert not (tmp_path / "out").exists()


def test_bad_quant_and_chip(tmp_path: Path) -> None:
    req = request(SMALLCNN, tmp_path / "out", {})
    req.quant = "int8"
    one_line_error(lambda: build_tree(req), "computes in fp16 only")
    req.quant, req.chip = None, "cv183x"
    one_line_error(lambda: build_tree(req), "not a Lyngor chip")


@pytest.mark.parametrize(
    "shapes_list, match",
    [
        ([{"input_1": (1, 12, 12, 3)}, {"input_2": (1, 24, 24, 3)}], r"'input_2' is not a model input"),
        ([{"input_1": (1, 12, 12, 3)}, {}], r"input_shapes_list\[1\] names inputs \[\] but entry 0 names"),
        ([{"input_1": (1, 12, 12, 3)}, {"input_1": (1, 24, 24)}], r"input 'input_1' has rank 3 but entry 0 has rank 4"),
        ([{"input_1": (1, 12, 12)}], r"has rank 3 but the model has rank 4"),
        ([{"input_1": (1, 0, 12, 3)}], "must be positive integers"),
        ({"input_1": (1, 12, 12, 3)}, "expected a list of"),
    ],
)  # fmt: skip
def test_inconsistent_resolution_shapes(tmp_path: Path, real_model, shapes_list: object, match: str) -> None:
    req = request(real_model("mtcnn_pnet"), tmp_path / "out", {"input_shapes_list": shapes_list},
                  {"input_1": (1, 12, 12, 3)})  # fmt: skip
    one_line_error(lambda: build_tree(req), match)
    assert not (tmp_path / "out").exists()


# ---- corrupted trees ---------------------------------------------------------------------------------------


def edit_json(path: Path, fn: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def rewrite_section(tree: Path, fn: Callable[[dict], None]) -> None:
    """Change the program's JSON section and rewrite the file with a valid header and CRC."""
    path = tree / APU_X / "npuc_prog.bin"
    doc = json.loads(read_program(path.read_bytes(), "prog")[0])
    fn(doc)
    data = write_program([json.dumps(doc).encode()])
    path.write_bytes(data)
    edit_json(tree / APU_X / "npuc_apu.json", lambda d: d.update(cmd_size=len(data)))
    edit_json(tree / APU_X / "apu.json", lambda d: d["apu_x"].update(cmd_size=len(data)))


def _set(keys: list, value: object) -> Callable[[dict], None]:
    def apply(doc: dict) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value

    return apply


CORRUPTIONS: list[tuple[str, Callable[[Path], None], str]] = [
    ("truncated net_params", lambda t: (t / "net_params.json").write_text('{"version": "2022'),
     r"net_params.json: not valid JSON \(line 1 column 13\)"),
    ("chip_num 2", lambda t: edit_json(t / "net_params.json", _set(["chip_num"], 2)),
     r"net_params.json: chip_num = 2 is not one of 1;"),
    ("net: without colon", lambda t: edit_json(t / "net_params.json", lambda d: d.update({"net": d.pop("net:")})),
     "net_params.json: net: is missing"),
    ("is_map as string", lambda t: edit_json(t / "net_params.json", _set(["is_map"], "true")),
     "net_params.json: is_map = 'true' is not of type boolean"),
    ("io_config path", lambda t: edit_json(t / "net_params.json", _set(["file_name", "io_config"], "../x.json")),
     r"file_name.io_config = '../x.json' does not match"),
    ("top_graph missing", lambda t: (t / "Net_0" / "top_graph.json").unlink(), "top_graph.json: file is missing"),
    ("list shape in main", lambda t: edit_json(t / "Net_0/top_graph.json",
                                               _set(["main", "inputs", "input", "shape"], "[1, 3, 64, 64]")),
     r"main.inputs.input.shape = '\[1, 3, 64, 64\]' does not match"),
    ("output key", lambda t: edit_json(t / "Net_0/top_graph.json", _set(
        ["main", "outputs"], {"apu_0-0": {"shape": "(1, 10)", "dtype": "float16"}})),
     r"main.outputs.apu_0-0 is not a field of this format"),
    ("undocumented top_graph key", lambda t: edit_json(t / "Net_0/top_graph.json", _set(["apu_0", "input_num"], 1)),
     "apu_0.input_num is not a field of this format"),
    ("num wrong", lambda t: edit_json(t / APU_X / "npuc_apu.json", _set(["inputs", "datai0", "num"], 5)),
     "num 5 is not the element count"),
    ("size wrong", lambda t: edit_json(t / APU_X / "apu.json", _set(["apu_x", "inputs", "datai0", "size"], 5)),
     "size 5 is not the element count"),
    ("apu.json node differs", lambda t: edit_json(t / APU_X / "apu.json",
                                                  _set(["apu_x", "outputs", "datao0", "name"], "other")),
     "node 'output' differs from apu.json's"),
    ("cmd_size not 256k", lambda t: edit_json(t / APU_X / "npuc_apu.json", _set(["cmd_size"], 1000)),
     "cmd_size = 1000 breaks multipleOf 256"),
    ("cmd_size mismatch", lambda t: edit_json(t / APU_X / "npuc_apu.json", _set(["cmd_size"], 256 * 40)),
     "cmd_size: 10240 but npuc_prog.bin has"),
    ("apu.json cmd_size", lambda t: edit_json(t / APU_X / "apu.json", _set(["apu_x", "cmd_size"], 256 * 40)),
     "cmd_size/run_batch differ from apu.json's"),
    ("cmd_file escape", lambda t: edit_json(t / APU_X / "npuc_apu.json", _set(["cmd_file"], "../../net_params.json")),
     "is not a file beside apu.json"),
    ("sub_image_size", lambda t: edit_json(t / APU_X / "npuc_apu.json",
                                           _set(["inputs", "datai0", "sub_image_size"], ["[1, 3, 64, 65]"])),
     "sub_image_size and sub_image_size_ex differ"),
    ("missing res0", lambda t: edit_json(t / APU_X / "npuc_apu.json", _set(["resolution_config"], {})),
     r"resolution_config = \{\} breaks minProperties 1"),
]  # fmt: skip


@pytest.mark.parametrize("what, corrupt, match", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corrupted_manifests(tree: Path, what: str, corrupt: Callable[[Path], None], match: str) -> None:
    corrupt(tree)
    one_line_error(lambda: read_tree(tree), match)
    one_line_error(lambda: run_tree(tree, {"input": X}), match)


def _flip(path: Path, offset: int, fix_crc: bool = False) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    if fix_crc:  # a consistent-looking file: the structural checks, not the CRC, must catch it
        data[24:28] = zlib.crc32(bytes(data[32:])).to_bytes(4, "little")
    path.write_bytes(bytes(data))


PAYLOAD_CORRUPTIONS: list[tuple[str, Callable[[Path], None], str]] = [
    ("prog magic", lambda t: _flip(t / APU_X / "npuc_prog.bin", 0), "is not b'NPUCLYNP'"),
    ("prog version", lambda t: _flip(t / APU_X / "npuc_prog.bin", 8), "format version 91 is not 1"),
    ("prog body", lambda t: _flip(t / APU_X / "npuc_prog.bin", 300), "CRC32 mismatch"),
    ("prog section range", lambda t: _flip(t / APU_X / "npuc_prog.bin", 37, True), r"section 0 \[.*\) lies outside"),
    ("prog section count", lambda t: _flip(t / APU_X / "npuc_prog.bin", 13), "section_num 23041 does not fit"),
    ("weight magic", lambda t: _flip(t / APU_X / "npuc_weight.bin", 3), "is not b'NPUCLYNW'"),
    ("weight data", lambda t: _flip(t / APU_X / "npuc_weight.bin", 5000), "CRC32 mismatch over the data area"),
    ("weight entry", lambda t: _flip(t / APU_X / "npuc_weight.bin", 32 + 16 * 3 + 3), "runs past the end"),
    ("unknown op kind", lambda t: rewrite_section(t, lambda d: d["ops"][0].update(kind="bogus")),
     "op 0 has unknown kind 'bogus'"),
    ("bad attr", lambda t: rewrite_section(t, lambda d: d["ops"][0]["attrs"].update(stride=3)),
     "malformed program section"),
    ("weight index", lambda t: rewrite_section(t, lambda d: d["consts"][0].update(weight=99)),
     "refers to weight 99"),
    ("const shape", lambda t: rewrite_section(t, lambda d: d["consts"][0].update(shape=[7, 7])),
     "does not hold"),
    ("dangling input", lambda t: rewrite_section(t, lambda d: d["ops"][1].update(inputs=["nowhere"])),
     "op 1 reads 'nowhere', which no earlier op, input or const defines"),
    ("conv stride 0", lambda t: rewrite_section(t, lambda d: d["ops"][0]["attrs"].update(strides=[0, 1])),
     r"ops\[0\].attrs.strides\[0\] = 0 breaks minimum 1"),
    ("conv dilation 0", lambda t: rewrite_section(t, lambda d: d["ops"][0]["attrs"].update(dilations=[1, 0])),
     r"ops\[0\].attrs.dilations\[1\] = 0 breaks minimum 1"),
    ("input name a list", lambda t: rewrite_section(t, lambda d: d["ops"][1].update(inputs=[["x"]])),
     r"ops\[1\].inputs\[0\] = \['x'\] is not of type string"),
    ("output name a number", lambda t: rewrite_section(t, lambda d: d["outputs"][0].update(name=7)),
     r"outputs\[0\].name = 7 is not of type string"),
    ("pool mode a number", lambda t: rewrite_section(t, lambda d: _first(d, "pool2d")["attrs"].update(mode=1e300)),
     r"ops\[\d+\].attrs.mode = 1e\+300 is not one of max, avg"),
    # bench/fuzz.py --seed 10, lyngor_program cases 812 and 4452: the kind reached the kernel table (KeyError)
    ("eltwise kind unknown", lambda t: rewrite_section(t, lambda d: _first(d, "eltwise")["attrs"].update(kind="abc")),
     r"ops\[\d+\].attrs.kind = 'abc' is not one of add, sub, mul, div, max, min, pow"),
    ("eltwise kind a digit", lambda t: rewrite_section(t, lambda d: _first(d, "eltwise")["attrs"].update(kind="1")),
     r"ops\[\d+\].attrs.kind = '1' is not one of add, sub"),
    ("global pool mode unknown",
     lambda t: rewrite_section(t, lambda d: _first(d, "global_pool")["attrs"].update(mode="sum")),
     r"ops\[\d+\].attrs.mode = 'sum' is not one of max, avg"),
    ("group a float", lambda t: rewrite_section(t, lambda d: _first(d, "conv2d")["attrs"].update(group=1.5)),
     r"malformed program section \(TypeError: 1.5 is not of type int\)"),
    ("group null", lambda t: rewrite_section(t, lambda d: _first(d, "conv2d")["attrs"].update(group=None)),
     r"malformed program section \(TypeError: null is not of type int\)"),
    ("eltwise kind null", lambda t: rewrite_section(t, lambda d: _first(d, "eltwise")["attrs"].update(kind=None)),
     r"ops\[\d+\].attrs.kind = None is not one of add, sub"),
]  # fmt: skip


def _first(doc: dict, kind: str) -> dict:
    return next(op for op in doc["ops"] if op["kind"] == kind)


@pytest.mark.parametrize("what, corrupt, match", PAYLOAD_CORRUPTIONS, ids=[c[0] for c in PAYLOAD_CORRUPTIONS])
def test_corrupted_payload(tree: Path, what: str, corrupt: Callable[[Path], None], match: str) -> None:
    corrupt(tree)
    read_tree(tree)  # the manifests are still fine: only running decodes the payload
    one_line_error(lambda: run_tree(tree, {"input": X}), match)


def test_random_byte_flips_never_crash(tree: Path) -> None:
    rng = np.random.default_rng(0)
    prog = tree / APU_X / "npuc_prog.bin"
    original = prog.read_bytes()
    reference = run_tree(tree, {"input": X})["output"]
    outcomes = {"error": 0, "same": 0}
    for offset in [*range(48), *rng.integers(48, len(original), 40).tolist()]:
        _flip(prog, offset)
        try:
            out = run_tree(tree, {"input": X})["output"]
            assert np.array_equal(out, reference)  # a flip the format ignores (reserved/padding) changes nothing
            outcomes["same"] += 1
        except UserError as exc:
            assert "\n" not in str(exc)
            outcomes["error"] += 1
        prog.write_bytes(original)
    assert outcomes["error"] >= 70 and outcomes["error"] + outcomes["same"] == 88


def test_bad_feeds(tree: Path) -> None:
    one_line_error(lambda: run_tree(tree, {"input": X.astype(np.float16)}), r"fed float32, given float16")
    one_line_error(lambda: run_tree(tree, {"input": X[:, :, :32]}), r"match no compiled resolution")
    one_line_error(lambda: run_tree(tree, {"x": X}), r"do not match the inputs \['input'\]")
    one_line_error(lambda: read_tree(tree / "Net_0"), "net_params.json: file is missing")


# ---- through the CLI: one line on stderr, exit code 2 ------------------------------------------------------


def cli_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from npuc.cli.app import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_cli_bad_input_exits_2(tmp_path: Path, good_tree: Path, real_model, capsys) -> None:
    out = str(tmp_path / "out")
    err = cli_error(["build", str(SMALLCNN), "--target", "lyngor", "-o", out, "--input-dtype", "int8"], capsys)
    assert "option input_dtype: 'int8' for input 'input' is not supported" in err
    pnet = str(real_model("mtcnn_pnet"))
    shapes = ["--input-shape", "input_1:1,12,12,3", "--input-shape", "input_1:1,24,24"]
    err = cli_error(["build", pnet, "--target", "lyngor", "-o", out, *shapes], capsys)
    assert "input 'input_1' has rank 3 but entry 0 has rank 4" in err
    assert not (tmp_path / "out").exists()
    broken = tmp_path / "broken"
    shutil.copytree(good_tree, broken)
    (broken / "Net_0" / "top_graph.json").write_text('{"main": ')
    err = cli_error(["inspect", str(broken)], capsys)
    assert "top_graph.json: not valid JSON" in err
