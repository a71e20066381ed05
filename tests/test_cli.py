"""The CLI contract: bad input exits 2 with one clear line and no traceback; internal errors exit 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from golden import GOLDEN_ROOT
from onnx import TensorProto, helper, numpy_helper

from npuc.cli import app as cli

GOLDEN = GOLDEN_ROOT


def npuc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "npuc", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("npuc: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _relu_model(in_shape, name="x") -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", [name], ["y"])],
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_missing_file(tmp_path):
    assert_user_error(npuc("inspect", tmp_path / "nope.onnx"), "not found", "nope.onnx")


def test_not_onnx(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\n" * 20)
    assert_user_error(npuc("inspect", path), "notes.onnx")


def test_truncated_onnx(tmp_path):
    data = (GOLDEN / "cv18xx" / "smallcnn.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    assert_user_error(npuc("inspect", path), "cut.onnx", "truncated")


def test_all_unsupported_ops_listed_at_once(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("Hardmax", ["a"], ["b"], name="first_bad"),
        helper.make_node("LpNormalization", ["b"], ["c"], name="second_bad"),
        helper.make_node("Hardmax", ["c"], ["y"], name="third_bad"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "u.onnx")
    line = assert_user_error(npuc("run", path, "--random-input"), "3 unsupported", "Hardmax", "LpNormalization")
    for node in ("first_bad", "second_bad", "third_bad"):
        assert node in line
    assert "opset 13" in line


def test_dynamic_dim_must_be_pinned(tmp_path):
    path = _save(_relu_model([1, 3, "height", 64]), tmp_path / "dyn.onnx")
    assert_user_error(npuc("inspect", path), "input 'x' dim 2", "'height'", "--input-shape x:1,3,N,64")
    # and the flag fixes it
    result = npuc("run", path, "--input-shape", "x:1,3,32,64", "--random-input")
    assert result.returncode == 0, result.stderr
    assert "1x3x32x64" in result.stdout


def test_bad_input_shape_flag(tmp_path):
    path = _save(_relu_model([1, 3, "h", "w"]), tmp_path / "dyn.onnx")
    assert_user_error(npuc("inspect", path, "--input-shape", "x=1,3"), "--input-shape", "NAME:D0,D1")
    assert_user_error(npuc("inspect", path, "--input-shape", "y:1,3,4,4"), "names y", "x")
    assert_user_error(npuc("inspect", path, "--input-shape", "x:1,3,4"), "rank 4")


def test_shape_mismatch(tmp_path):
    w = numpy_helper.from_array(np.ones((8, 5, 3, 3), np.float32), "w")  # 5 input channels for a 3-channel input
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv_bad")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "s.onnx")
    assert_user_error(npuc("inspect", path), "shape")


def test_cycle(tmp_path):
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="loop_a"),
        helper.make_node("Relu", ["a"], ["b"], name="loop_b"),
        helper.make_node("Relu", ["a"], ["y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "c.onnx")
    assert_user_error(npuc("inspect", path), "cycle", "loop_a", "loop_b")


def test_external_data_outside_model_folder(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.ones(4, np.float32).tobytes())
    bias = numpy_helper.from_array(np.ones(4, np.float32), "bias")
    bias.data_location = TensorProto.EXTERNAL
    bias.ClearField("raw_data")
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "16")):
        entry = bias.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [bias],
    )
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model_dir / "m.onnx")
    assert_user_error(npuc("inspect", path), "../secret.bin", "outside the model's folder")


def test_external_data_inside_folder_loads(tmp_path):
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 4), np.float32))
    result = npuc("run", tmp_path / "m.onnx", "--input", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], [[0, 1, 2, 3]])


def test_wrong_input_feed_shape(tmp_path):
    path = _save(_relu_model([1, 4]), tmp_path / "r.onnx")
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 5), np.float32))
    assert_user_error(npuc("run", path, "--input", tmp_path / "in.npz"), "input 'x'", "[1, 4]", "[1, 5]")


def test_run_writes_outputs_atomically_and_matches_reference(tmp_path):
    path = _save(_relu_model([1, 4]), tmp_path / "r.onnx")
    np.savez(tmp_path / "in.npz", x=np.array([[-1, 2, -3, 4]], np.float32))
    result = npuc("run", path, "--input", tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    assert result.returncode == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], [[0, 2, 0, 4]])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_internal_error_exits_1_with_report_hint(monkeypatch, capsys):
    from npuc.compiler import targets

    def broken():
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(targets, "all_targets", broken)  # the command imports it when it runs
    with pytest.raises(SystemExit) as exc:
        cli.main(["targets"])
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error" in err[0] and "report" in err[0]


def test_help_loads_no_numpy_onnx_or_passes():
    """`npuc --help` (and every command's help) imports only the CLI: the heavy modules load when a command runs."""
    heavy = "('numpy', 'onnx', 'npuc.passes')"
    code = f"import sys, npuc.cli.app as a; a.build_app(); print(sorted(m for m in {heavy} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]", run.stdout


def test_a_command_line_loads_only_its_command_and_no_pydantic():
    """`npuc targets` builds the app with its own module alone (typer converts every registered command's
    parameters on each call), and typer is one that needs no pydantic (pyproject pins it below 0.27)."""
    others = tuple(f"npuc.cli.{m}" for m in cli.COMMAND_MODULES if m != "targets")
    code = (
        "import contextlib, io, sys\nfrom npuc.cli.app import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main(['targets'])\n"
        f"print(sorted(m for m in {others + ('pydantic',)!r} if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]", run.stdout


def test_targets_lists_every_target_honestly():
    result = npuc("targets", "--json")
    assert result.returncode == 0
    import json

    rows = {row["target"]: row for row in json.loads(result.stdout)}
    assert {"cv18xx", "bm1880", "bpu"} <= set(rows)
    assert rows["cv18xx"]["chips"] == ["cv183x", "cv182x", "cv181x", "cv180x"]
    for row in rows.values():
        assert row["status"]


def test_inspect_onnx_reports_ops_params_and_flops():
    result = npuc("inspect", GOLDEN / "cv18xx" / "smallcnn.onnx")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "BatchNormalization 4" in out and "conv2d+relu" in out
    assert "1x3x64x64" in out and "FLOPs" in out and "params" in out


def test_python_dash_m_and_console_script_agree():
    result = npuc("--help")
    assert result.returncode == 0 and "inspect" in result.stdout and "run" in result.stdout


def test_input_shape_names_may_hold_colons():
    from npuc.compiler.errors import UserError
    from npuc.frontends.onnx import parse_input_shapes

    assert parse_input_shapes(["input:0:1,224,224,3", "x:1,3"]) == {"input:0": (1, 224, 224, 3), "x": (1, 3)}
    with pytest.raises(UserError, match="bad --input-shape 'x:1,a'"):
        parse_input_shapes(["x:1,a"])


def test_build_json_has_one_key_set_for_every_target(tmp_path: Path) -> None:
    """`npuc build --json` prints the same keys whatever the target (README: machine-readable output); what only
    one target has is under `details`."""
    import json

    from npuc.compiler.version import VERSION

    model, table = GOLDEN_ROOT / "cv18xx" / "smallcnn.onnx", GOLDEN_ROOT / "cv18xx" / "smallcnn_cali_table.txt"
    records = {}
    for target in ("cv18xx", "bm1880", "dmp", "lyngor", "bpu"):
        calib = ["--calib", str(table)] if target in ("cv18xx", "bm1880", "bpu") else []
        result = npuc("build", str(model), "--target", target, *calib, "-o", str(tmp_path / target), "--json")
        assert result.returncode == 0, result.stderr
        records[target] = json.loads(result.stdout)
    keys = {"npuc", "target", "chip", "quant", "artifacts", "weight_bytes", "host_ops", "notes", "details"}
    for target, record in records.items():
        assert set(record) == keys and record["npuc"] == VERSION and record["target"] == target, record
        assert record["chip"] and record["quant"] and isinstance(record["host_ops"], int)
        assert isinstance(record["notes"], list) and isinstance(record["details"], dict)
        assert record["artifacts"] and all(a["bytes"] > 0 and Path(a["path"]).exists() for a in record["artifacts"])
    assert records["cv18xx"]["chip"] == "cv181x" and records["cv18xx"]["quant"] == "int8"
    assert records["cv18xx"]["weight_bytes"] > 0 and records["dmp"]["weight_bytes"] > 0


@pytest.mark.parametrize("command", ["build", "calibrate", "calibrate merge", "compare", "export", "inspect", "run",
                                     "targets"])  # fmt: skip
def test_every_command_help_has_an_example(command: str) -> None:
    result = npuc(*command.split(), "--help")
    assert result.returncode == 0 and "Example: npuc " + command.split()[0] in " ".join(result.stdout.split())


def test_calibrate_help_shows_the_options_of_its_default_subcommand() -> None:
    text = " ".join(npuc("calibrate", "--help").stdout.split())
    assert "--data" in text and "--method" in text and "npuc calibrate merge --help" in text


def test_run_json_describes_every_output(tmp_path: Path) -> None:
    import json

    model = GOLDEN_ROOT / "cv18xx" / "smallcnn.onnx"
    result = npuc("run", str(model), "--random-input", "--json", "-o", str(tmp_path / "o.npz"))
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    saved = np.load(tmp_path / "o.npz")
    assert record["kind"] == "onnx" and record["written"] == str(tmp_path / "o.npz")
    assert set(record["outputs"]) == set(saved.files)
    for name, figures in record["outputs"].items():
        assert figures["shape"] == list(saved[name].shape) and figures["dtype"] == str(saved[name].dtype)
        assert np.isclose(figures["mean"], float(saved[name].astype(np.float64).mean()))
