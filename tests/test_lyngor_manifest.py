"""Lyngor manifests checked field by field against the documented field list with `jsonschema`: the three
documented manifests (net_params.json, top_graph.json, apu.json) and npuc's own npuc_apu.json of a single-input
build, of the document's BERT-like three-input int16 (1, 128) example and of a multi-resolution build, against
the schemas of backends/lyngor/schemas.py (written from Lynxi's "编译生成物说明" page, apart from the tables
that write them); manifests with a wrong type, a missing or an undocumented key fail validation; the vendor's
own yolox_s build (../shared/golden/lyngor/) is read in both its older and the documented form."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from metrics import cosine
from onnx import TensorProto, helper, numpy_helper

from npuc.backends.lyngor import schemas
from npuc.backends.lyngor.build import build_tree
from npuc.backends.lyngor.manifest import read_tree
from npuc.backends.lyngor.sim import run_tree
from npuc.compiler.targets import BuildRequest
from npuc.frontends.onnx import import_onnx
from npuc.passes.rewrite.canonicalize import canonicalize

GOLDEN = GOLDEN_ROOT
SMALLCNN = GOLDEN / "cv18xx" / "smallcnn.onnx"

TREE = ("net_params.json", "Net_0/top_graph.json", "Net_0/apu_0/apu_x/apu.json", "Net_0/apu_0/apu_x/npuc_apu.json")
VENDOR = GOLDEN / "lyngor" / "yolox_s_build"


def validator(schema: dict) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def load_tree_json(out: Path) -> tuple[dict, dict, dict, dict]:
    """The manifests of an npuc tree, each validated against its JSON schema (apu.json: unwrapped apu_x)."""
    docs = tuple(json.loads((out / rel).read_text()) for rel in TREE)
    for rel, doc in zip(TREE, docs):
        validator(schemas.TREE_SCHEMAS[rel]).validate(doc)
    assert list(docs[2]) == ["apu_x"]
    return docs[0], docs[1], docs[2]["apu_x"], docs[3]


def build(model: Path, out: Path, options: dict | None = None, shapes: dict | None = None) -> Path:
    graph = import_onnx(model, shapes)
    canonicalize(graph)
    build_tree(BuildRequest(graph=graph, model_path=model, output=out, options=options or {}))
    return out


# ---- single input ------------------------------------------------------------------------------------------


def test_single_input_manifests(tmp_path: Path) -> None:
    out = build(SMALLCNN, tmp_path / "out")
    net, top, doc, apu = load_tree_json(out)
    assert net == {
        "version": "197001010000", "target": "apu", "is_map": True, "chip_num": 1, "net_num": 1,
        "parallel_mode": "DP", "run_batch": 1, "cpu_arch": "arm", "cc": "aarch64-linux-gnu-g++",
        "file_name": {"cpu_lib": "deploy_lib.so", "cpu_graph": "deploy_graph.json",
                      "cpu_params": "deploy_param.params", "apu_lib": "apu_lib.bin", "io_config": "top_graph.json"},
        "net:": None, "is_dynamic_shape": False, "build_mode": "abc",
    }  # fmt: skip
    assert list(net) == list(schemas.NET_PARAMS["properties"])  # the documented order, "net:" with its colon
    inputs = {"input": {"shape": "(1, 3, 64, 64)", "dtype": "float32", "batch": 1}}
    outputs = {"apu_0:0": {"shape": "(1, 10)", "dtype": "float16"}}
    assert top == {
        "main": {"inputs": inputs, "outputs": outputs},
        "apu_0": {"inputs": inputs, "outputs": outputs, "is_abc": "true", "version": "197001010000"},
    }
    prog = (out / "Net_0/apu_0/apu_x/npuc_prog.bin").read_bytes()
    dat = (out / "Net_0/apu_0/apu_x/npuc_weight.bin").read_bytes()
    assert doc == {
        "batch_size": 1, "n_slice": 1, "cmd_size": len(prog), "crmem_load_base_addr": 0, "image_size": len(dat),
        "sub_image_size": f"[{len(dat)}]", "sub_image_size_ex": len(dat),
        "inputs": {"datai0": {"dtype": "float32", "name": "input", "shape": "[1, 3, 64, 64]",
                              "shape_ex": [1, 3, 64, 64], "size": 12288}},
        "outputs": {"datao0": {"dtype": "float16", "name": "output", "shape": "[1, 10]", "shape_ex": [1, 10],
                               "size": 10}},
    }  # fmt: skip
    assert list(doc) == [k for k in schemas.APU["properties"]["apu_x"]["properties"] if k in doc]  # documented order
    assert apu["inputs"]["datai0"]["transpose_axis"] is None and apu["outputs"]["datao0"]["num"] == 10
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
    assert len(files) == 6
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    build(SMALLCNN, tmp_path / "a", {"input_dtype": "uint8"})  # rebuilding replaces the tree in place
    assert json.loads((a / "Net_0/top_graph.json").read_text())["main"]["inputs"]["input"]["dtype"] == "uint8"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_input_dtypes_and_nhwc_transpose(tmp_path: Path) -> None:
    out = build(SMALLCNN, tmp_path / "out", {"input_dtype": "uint8", "input_layout": "nhwc", "output_dtype": "float32"})
    _, top, doc, apu = load_tree_json(out)
    assert top["main"]["inputs"]["input"] == {"shape": "(1, 64, 64, 3)", "dtype": "uint8", "batch": 1}
    assert doc["inputs"]["datai0"]["shape_ex"] == [1, 64, 64, 3] and doc["inputs"]["datai0"]["dtype"] == "uint8"
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
    _, top, doc, apu = load_tree_json(out)
    # exactly the document's top_graph.json main/outputs
    assert top["main"]["inputs"] == {
        "input_ids": {"shape": "(1, 128)", "dtype": "int16", "batch": 1},
        "token_type_ids": {"shape": "(1, 128)", "dtype": "int16", "batch": 1},
        "attention_mask": {"shape": "(1, 128)", "dtype": "int16", "batch": 1},
    }  # fmt: skip
    assert top["main"]["outputs"] == {
        "apu_0:0": {"shape": "(1, 128, 128)", "dtype": "float16"},
        "apu_0:1": {"shape": "(1, 128)", "dtype": "float16"},
    }
    assert [(k, v["name"], v["size"]) for k, v in doc["inputs"].items()] == [
        ("datai0", "input_ids", 128), ("datai1", "token_type_ids", 128), ("datai2", "attention_mask", 128)
    ]  # fmt: skip
    assert [(k, v["name"], v["shape"], v["size"]) for k, v in doc["outputs"].items()] == [
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
    net, top, doc, apu = load_tree_json(out)
    assert net["is_dynamic_shape"] is False and apu["resolution_num"] == 3 == doc["resolution_num"]
    assert top["main"]["inputs"] == {"input_1": {"shape": "(1, 12, 12, 3)", "dtype": "float32", "batch": 1}}
    assert [r["shape"] for r in doc["resolution_config"].values()] == [[1, 12, 12, 3], [1, 24, 32, 3], [1, 48, 40, 3]]
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
    net, top, _, _ = load_tree_json(build(SMALLCNN, tmp_path / "out"))
    assert top["apu_0"]["version"] == "202207141006"
    assert net["version"] == "202207141006"  # the document's example stamp
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "soon")
    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH='soon' is not a Unix timestamp"):
        build(SMALLCNN, tmp_path / "out2")


# ---- the schemas reject what the documentation does not allow ----------------------------------------------


def _without(keys: list[str]):
    def edit(doc: dict) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        del doc[keys[-1]]

    return edit


def _set(keys: list[str], value: object):
    def edit(doc: dict) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value

    return edit


def _rename(keys: list[str], new: str):
    def edit(doc: dict) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        doc[new] = doc.pop(keys[-1])

    return edit


# (manifest index in TREE, edit, the validator's complaint)
BAD_MANIFESTS = [
    (0, _without(["net:"]), "'net:' is a required property"),
    (0, _rename(["net:"], "net"), "Additional properties are not allowed"),
    (0, _set(["chip_num"], True), "1 was expected"),
    (0, _set(["run_batch"], "1"), "'1' is not of type 'integer'"),
    (0, _set(["parallel_mode"], "PP"), "'PP' is not one of"),
    (0, _without(["file_name", "apu_lib"]), "'apu_lib' is a required property"),
    (0, _set(["version"], 202207141006), "is not of type 'string'"),
    (1, _set(["main", "inputs", "input", "shape"], "[1, 3, 64, 64]"), "does not match"),
    (1, _set(["main", "inputs", "input", "shape"], [1, 3, 64, 64]), "is not of type 'string'"),
    (1, _set(["main", "inputs", "input", "dtype"], "fp16"), "'fp16' is not one of"),
    (1, _rename(["main", "outputs", "apu_0:0"], "apu_0_0"), "does not match any of the regexes"),
    (1, _set(["apu_0", "is_abc"], True), "True is not one of ['true', 'false']"),
    (1, _set(["apu_0", "input_num"], 1), "Additional properties are not allowed"),
    (2, _set(["apu_x", "cmd_size"], 300), "is not a multiple of 256"),
    (2, _set(["apu_x", "sub_image_size"], [6144]), "is not of type 'string'"),
    (2, _set(["apu_x", "sub_image_size_ex"], "6144"), "is not of type 'integer'"),
    (2, _without(["apu_x", "n_slice"]), "'n_slice' is a required property"),
    (2, _without(["apu_x", "inputs", "datai0", "size"]), "'size' is a required property"),
    (2, _rename(["apu_x", "inputs", "datai0", "size"], "num"), "Additional properties are not allowed"),
    (2, _set(["apu_x", "producer"], "npuc"), "Additional properties are not allowed"),
    (2, _set(["apu_x", "crmem_load_base_addr"], -1), "is less than the minimum of 0"),
    (3, _without(["resolution_config", "res0", "core_ids"]), "'core_ids' is a required property"),
    (3, _set(["default_resolution"], -1), "is less than the minimum of 0"),
]


@pytest.fixture(scope="module")
def good_docs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, ...]:
    out = build(SMALLCNN, tmp_path_factory.mktemp("lyngor") / "out")
    return tuple(json.loads((out / rel).read_text()) for rel in TREE)


@pytest.mark.parametrize("index, edit, message", BAD_MANIFESTS, ids=[f"{TREE[b[0]]}:{b[2]}" for b in BAD_MANIFESTS])
def test_schema_rejects_wrong_type_or_missing_key(good_docs: tuple, index: int, edit, message: str) -> None:
    doc = copy.deepcopy(good_docs[index])
    edit(doc)
    errors = list(validator(schemas.TREE_SCHEMAS[TREE[index]]).iter_errors(doc))
    assert errors and any(message in e.message for e in errors), [e.message for e in errors]


def test_documented_part_accepts_both_top_graph_forms() -> None:
    """top_graph.json: outputs beside main (the document's example) or inside it (what Lyngor writes)."""
    outputs = {"apu_0:0": {"shape": "(1, 128, 768)", "dtype": "float16"}}
    doc = {"main": {"inputs": {"input_ids": {"shape": "(1, 128)", "dtype": "int16", "batch": 1}}}, "outputs": outputs}
    documented = validator(schemas.TOP_GRAPH_DOCUMENTED)
    documented.validate(doc)
    nested = {"main": {**doc["main"], "outputs": outputs}, "apu_0": {"inputs": {}, "outputs": outputs}}
    documented.validate(nested)
    assert not documented.is_valid({"main": doc["main"]})  # outputs nowhere
    doc["main"]["inputs"]["input_ids"]["batch"] = 0
    assert [e.message for e in documented.iter_errors(doc)] == ["0 is less than the minimum of 1"]


def test_vendor_yolox_build_is_read_in_its_older_form(capsys: pytest.CaptureFixture) -> None:
    """Lyngor's own 2022 build: map_batch for run_batch, outputs inside main, apu.json without n_slice."""
    for rel, schema in (("net_params.json", None), ("Net_0/top_graph.json", schemas.TOP_GRAPH_DOCUMENTED)):
        if schema is not None:
            validator(schema).validate(json.loads((VENDOR / rel).read_text()))
    tree = read_tree(VENDOR)
    assert tree.producer == "vendor" and tree.apu is None and tree.net_params["run_batch"] == 1
    assert tree.top_graph["main"]["inputs"] == {"images": {"shape": (1, 3, 640, 640), "dtype": "float32", "batch": 1}}
    assert tree.top_graph["outputs"] == {"apu_0:0": {"shape": (1, 8400, 85), "dtype": "float32"}}
    doc = tree.apu_doc
    assert (doc["batch_size"], doc["cmd_size"], doc["image_size"]) == (1, 9728, 37305184)
    assert len(doc["sub_image_size"]) == 19 and sum(doc["sub_image_size"]) == doc["image_size"]
    assert doc["outputs"]["datao0"] == {
        "dtype": "float32", "name": "__&@!%output0", "shape": (1, 8400, 85), "size": 714000
    }  # fmt: skip
    from npuc.cli.app import main

    with pytest.raises(SystemExit) as done:
        main(["inspect", str(VENDOR)])
    assert done.value.code in (0, None)
    text = capsys.readouterr().out
    assert "vendor build" in text and "images" in text and "1x8400x85" in text and "19 part(s)" in text


def test_vendor_apu_json_that_breaks_the_document_is_refused(tmp_path: Path) -> None:
    import shutil

    from npuc.compiler.errors import CorruptFileError

    tree = tmp_path / "yolox"
    shutil.copytree(VENDOR, tree)
    apu = tree / "Net_0/apu_0/apu_x/apu.json"
    apu.chmod(0o644)
    data = json.loads(apu.read_text())
    data["apu_x"]["image_size"] += 1
    apu.write_text(json.dumps(data))
    with pytest.raises(CorruptFileError, match="image_size 37305185 is not the sum of sub_image_size"):
        read_tree(tree)
