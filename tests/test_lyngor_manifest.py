"""Lyngor manifests checked field by field against the documented field list, as JSON schemas.

The schemas below are written from Lynxi's "编译生成物说明" page (net_params.json, top_graph.json main/outputs)
and from npuc's documented field list for the apu_0 object and apu.json (backends/lyngor/manifest.py),
independently of the field tables that write the files. `jsonschema` is not installed, so `check` is a small
validator for the subset used here (type, enum, const, pattern, multipleOf, minimum, required, properties,
patternProperties, additionalProperties, items).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from npuc.backends.lyngor.build import build_tree
from npuc.backends.lyngor.manifest import read_tree
from npuc.backends.lyngor.sim import run_tree
from npuc.compiler.targets import BuildRequest
from npuc.frontends.onnx import import_onnx
from npuc.passes.canonicalize import canonicalize
from onnx import TensorProto, helper, numpy_helper

GOLDEN = Path(__file__).resolve().parents[1].parent / "shared" / "golden"
SMALLCNN = GOLDEN / "cv18xx" / "smallcnn.onnx"

# ---- a minimal JSON-schema checker -------------------------------------------------------------------------

_TYPES = {
    "object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
    "integer": int, "number": (int, float),
}  # fmt: skip


def check(schema: dict, value: object, path: str = "$") -> None:
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(
            isinstance(value, _TYPES[k]) and not (k in ("integer", "number") and isinstance(value, bool)) for k in kinds
        )
        assert ok, f"{path}: {value!r} is not {kinds}"
    if "const" in schema:
        assert value == schema["const"] and type(value) is type(schema["const"]), f"{path}: {value!r} != const"
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    if "pattern" in schema:
        assert re.search(schema["pattern"], value), f"{path}: {value!r} does not match {schema['pattern']}"
    if "multipleOf" in schema:
        assert value % schema["multipleOf"] == 0, f"{path}: {value} not a multiple of {schema['multipleOf']}"
    if "minimum" in schema:
        assert value >= schema["minimum"], f"{path}: {value} < {schema['minimum']}"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{path}: missing {key!r}"
        for key, item in value.items():
            if key in schema.get("properties", {}):
                check(schema["properties"][key], item, f"{path}.{key}")
                continue
            matched = [p for p in schema.get("patternProperties", {}) if re.fullmatch(p, key)]
            for p in matched:
                check(schema["patternProperties"][p], item, f"{path}.{key}")
            if not matched:
                assert schema.get("additionalProperties", True) is not False, f"{path}: unexpected key {key!r}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check(schema["items"], item, f"{path}[{i}]")


def _obj(required: dict, **extra) -> dict:
    return {"type": "object", "required": list(required), "properties": required, "additionalProperties": False,
            **extra}  # fmt: skip


TUPLE_SHAPE = {"type": "string", "pattern": r"^\((\d+(, \d+)*,?)?\)$"}  # "(1, 128)"
LIST_SHAPE = {"type": "string", "pattern": r"^\[(\d+(, \d+)*)?\]$"}  # "[1, 64, 64, 3]"
SHAPE_EX = {"type": "array", "items": {"type": "integer", "minimum": 0}}
DTYPE = {"enum": ["uint8", "int8", "int16", "int32", "int64", "float16", "float32"]}
STR = {"type": "string"}
INT = {"type": "integer", "minimum": 0}
POS = {"type": "integer", "minimum": 1}

NET_PARAMS_SCHEMA = _obj({
    "version": {"type": "string", "pattern": r"^\d{12}$"},
    "target": {"const": "apu"},
    "is_map": {"type": "boolean"},
    "chip_num": {"const": 1},
    "net_num": POS,
    "parallel_mode": {"enum": ["DP", "MP"]},
    "run_batch": POS,
    "cpu_arch": STR,
    "cc": STR,
    "file_name": _obj({k: STR for k in ("cpu_lib", "cpu_graph", "cpu_params", "apu_lib", "io_config")}),
    "net:": {"type": "null"},
    "is_dynamic_shape": {"type": "boolean"},
    "build_mode": {"enum": ["abc", "hop", "auto"]},
})  # fmt: skip
NODE = {"name": STR, "shape": LIST_SHAPE, "shape_ex": SHAPE_EX, "dtype": DTYPE, "num": INT}
NODE_IN = {**NODE, "transpose_axis": {"type": ["array", "null"], "items": INT}}
PER_RES = {"sub_image_size": {"type": "array", "items": LIST_SHAPE}, "sub_image_size_ex": {"type": "array",
           "items": SHAPE_EX}}  # fmt: skip
TOP_GRAPH_SCHEMA = _obj({
    "main": _obj({"inputs": {"type": "object", "additionalProperties": _obj(
        {"shape": TUPLE_SHAPE, "dtype": DTYPE, "batch": POS})}}),
    "outputs": {"type": "object", "patternProperties": {r"apu_0:\d+": _obj({"shape": TUPLE_SHAPE, "dtype": DTYPE})},
                "additionalProperties": False},
    "apu_0": _obj({
        "input_num": INT, "output_num": INT,
        "inputs": {"type": "object", "patternProperties": {r"datai\d+": _obj(NODE_IN)}, "additionalProperties": False},
        "outputs": {"type": "object", "patternProperties": {r"datao\d+": _obj(NODE)}, "additionalProperties": False},
        "apu_dir": {"const": "apu_x"},
        "resolution_num": POS,
    }),
})  # fmt: skip
ROUTE = _obj({"src": {"type": "string", "pattern": r"^(datai\d+|core\d+)$"},
              "dst": {"type": "string", "pattern": r"^(core\d+|datao\d+)$"}})  # fmt: skip
RES = _obj({
    "res_index": INT,
    "input_shape": {"type": "object", "patternProperties": {r"datai\d+": LIST_SHAPE}, "additionalProperties": False},
    "input_shape_ex": {"type": "object", "patternProperties": {r"datai\d+": SHAPE_EX}, "additionalProperties": False},
    "output_shape": {"type": "object", "patternProperties": {r"datao\d+": LIST_SHAPE}, "additionalProperties": False},
    "output_shape_ex": {"type": "object", "patternProperties": {r"datao\d+": SHAPE_EX},
                        "additionalProperties": False},
    "core_ids": {"type": "array", "items": INT},
    "route_table": {"type": "array", "items": ROUTE},
    "cmd_section": INT,
})  # fmt: skip
APU_SCHEMA = _obj({
    "producer": {"const": "npuc"}, "format_version": {"const": 1}, "chip": {"const": "ka200"},
    "build_mode": {"const": "abc"}, "parallel_mode": {"enum": ["DP", "MP"]}, "run_batch": POS,
    "compute_dtype": {"const": "float16"}, "core_num": POS,
    "cmd_file": STR, "cmd_size": {"type": "integer", "multipleOf": 256, "minimum": 256},
    "dat_file": STR, "dat_size": {"type": "integer", "multipleOf": 256, "minimum": 256},
    "inputs": {"type": "object", "patternProperties": {r"datai\d+": _obj({**NODE_IN, **PER_RES})},
               "additionalProperties": False},
    "outputs": {"type": "object", "patternProperties": {r"datao\d+": _obj({**NODE, **PER_RES})},
                "additionalProperties": False},
    "resolution_num": POS, "default_resolution": INT,
    "resolution_config": {"type": "object", "patternProperties": {r"res\d+": RES}, "additionalProperties": False},
})  # fmt: skip


def load_tree_json(out: Path) -> tuple[dict, dict, dict]:
    net = json.loads((out / "net_params.json").read_text())
    top = json.loads((out / "Net_0" / "top_graph.json").read_text())
    apu = json.loads((out / "Net_0" / "apu_0" / "apu_x" / "apu.json").read_text())
    check(NET_PARAMS_SCHEMA, net)
    check(TOP_GRAPH_SCHEMA, top)
    check(APU_SCHEMA, apu)
    return net, top, apu


def build(model: Path, out: Path, options: dict | None = None, shapes: dict | None = None) -> Path:
    graph = import_onnx(model, shapes)
    canonicalize(graph)
    build_tree(BuildRequest(graph=graph, model_path=model, output=out, options=options or {}))
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---- the checker itself ------------------------------------------------------------------------------------


def test_schema_checker_rejects_what_it_should() -> None:
    check(NET_PARAMS_SCHEMA["properties"]["file_name"], {k: "x" for k in NET_PARAMS_SCHEMA["properties"][
        "file_name"]["required"]})  # fmt: skip
    with pytest.raises(AssertionError, match="chip_num"):
        check(_obj({"chip_num": {"const": 1}}), {"chip_num": True})
    with pytest.raises(AssertionError, match="unexpected key 'net'"):
        check(_obj({"net:": {"type": "null"}}), {"net:": None, "net": None})
    with pytest.raises(AssertionError, match="does not match"):
        check(TUPLE_SHAPE, "[1, 128]")
    with pytest.raises(AssertionError, match="multiple of 256"):
        check(APU_SCHEMA["properties"]["cmd_size"], 300)


# ---- single input ------------------------------------------------------------------------------------------


def test_single_input_manifests(tmp_path: Path) -> None:
    out = build(SMALLCNN, tmp_path / "out")
    net, top, apu = load_tree_json(out)
    assert net == {
        "version": "197001010000", "target": "apu", "is_map": True, "chip_num": 1, "net_num": 1,
        "parallel_mode": "DP", "run_batch": 1, "cpu_arch": "arm", "cc": "aarch64-linux-gnu-g++",
        "file_name": {"cpu_lib": "deploy_lib.so", "cpu_graph": "deploy_graph.json",
                      "cpu_params": "deploy_param.params", "apu_lib": "apu_lib.bin", "io_config": "top_graph.json"},
        "net:": None, "is_dynamic_shape": False, "build_mode": "abc",
    }  # fmt: skip
    assert list(net) == list(NET_PARAMS_SCHEMA["properties"])  # the documented order, "net:" with its colon
    assert top["main"] == {"inputs": {"input": {"shape": "(1, 3, 64, 64)", "dtype": "float32", "batch": 1}}}
    assert top["outputs"] == {"apu_0:0": {"shape": "(1, 10)", "dtype": "float16"}}
    assert top["apu_0"]["inputs"]["datai0"] == {
        "name": "input", "shape": "[1, 3, 64, 64]", "shape_ex": [1, 3, 64, 64], "dtype": "float32", "num": 12288,
        "transpose_axis": None,
    }  # fmt: skip
    assert top["apu_0"]["outputs"]["datao0"]["num"] == 10
    prog = (out / "Net_0/apu_0/apu_x/npuc_prog.bin").read_bytes()
    dat = (out / "Net_0/apu_0/apu_x/npuc_weight.bin").read_bytes()
    assert (apu["cmd_size"], apu["dat_size"]) == (len(prog), len(dat))
    assert prog[:10] == b"NPUCLYNP\x01\x00" and dat[:10] == b"NPUCLYNW\x01\x00"
    assert int.from_bytes(prog[20:24], "little") == len(prog) and len(prog) % 256 == 0
    assert apu["resolution_config"]["res0"]["route_table"] == [
        {"src": "datai0", "dst": "core0"},
        {"src": "core0", "dst": "datao0"},
    ]
    # the raw text keeps the vendor's spellings
    assert '"net:": null' in (out / "net_params.json").read_text()
    tree = read_tree(out)
    assert tree.producer == "npuc" and tree.top_graph["main"]["inputs"]["input"]["shape"] == (1, 3, 64, 64)


def test_build_is_byte_deterministic(tmp_path: Path) -> None:
    a, b = build(SMALLCNN, tmp_path / "a"), build(SMALLCNN, tmp_path / "b")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 5
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    build(SMALLCNN, tmp_path / "a", {"input_dtype": "uint8"})  # rebuilding replaces the tree in place
    assert json.loads((a / "Net_0/top_graph.json").read_text())["main"]["inputs"]["input"]["dtype"] == "uint8"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_input_dtypes_and_nhwc_transpose(tmp_path: Path) -> None:
    out = build(SMALLCNN, tmp_path / "out", {"input_dtype": "uint8", "input_layout": "nhwc", "output_dtype": "float32"})
    _, top, apu = load_tree_json(out)
    assert top["main"]["inputs"]["input"] == {"shape": "(1, 64, 64, 3)", "dtype": "uint8", "batch": 1}
    assert apu["inputs"]["datai0"]["transpose_axis"] == [0, 3, 1, 2]
    assert apu["inputs"]["datai0"]["shape_ex"] == [1, 64, 64, 3]
    image = (np.load(GOLDEN / "cv18xx" / "smallcnn_in.npz")["input"] * 40 + 128).clip(0, 255).astype(np.uint8)
    got = run_tree(out, {"input": image.transpose(0, 2, 3, 1)})["output"]
    ref = ort.InferenceSession(str(SMALLCNN)).run(None, {"input": image.astype(np.float32)})[0]
    assert got.dtype == np.float32 and cosine(got, ref) >= 0.999


# ---- the document's BERT-like multi-input example ----------------------------------------------------------


def bert_like(path: Path) -> Path:
    """input_ids/token_type_ids/attention_mask (1, 128) -> (1, 128, 128) and (1, 128), as in Lynxi's example."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.standard_normal((1000, 32)).astype(np.float32), "word_emb"),
        numpy_helper.from_array(rng.standard_normal((2, 32)).astype(np.float32), "type_emb"),
        numpy_helper.from_array((rng.standard_normal((32, 32)) / 6).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([2], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Gather", ["word_emb", "input_ids"], ["we"]),
        helper.make_node("Gather", ["type_emb", "token_type_ids"], ["te"]),
        helper.make_node("Add", ["we", "te"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axes"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["h0"]),
        helper.make_node("MatMul", ["h0", "w"], ["h"]),
        helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "ht"], ["scores"]),
        helper.make_node("ReduceMean", ["h"], ["pooled"], axes=[2], keepdims=0),
    ]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, [1, 128])
           for n in ("input_ids", "token_type_ids", "attention_mask")]  # fmt: skip
    outs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 128, 128]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 128])]  # fmt: skip
    model = helper.make_model(helper.make_graph(nodes, "bert_like", ids, outs, inits),
                              opset_imports=[helper.make_opsetid("", 13)], ir_version=8)  # fmt: skip
    onnx.save(model, path)
    return path


