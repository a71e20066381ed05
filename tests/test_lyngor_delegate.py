"""Delegate mode: build_lyngor.py runs against a stand-in `lyngor` module that records every call and writes
a vendor-like tree (the documented net_params.json and top_graph.json), which npuc's reader and the documented
JSON schemas then validate — for one shape set and for several (one vendor build per resolution)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import onnx
import pytest
from golden import GOLDEN_ROOT

from npuc.backends.lyngor import schemas
from npuc.backends.lyngor.artifact import describe_tree
from npuc.backends.lyngor.build import build_tree
from npuc.backends.lyngor.manifest import read_tree
from npuc.compiler.errors import UserError
from npuc.compiler.targets import BuildRequest
from npuc.frontends.onnx import import_onnx
from npuc.passes.rewrite.canonicalize import canonicalize

GOLDEN = GOLDEN_ROOT
SMALLCNN = GOLDEN / "cv18xx" / "smallcnn.onnx"

STANDIN = '''
"""Stand-in for Lynxi's lyngor: records the calls build_lyngor.py makes and writes a vendor-like tree."""
import json
from pathlib import Path

import onnx


def _shape(vi):
    return tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)


class DLModel:
    def load(self, model, model_type=None, inputs_dict=None, in_type=None, out_type=None, transpose_axis=None, **kw):
        self.graph = {"model": str(model), "model_type": model_type, "inputs_dict": inputs_dict, "in_type": in_type,
                      "out_type": out_type, "transpose_axis": transpose_axis, "other": sorted(kw)}
        self.params = {"outputs": [(o.name, _shape(o)) for o in onnx.load(str(model)).graph.output]}


class Builder:
    def __init__(self, target=None, is_map=None, **kw):
        self.init = {"target": target, "is_map": is_map, "other": sorted(kw)}

    def build(self, graph, params, out_path=None, build_mode=None, **kw):
        out = Path(out_path)
        calls = {"load": graph, "builder": self.init, "build": {"out_path": str(out_path), "build_mode": build_mode,
                 "other": sorted(kw)}}
        (out / "standin_calls.json").write_text(json.dumps(calls))
        net = {"version": "202207141006", "target": "apu", "is_map": True, "chip_num": 1, "net_num": 1,
               "parallel_mode": "DP", "run_batch": 1, "cpu_arch": "arm", "cc": "aarch64-linux-gnu-g++",
               "file_name": {"cpu_lib": "deploy_lib.so", "cpu_graph": "deploy_graph.json",
                             "cpu_params": "deploy_param.params", "apu_lib": "apu_lib.bin",
                             "io_config": "top_graph.json"},
               "net:": None, "is_dynamic_shape": False, "build_mode": build_mode}
        (out / "net_params.json").write_text(json.dumps(net))
        (out / "Net_0" / "apu_0" / "apu_x").mkdir(parents=True)
        (out / "Net_0" / "apu_0" / "apu_x" / "cmd.bin").write_bytes(bytes(256))
        inputs = {name: {"shape": str(tuple(shape)), "dtype": graph["in_type"], "batch": shape[0]}
                  for name, shape in graph["inputs_dict"].items()}
        outputs = {f"apu_0:{i}": {"shape": str(tuple(s)), "dtype": graph["out_type"]}
                   for i, (_, s) in enumerate(params["outputs"])}
        # the document's example form: outputs beside main; the subgraph object with its own inputs/outputs
        top = {"main": {"inputs": inputs}, "outputs": outputs,
               "apu_0": {"inputs": inputs, "outputs": outputs, "is_abc": "true", "version": "202207141006"}}
        (out / "Net_0" / "top_graph.json").write_text(json.dumps(top))
        return str(out)
