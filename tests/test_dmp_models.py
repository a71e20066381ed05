"""DV700 target end to end: build real models, compile the generated C++, run the folder from its bytes and
compare with onnxruntime float on real images."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from metrics import cosine

from npuc.backends.dmp.artifact import load_network
from npuc.backends.dmp.codegen import INCLUDE_DIR
from npuc.backends.dmp.layers import kernel_wh
from npuc.backends.dmp.validate import run_input_dims
from npuc.compiler.artifacts import ArtifactOptions, detect
from npuc.compiler.errors import CorruptFileError, UserError
from npuc.compiler.ir import Graph
from npuc.compiler.ops import Conv2d
from npuc.compiler.targets import BuildRequest, get_target
from npuc.frontends.onnx import import_onnx
from npuc.models.fetch import get_model
from npuc.models.images import model_inputs
from npuc.passes.rewrite.canonicalize import canonicalize

# (model, tensors compared: the outputs plus the logits before a final softmax, min cosine fp16, 8-bit)
CASES = [
    ("mtcnn_pnet", ["conv2d_4", "convolution_output1"], 0.999, 0.99),
    ("mtcnn_rnet", ["dense_2", "biased_tensor_name1"], 0.999, 0.99),
    ("pplcnet_orientation", ["Add.9"], 0.999, 0.99),
    ("ppocrv6_det_tiny", ["fetch_name_0"], 0.999, 0.99),  # its 4x and 8x nearest upsampling: repeated 2x2 runs
]


def _graph(path: Path, name: str) -> Graph:
    m = get_model(name)
    g = import_onnx(path, {m.input_name: m.input_shape})
    canonicalize(g)
    return g


def _reference(path: Path, names: list[str], feeds: list[dict]) -> list[dict[str, np.ndarray]]:
    model = onnx.load(str(path))
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    sess = ort.InferenceSession(model.SerializeToString())
    wanted = [o.name for o in sess.get_outputs()]
    return [dict(zip(wanted, sess.run(None, f))) for f in feeds]


def _expose(g: Graph, names: list[str]) -> None:
    """Make the pre-softmax logits graph outputs too (a softmax output alone is a weak comparison)."""
    for n in names:
        if n not in g.outputs:
            g.outputs.append(n)


def _formula_size(m: int, c: int, k: int, quantized: bool, prelu: bool) -> int:
    """The tool's `_get_weight_size` (spec §1.8), written out independently of the packer."""
    cg = {7: c, 5: -(-c // 2), 3: -(-c // 8), 1: -(-c // 64)}[k]
    blocks = 16 * -(-m // 8)
    size = -(-(512 + 72 * m * cg + blocks) // 16) * 16 if quantized else 144 * m * cg + blocks
    return size + (blocks if prelu else 0)


def _assert_formula_sizes(net) -> int:
    """Every conv run's weight size equals the size formula; returns how many runs were checked."""
    checked = 0
    for layer in net.layers:
        for run, (_, _, c) in zip(
            layer.conv.runs if layer.conv else [], run_input_dims(layer.conv) if layer.conv else []
        ):
            if run.conv_enable == 0:
                assert run.weight_size == 0
                continue
            kw, kh = kernel_wh(run.p)
            cg = 1 if run.conv_enable & 2 else c
            expected = _formula_size(run.m, cg, max(kw, kh) | 1, run.weight_fmt == 3, run.actfunc == 4)
            assert run.weight_size == expected, (layer.name, run.weight_size, expected)
            checked += 1
    return checked


@pytest.mark.parametrize("name,tensors,cos16,cos8", CASES, ids=[c[0] for c in CASES])
def test_real_model_accuracy(real_model, tmp_path: Path, name: str, tensors: list[str], cos16: float, cos8: float):
    path = real_model(name)
    feeds = model_inputs(name, 2)
    refs = _reference(path, tensors, feeds)
    for quant, threshold in (("fp16", cos16), ("8bit", cos8)):
        g = _graph(path, name)
        _expose(g, tensors)
        out_dir = tmp_path / quant
        get_target("dmp").build(BuildRequest(g, path, out_dir, quant=quant))
        kind = detect(out_dir)
        assert kind.name == "dmp"
        for feed, ref in zip(feeds, refs):
            outs = kind.run(out_dir, feed, ArtifactOptions())
            for t in tensors + [o for o in g.outputs if o not in tensors]:
                assert outs[t].shape == ref[t].shape
                assert cosine(outs[t], ref[t]) >= threshold, (quant, t, cosine(outs[t], ref[t]))


def test_generated_cpp_compiles_and_is_deterministic(real_model, tmp_path: Path) -> None:
    path = real_model("mtcnn_rnet")
    outs = []
    for i in range(2):
        g = _graph(path, "mtcnn_rnet")
        result = get_target("dmp").build(
            BuildRequest(g, path, tmp_path / f"o{i}", quant="8bit", options={"name": "RNet"})
        )
        outs.append({p.name: p.read_bytes() for p in result.artifacts})
    assert outs[0] == outs[1]
    assert sorted(outs[0]) == ["RNet_gen.cpp", "RNet_gen.h", "RNet_layers.json", "RNet_weights.bin"]
    cpp = outs[0]["RNet_gen.cpp"].decode()
    net, blob = load_network(tmp_path / "o0")
    assert f"ReserveMemory({net.weights_size}, {net.io_size})" in cpp and len(blob) == net.weights_size
    assert cpp.count("void CRNet::Layer_") == len(net.layers) == 10
    assert "set_num_output_layers(2);" in cpp and "layer.type = LT_FLATTEN;" in cpp
    assert "conf_v1.header.version = 1;" in cpp and "layer.softmax_axis = 2;" in cpp
    # weights: each run's offset is the running sum of the previous sizes (8-bit, PReLU runs fp16)
    runs = [r for layer in net.layers if layer.conv for r in layer.conv.runs if r.weight_size]
    assert [r.weight_offs for r in runs] == list(np.cumsum([0] + [r.weight_size for r in runs[:-1]]))
    assert [r.weight_fmt for r in runs] == [1, 1, 1, 1, 3, 3]
    assert _assert_formula_sizes(net) == 6
    res = subprocess.run(
        ["g++", "-std=c++14", "-fsyntax-only", "-Wall", "-I", str(INCLUDE_DIR), str(tmp_path / "o0" / "RNet_gen.cpp")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr


def test_custom_layers_compile(real_model, tmp_path: Path) -> None:
    path = real_model("pplcnet_orientation")
    result = get_target("dmp").build(BuildRequest(_graph(path, "pplcnet_orientation"), path, tmp_path / "o"))
    header = result.artifacts[0].read_text()
    assert "struct custom_param_hard_sigmoid {\n  float alpha;\n  float beta;\n};" in header
    assert "struct custom_param_channel_mul {\n  size_t scale_offs;\n};" in header
    assert result.summary["layers"] == 70
    net, _ = load_network(tmp_path / "o")
    assert _assert_formula_sizes(net) == 33
    res = subprocess.run(
        ["g++", "-std=c++14", "-fsyntax-only", "-I", str(INCLUDE_DIR), str(result.artifacts[1])],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    text = detect(tmp_path / "o").describe(tmp_path / "o", ArtifactOptions())
    assert "70 layers" in text and "LT_CUSTOM" in text and "hard_swish" in text


def test_u8_input_table(tmp_path: Path) -> None:
    g = Graph("t")
    g.add_tensor("x", (1, 3, 6, 5))
    g.inputs = ["x"]
    g.add_const("w", np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32))
    g.add_op("conv2d", ["x", "w"], ["y"], Conv2d(pads=(1, 1, 1, 1)))
    g.outputs = ["y"]
    opts = {"input_convert": "mean_scale", "mean": [127.5, 120.0, 100.0], "scale": 1 / 128}
    get_target("dmp").build(BuildRequest(g, Path("t.onnx"), tmp_path / "u8", options=opts))
    get_target("dmp").build(BuildRequest(g, Path("t.onnx"), tmp_path / "f16"))
    kind = detect(tmp_path / "u8")
    assert kind.inputs(tmp_path / "u8", ArtifactOptions())[0].dtype == "uint8"
    img = np.random.default_rng(1).integers(0, 256, (1, 3, 6, 5)).astype(np.uint8)
    as_float = ((img - np.array([127.5, 120.0, 100.0]).reshape(1, 3, 1, 1)) / 128).astype(np.float32)
    a = kind.run(tmp_path / "u8", {"x": img}, ArtifactOptions())["y"]
    b = kind.run(tmp_path / "f16", {"x": as_float}, ArtifactOptions())["y"]
    assert np.array_equal(a, b)
    net, blob = load_network(tmp_path / "u8")
    table = np.frombuffer(blob[net.layers[0].conv.u8tofp16_offs :], np.float16).reshape(3, 256)
    assert table[0, 255] == np.float16(127.5 / 128) and table[2, 0] == np.float16(-100 / 128)
    with pytest.raises(UserError, match="uint8"):
        kind.run(tmp_path / "u8", {"x": as_float}, ArtifactOptions())


def test_corrupt_folder_is_rejected(real_model, tmp_path: Path) -> None:
    path = real_model("mtcnn_pnet")
    out = tmp_path / "o"
    get_target("dmp").build(BuildRequest(_graph(path, "mtcnn_pnet"), path, out, options={"name": "P"}))
    feed = model_inputs("mtcnn_pnet", 1)[0]
    table = out / "P_layers.json"
    good = table.read_text()
    table.write_text(good.replace('"ub_size": 655360', '"ub_size": 4096'))
    with pytest.raises(UserError, match="4096-byte unified buffer"):  # the table is rechecked for its device
        detect(out).run(out, feed, ArtifactOptions())
    table.write_text(good.replace('"svn_version": 93', '"svn_version": "x"'))
    with pytest.raises(UserError, match=r"P_layers.json: hardware.svn_version = 'x' is not of type integer"):
        detect(out).run(out, feed, ArtifactOptions())
    table.write_text(good)
    (out / "P_weights.bin").write_bytes((out / "P_weights.bin").read_bytes()[:-16])
    with pytest.raises(CorruptFileError, match="reserves"):
        detect(out).run(out, feed, ArtifactOptions())
    table = out / "P_layers.json"
    table.write_text(table.read_text().replace('"m": 10', '"m": -3', 1))
    with pytest.raises(CorruptFileError, match=r"P_layers.json: layers\[\d+\].conv.runs\[0\].m = -3 breaks minimum 0"):
        load_network(out)
    table.write_text("{not json")
    with pytest.raises(CorruptFileError, match="not valid JSON"):
        load_network(out)


def test_cli_build_run_inspect(real_model, tmp_path: Path, capsys) -> None:
    """`npuc build --target dmp`, `npuc run OUTDIR --input x.npz` and `npuc inspect OUTDIR` end to end."""
    from npuc.cli.app import main

    path = real_model("mtcnn_pnet")
    m = get_model("mtcnn_pnet")
    feed = model_inputs("mtcnn_pnet", 1)[0]
    shape = f"{m.input_name}:{','.join(map(str, m.input_shape))}"
    out = tmp_path / "pnet"
    for argv in (
        ["build", str(path), "--target", "dmp", "-o", str(out), "--name", "PNet", "--input-shape", shape],
        ["run", str(out), "--input", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")],
        ["inspect", str(out)],
    ):
        np.savez(tmp_path / "x.npz", **feed)
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0, argv
    ref = _reference(path, [], [feed])[0]
    got = np.load(tmp_path / "y.npz")
    assert sorted(got.files) == sorted(ref)
    for name in ref:
        assert cosine(got[name], ref[name]) >= 0.999, name
    text = capsys.readouterr().out
    assert "DMP DV700 network CPNet" in text and "LT_CONV" in text


def test_yolov8n_builds_and_runs(real_model, tmp_path: Path, capsys) -> None:
    """YOLOv8n (SiLU, C2f splits, SPPF, DFL decode) through the CLI: every op runs (inspect), the build notes
    the CPU custom layers with their count, the C++ compiles, and `npuc run` on real pictures matches
    onnxruntime."""
    import npuc
    from npuc.cli.app import main

    path = real_model("yolov8n_320")
    shape = "images:1,3,320,320"
    found = npuc.check(path, "dmp", quant="fp16", input_shapes={"images": (1, 3, 320, 320)})
    assert found["dmp", "fp16"] == []
    out = tmp_path / "yolo"
    with pytest.raises(SystemExit) as info:
        main(["build", str(path), "--target", "dmp", "-o", str(out), "--name", "Yolo", "--input-shape", shape])
    assert info.value.code == 0
    assert "note: 58 of 148 layers are CPU custom layers (57 silu, 1 yolo_decode)" in capsys.readouterr().out
    net, _ = load_network(out)
    types = [layer.type for layer in net.layers]
    assert "LT_COPY_CONCAT" not in types and types.count("LT_CONCAT") == 16  # C2f, SPPF, neck, head: all free
    res = subprocess.run(
        ["g++", "-std=c++14", "-fsyntax-only", "-Wall", "-I", str(INCLUDE_DIR), str(out / "Yolo_gen.cpp")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    feeds = model_inputs("yolov8n_320", 2)
    refs = _reference(path, [], feeds)
    for k, feed in enumerate(feeds):
        np.savez(tmp_path / "x.npz", **feed)
        with pytest.raises(SystemExit) as info:
            main(["run", str(out), "--input", str(tmp_path / "x.npz"), "-o", str(tmp_path / f"y{k}.npz")])
        assert info.value.code == 0
        got, ref = np.load(tmp_path / f"y{k}.npz")["output0"], refs[k]["output0"]
        assert got.shape == ref.shape == (1, 22, 2100)
        assert cosine(got, ref) >= 0.999, cosine(got, ref)
        assert cosine(got[:, 4:], ref[:, 4:]) >= 0.999  # the class scores alone, not only the large box values