def test_multi_input_bert_like_example(tmp_path: Path) -> None:
    model = bert_like(tmp_path / "bert_like.onnx")
    out = build(model, tmp_path / "out")
    _, top, apu = load_tree_json(out)
    # exactly the document's top_graph.json main/outputs
    assert top["main"] == {"inputs": {
        "input_ids": {"shape": "(1, 128)", "dtype": "int16", "batch": 1},
        "token_type_ids": {"shape": "(1, 128)", "dtype": "int16", "batch": 1},
        "attention_mask": {"shape": "(1, 128)", "dtype": "int16", "batch": 1},
    }}  # fmt: skip
    assert top["outputs"] == {
        "apu_0:0": {"shape": "(1, 128, 128)", "dtype": "float16"},
        "apu_0:1": {"shape": "(1, 128)", "dtype": "float16"},
    }
    assert [(k, v["name"], v["num"]) for k, v in apu["inputs"].items()] == [
        ("datai0", "input_ids", 128), ("datai1", "token_type_ids", 128), ("datai2", "attention_mask", 128)
    ]  # fmt: skip
    assert [(k, v["name"], v["shape"], v["num"]) for k, v in apu["outputs"].items()] == [
        ("datao0", "scores", "[1, 128, 128]", 16384), ("datao1", "pooled", "[1, 128]", 128)
    ]  # fmt: skip
    rng = np.random.default_rng(3)
    feeds = {
        "input_ids": rng.integers(0, 1000, (1, 128)).astype(np.int16),
        "token_type_ids": rng.integers(0, 2, (1, 128)).astype(np.int16),
        "attention_mask": (np.arange(128) < 100).astype(np.int16)[None],
    }
    got = run_tree(out, feeds)
    ref = ort.InferenceSession(str(model)).run(None, {k: v.astype(np.int64) for k, v in feeds.items()})
    assert got["scores"].dtype == np.float16 and got["scores"].shape == (1, 128, 128)
    assert cosine(got["scores"], ref[0]) >= 0.999 and cosine(got["pooled"], ref[1]) >= 0.999
    assert np.all(got["pooled"][0, 100:] == 0)  # masked tokens are exactly zero