'''


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "standin"
    (folder / "lyngor").mkdir(parents=True)
    (folder / "lyngor" / "__init__.py").write_text(textwrap.dedent(STANDIN))
    monkeypatch.syspath_prepend(str(folder))
    return folder


def validate_vendor_tree(folder: Path) -> None:
    """The documented manifests of a vendor tree, against the documented JSON schemas."""
    for rel, schema in (
        ("net_params.json", schemas.NET_PARAMS),
        ("Net_0/top_graph.json", schemas.TOP_GRAPH_DOCUMENTED),
    ):
        jsonschema.Draft202012Validator(schema).validate(json.loads((folder / rel).read_text()))


def build(model: Path, out: Path, options: dict, shapes: dict | None = None):
    graph = import_onnx(model, shapes)
    canonicalize(graph)
    return build_tree(BuildRequest(graph=graph, model_path=model, output=out, options={"delegate": True, **options}))


def test_delegate_runs_vendor_api_and_reads_its_tree(tmp_path: Path, standin: Path) -> None:
    out = tmp_path / "out"
    result = build(SMALLCNN, out, {"input_layout": "nhwc", "input_dtype": "uint8"})
    assert result.summary == {"target": "lyngor", "delegate": True, "vendor_built": True, "resolutions": 1}
    calls = json.loads((out / "standin_calls.json").read_text())
    assert calls["load"] == {
        "model": str(out / "model.onnx").replace(str(out), calls["build"]["out_path"]),
        "model_type": "ONNX",
        "inputs_dict": {"input": [1, 3, 64, 64]},  # the model's NCHW shape ...
        "in_type": "uint8",
        "out_type": "float16",
        "transpose_axis": [[0, 3, 1, 2]],  # ... fed NHWC, as the vendor's load(transpose_axis=...) says
        "other": [],
    }
    assert calls["builder"] == {"target": "apu", "is_map": True, "other": []}
    assert calls["build"]["build_mode"] == "abc" and calls["build"]["other"] == []
    tree = read_tree(out)  # the vendor's manifests pass the documented tables
    validate_vendor_tree(out)
    assert tree.producer == "vendor" and tree.apu is None
    assert tree.top_graph["main"]["inputs"] == {"input": {"shape": (1, 3, 64, 64), "dtype": "uint8", "batch": 1}}
    assert tree.top_graph["outputs"] == {"apu_0:0": {"shape": (1, 10), "dtype": "float16"}}
    text = describe_tree(tree)
    assert "vendor build" in text and "apu_0:0" in text
    with pytest.raises(UserError, match="vendor-built Lyngor tree"):
        from npuc.backends.lyngor.sim import run_tree

        run_tree(out, {})


def test_delegate_script_without_vendor_then_run_by_hand(tmp_path: Path, real_model) -> None:
    model = real_model("mtcnn_pnet")
    graph = import_onnx(model, {"input_1": (1, 24, 32, 3)})
    canonicalize(graph)
    out = tmp_path / "out"
    result = build_tree(BuildRequest(graph=graph, model_path=model, output=out, options={"delegate": True}))
    assert result.summary["vendor_built"] is False
    assert sorted(p.name for p in out.iterdir()) == ["build_lyngor.py", "model.onnx"]
    pinned = onnx.load(str(out / "model.onnx"))
    dims = [d.dim_value for d in pinned.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 24, 32, 3]  # NHWC model: fed as is, no transpose_axis
    script = (out / "build_lyngor.py").read_text()
    assert '"input_1": (1, 24, 32, 3),' in script and 'IN_TYPE = "float32"' in script
    assert "TRANSPOSE_AXIS" not in script and 'build_mode="abc"' in script
    compile(script, "build_lyngor.py", "exec")
    # now run the generated script by hand against the stand-in, into another folder
    folder = tmp_path / "standin"
    (folder / "lyngor").mkdir(parents=True)
    (folder / "lyngor" / "__init__.py").write_text(textwrap.dedent(STANDIN))
    vendor_out = tmp_path / "vendor_out"
    vendor_out.mkdir()
    proc = subprocess.run([sys.executable, str(out / "build_lyngor.py"), str(vendor_out)], capture_output=True,
                          text=True, env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    calls = json.loads((vendor_out / "standin_calls.json").read_text())
    assert calls["load"]["inputs_dict"] == {"input_1": [1, 24, 32, 3]}
    assert calls["load"]["transpose_axis"] is None
    tree = read_tree(vendor_out)
    assert tree.top_graph["outputs"] == {
        "apu_0:0": {"shape": (1, 7, 11, 4), "dtype": "float16"},
        "apu_0:1": {"shape": (1, 7, 11, 2), "dtype": "float16"},
    }


def test_delegate_several_resolutions(tmp_path: Path, standin: Path, real_model) -> None:
    """Three --input-shape sets: one pinned model each, one vendor load + build each, into res<i>/."""
    model = real_model("mtcnn_pnet")
    shapes = [{"input_1": (1, 12, 12, 3)}, {"input_1": (1, 24, 32, 3)}, {"input_1": (1, 48, 40, 3)}]
    out = tmp_path / "out"
    result = build(model, out, {"input_shapes_list": shapes, "input_dtype": "float16"}, shapes[0])
    assert result.summary == {"target": "lyngor", "delegate": True, "vendor_built": True, "resolutions": 3}
    names = ["build_lyngor.py", "model_res0.onnx", "model_res1.onnx", "model_res2.onnx", "res0", "res1", "res2"]
    assert sorted(p.name for p in out.iterdir()) == names
    for i, s in enumerate(shapes):
        pinned = onnx.load(str(out / f"model_res{i}.onnx"))
        assert [d.dim_value for d in pinned.graph.input[0].type.tensor_type.shape.dim] == list(s["input_1"])
    script = (out / "build_lyngor.py").read_text()
    compile(script, "build_lyngor.py", "exec")
    assert script.count('"model": "model_res') == 3 and '"input_1": (1, 48, 40, 3),' in script
    outputs = [(1, 1, 1, 4), (1, 7, 11, 4), (1, 19, 15, 4)]
    for i, s in enumerate(shapes):
        tree_dir = out / f"res{i}"
        calls = json.loads((tree_dir / "standin_calls.json").read_text())
        built_in = Path(calls["build"]["out_path"])  # the temporary folder, renamed to `out` afterwards
        assert built_in.name == f"res{i}" and calls["load"]["model"] == str(built_in.parent / f"model_res{i}.onnx")
        assert calls["load"]["inputs_dict"] == {"input_1": list(s["input_1"])}
        assert (calls["load"]["in_type"], calls["load"]["out_type"]) == ("float16", "float16")
        assert calls["builder"] == {"target": "apu", "is_map": True, "other": []}
        assert calls["build"]["build_mode"] == "abc" and calls["build"]["other"] == []
        tree = read_tree(tree_dir)
        assert tree.producer == "vendor"
        assert tree.top_graph["main"]["inputs"]["input_1"]["shape"] == s["input_1"]
        assert tree.top_graph["outputs"]["apu_0:0"]["shape"] == outputs[i]
        validate_vendor_tree(tree_dir)


def test_delegate_output_is_deterministic(tmp_path: Path) -> None:
    build(SMALLCNN, tmp_path / "a", {})
    build(SMALLCNN, tmp_path / "b", {})
    for name in ("model.onnx", "build_lyngor.py"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