# ---- multi-resolution --------------------------------------------------------------------------------------


def test_multi_resolution_pnet(tmp_path: Path, real_model) -> None:
    from npuc.models.images import load_image, resize

    model = real_model("mtcnn_pnet")
    shapes = [{"input_1": (1, 12, 12, 3)}, {"input_1": (1, 24, 32, 3)}, {"input_1": (1, 48, 40, 3)}]
    out = build(model, tmp_path / "out", {"input_shapes_list": shapes}, shapes[0])
    net, top, apu = load_tree_json(out)
    assert net["is_dynamic_shape"] is False and apu["resolution_num"] == 3 == top["apu_0"]["resolution_num"]
    assert top["main"]["inputs"] == {"input_1": {"shape": "(1, 12, 12, 3)", "dtype": "float32", "batch": 1}}
    node = apu["inputs"]["datai0"]
    assert node["transpose_axis"] == [0, 3, 1, 2]  # NHWC fed, as the model's own Transpose did
    assert node["sub_image_size"] == ["[1, 12, 12, 3]", "[1, 24, 32, 3]", "[1, 48, 40, 3]"]
    assert node["sub_image_size_ex"] == [[1, 12, 12, 3], [1, 24, 32, 3], [1, 48, 40, 3]]
    assert apu["outputs"]["datao0"]["sub_image_size_ex"] == [[1, 1, 1, 4], [1, 7, 11, 4], [1, 19, 15, 4]]
    res2 = apu["resolution_config"]["res2"]
    assert (res2["res_index"], res2["core_ids"], res2["cmd_section"]) == (2, [2], 2)
    assert res2["input_shape"] == {"datai0": "[1, 48, 40, 3]"}
    assert res2["output_shape_ex"] == {"datao0": [1, 19, 15, 4], "datao1": [1, 19, 15, 2]}
    assert int.from_bytes((out / "Net_0/apu_0/apu_x/npuc_prog.bin").read_bytes()[12:16], "little") == 3
    session = ort.InferenceSession(str(model))
    picture = load_image("astronaut")
    for shape in (s["input_1"] for s in shapes):
        x = ((resize(picture, shape[1], shape[2]) - 127.5) / 128).astype(np.float32)[None]
        got = run_tree(out, {"input_1": x})
        ref = dict(zip(["conv2d_4", "softmax"], session.run(None, {"input_1": x})))
        for name in ("conv2d_4", "softmax"):
            assert got[name].shape == ref[name].shape and cosine(got[name], ref[name]) >= 0.999


def test_version_stamp_from_source_date_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from npuc.compiler.errors import UserError

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1657793160")
    net, _, _ = load_tree_json(build(SMALLCNN, tmp_path / "out"))
    assert net["version"] == "202207141006"  # the document's example stamp
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "soon")
    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH='soon' is not a Unix timestamp"):
        build(SMALLCNN, tmp_path / "out2")
