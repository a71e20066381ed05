"""Mixed precision through tpu-mlir's qtable: `npuc calibrate --target-cos` holds samples out, keeps the fewest
layers in bf16 for the cosine and writes `<table>.qtable`; `npuc build --calib TABLE` reads it (or --qtable)
and builds exactly what --float-layers with those names builds. A bad or foreign qtable is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from samples import random_samples

from npuc.compiler.errors import UserError
from npuc.compiler.stats import int8_flops_share
from npuc.frontends.onnx import import_onnx
from npuc.models.make_models import make_model
from npuc.passes.calibration.qtable import beside, format_qtable, read_qtable, write_qtable
from npuc.passes.rewrite.canonicalize import canonicalize


def _npuc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npuc", *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """tinycnn calibrated on 10 random samples (2 held out) for a cosine int8 alone cannot reach."""
    model, _, table, run = _calibrate_tinycnn(tmp_path_factory.mktemp("qtable"), "--max-float-layers", "3")
    return model, table, run


def _calibrate_tinycnn(folder: Path, *options: str) -> tuple[Path, Path, Path, subprocess.CompletedProcess]:
    """tinycnn, its 10 random samples, and `npuc calibrate --target-cos 0.99999 OPTIONS` on them: (model, data,
    table, the run)."""
    model = folder / "tinycnn.onnx"
    model.write_bytes(make_model("tinycnn").SerializeToString())
    data = random_samples(folder / "data", (1, 3, 32, 32), 10)
    table = folder / "t.txt"
    run = _npuc("calibrate", str(model), "--data", str(data), "-o", str(table), "--target-cos", "0.99999", *options)
    return model, data, table, run


def test_calibrate_writes_the_qtable_beside_the_table(calibrated) -> None:  # noqa: ANN001
    model, table, run = calibrated
    assert run.returncode == 0, run.stderr
    assert "--target-cos 0.99999 on 2 held-out sample(s)" in run.stderr and f"wrote {beside(table)}" in run.stderr
    text = beside(table).read_text()
    assert text.splitlines()[2] == "# op_name   quantize_mode"  # tpu-mlir's header, after npuc's two comments
    layers = read_qtable(beside(table))
    assert 1 <= len(layers) <= 3 and set(layers.values()) == {"BF16"}
    assert ("NOT reached" in run.stderr) == ("not reached" in text)
    # the int8 share of the operations, as int8_flops_share counts it on the model's IR
    graph = import_onnx(model, None, [])
    canonicalize(graph)
    share = int8_flops_share(graph, set(layers))
    assert f"{len(layers)} layer(s) in bf16, {share:.1%} of the operations int8" in run.stderr
    assert 0.0 < share < 1.0 and int8_flops_share(graph, set()) == 1.0
    assert int8_flops_share(graph, {op.name for op in graph.ops}) == 0.0
    assert "sample number: 8" in table.read_text()  # the thresholds saw only the other 8


def test_build_reads_it_and_equals_float_layers(calibrated, tmp_path: Path) -> None:  # noqa: ANN001
    model, table, _ = calibrated
    layers = list(read_qtable(beside(table)))
    auto = _npuc("build", str(model), "--target", "cv18xx", "--calib", str(table), "-o", str(tmp_path / "a.cvimodel"),
                 "--json")  # fmt: skip
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["details"]["qtable_bf16_layers"] == layers
    explicit = _npuc("build", str(model), "--target", "cv18xx", "--calib", str(table), "--qtable", str(beside(table)),
                     "-o", str(tmp_path / "b.cvimodel"))  # fmt: skip
    assert explicit.returncode == 0 and f"note: {len(layers)} layer(s) kept in bf16 by" in explicit.stdout
    # the same as naming the layers by hand, with the qtable moved away
    moved = tmp_path / "t.txt"
    moved.write_bytes(table.read_bytes())
    by_hand = _npuc("build", str(model), "--target", "cv18xx", "--calib", str(moved), "--float-layers",
                    ",".join(layers), "-o", str(tmp_path / "c.cvimodel"))  # fmt: skip
    assert by_hand.returncode == 0, by_hand.stderr
    data = [(tmp_path / n).read_bytes() for n in ("a.cvimodel", "b.cvimodel", "c.cvimodel")]
    assert data[0] == data[1] == data[2]


def test_a_target_without_float_fallback(calibrated, tmp_path: Path) -> None:  # noqa: ANN001
    model, table, _ = calibrated
    noted = _npuc("build", str(model), "--target", "bm1880", "--calib", str(table), "-o", str(tmp_path / "m.bmodel"))
    assert noted.returncode == 0 and f"{beside(table)} not used: target 'bm1880'" in noted.stdout
    refused = _npuc("build", str(model), "--target", "bm1880", "--calib", str(table), "--qtable", str(beside(table)),
                    "-o", str(tmp_path / "n.bmodel"))  # fmt: skip
    assert refused.returncode == 2 and "--qtable is not used by target 'bm1880'" in refused.stderr


@pytest.mark.parametrize(
    "content, message",
    [
        ("# op_name   quantize_mode\nnosuch BF16\n", "layer 'nosuch' (1 of 1) matches no op or tensor"),
        ("relu_9 F32\n", "mode F32 has no cv18xx form"),
        ("relu_9 BF16 extra\n", ":1: expected 'layer_name MODE', got 3 field(s)"),
        ("relu_9 FP8\n", ":1: mode 'FP8' is not one of F32, F16, BF16, INT8"),
        ("# x\nrelu_9 BF16\nrelu_9 INT8\n", ":3: layer 'relu_9' is listed twice"),
    ],
)
def test_bad_qtables_are_one_line(calibrated, tmp_path: Path, content: str, message: str) -> None:  # noqa: ANN001
    model, table, _ = calibrated
    qtable = tmp_path / "q.qtable"
    qtable.write_text(content)
    run = _npuc("build", str(model), "--target", "cv18xx", "--calib", str(table), "--qtable", str(qtable),
                "-o", str(tmp_path / "m.cvimodel"))  # fmt: skip
    assert run.returncode == 2 and message in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert not (tmp_path / "m.cvimodel").exists()


def test_reader_and_writer(tmp_path: Path) -> None:
    path = tmp_path / "q"
    write_qtable(path, ["a", "b/c"], comments=["made by a test"])
    assert path.read_text() == format_qtable(["a", "b/c"], comments=["made by a test"])
    assert read_qtable(path) == {"a": "BF16", "b/c": "BF16"}
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(UserError, match="not UTF-8"):
        read_qtable(tmp_path / "bin")
    with pytest.raises(UserError, match="cannot read qtable"):
        read_qtable(tmp_path / "missing")


def test_target_cos_needs_held_out_samples(calibrated, tmp_path: Path) -> None:  # noqa: ANN001
    model, _, _ = calibrated
    np.save(tmp_path / "one.npy", np.zeros((1, 3, 32, 32), np.float32))
    run = _npuc("calibrate", str(model), "--data", str(tmp_path / "one.npy"), "-o", str(tmp_path / "t"),
                "--target-cos", "0.99")  # fmt: skip
    assert run.returncode == 2 and "--target-cos needs at least 2 samples" in run.stderr


def test_target_cos_is_on_by_default_on_the_report_samples(tmp_path: Path) -> None:
    """`--method auto` with 10+ samples: --target-cos 0.99 runs on the samples set apart for the report (no
    other split); `--target-cos 0` turns it off; with fewer samples it says why it did not run."""
    from golden import GOLDEN_ROOT

    import npuc

    model, samples = GOLDEN_ROOT / "cv18xx" / "smallcnn.onnx", GOLDEN_ROOT / "cv18xx" / "smallcnn_cali_samples"
    done = npuc.calibrate(model, [samples], tmp_path / "t.txt")
    (line,) = [n for n in done.notes if n.startswith("--target-cos 0.99 on 4 held-out sample(s)")]
    assert "int8 output cosine" in line
    reported = float(done.report[0].split("cosine ")[1].split(",")[0])
    searched = float(line.split("int8 output cosine ")[1].split(";")[0])
    assert abs(reported - searched) < 1e-5  # the same samples: the report's
    off = npuc.calibrate(model, [samples], tmp_path / "off.txt", target_cos=0)
    assert not any("--target-cos" in n for n in off.notes)
    assert (tmp_path / "t.txt").read_bytes() == (tmp_path / "off.txt").read_bytes()  # the table is the same
    few = tmp_path / "few.txt"
    few.write_text("\n".join(str(p) for p in sorted(samples.iterdir())[:6]) + "\n")
    done = npuc.calibrate(model, [few], tmp_path / "few_t.txt")
    assert any("--target-cos 0.99 not searched: it needs 10 or more samples" in n for n in done.notes)


def test_a_qtable_may_name_the_tensors_of_the_split_its_table_describes(tmp_path: Path) -> None:
    """With a channel split the table (and --target-cos) describe the split graph: a qtable naming a group
    tensor builds, because the build applies the side file before it resolves the qtable's names."""
    from golden import GOLDEN_ROOT

    import npuc
    from npuc.passes.calibration.refinement import load_refinement, side_file

    model = GOLDEN_ROOT / "cv18xx" / "smallcnn.onnx"
    table = tmp_path / "t.txt"
    npuc.calibrate(model, [GOLDEN_ROOT / "cv18xx" / "smallcnn_cali_samples"], table, method="kl", split_channels=2,
                   refine="weights")  # fmt: skip
    (start,) = load_refinement(side_file(table)).groupings  # the run that was split
    group = next(line.split()[0] for line in table.read_text().splitlines() if ".g1 " in line)
    write_qtable(beside(table), [group], "BF16")
    result = npuc.build(model, "cv18xx", tmp_path / "m.cvimodel", calib=table)
    assert result.summary["qtable_bf16_layers"] == [group] and start


def test_layers_kept_in_bf16_keep_the_models_constants_under_a_refit(tmp_path: Path) -> None:
    """A weight refit corrects int8 rounding that a bf16 layer does not have: the qtable's layers keep the
    model's constants while the int8 ones take the refit, in the build and in what `compare` and
    --target-cos measure. Every refit layer in bf16 then computes the model's float result again."""
    from golden import GOLDEN_ROOT

    import npuc
    from npuc.passes.calibration.calitable import read_table
    from npuc.passes.calibration.compare import Comparison
    from npuc.passes.calibration.refinement import load_refinement, refit_constants, side_file, split_as_recorded

    model, samples = GOLDEN_ROOT / "cv18xx" / "smallcnn.onnx", GOLDEN_ROOT / "cv18xx" / "smallcnn_cali_samples"
    table = tmp_path / "t.txt"
    npuc.calibrate(model, [samples], table, method="kl", refine="weights")
    refinement = load_refinement(side_file(table))
    graph = import_onnx(model, None, [])
    canonicalize(graph)
    split = split_as_recorded(graph, refinement)
    convs = [op for op in split.ops if op.kind == "conv2d" and split.tensors[op.inputs[1]].is_const]
    refit = [op for op in convs if op.inputs[1] in refinement.constants]
    assert len(refit) >= 2
    kept, other = refit[0], refit[1]
    mixed = refit_constants(split, refinement, float_layers=[kept.outputs[0]])
    assert np.array_equal(mixed.const(kept.inputs[1]), split.const(kept.inputs[1]))  # the model's
    assert np.array_equal(mixed.const(other.inputs[1]), refinement.constants[other.inputs[1]])  # the refit
    assert not np.array_equal(refinement.constants[kept.inputs[1]], split.const(kept.inputs[1]))
    comparison = Comparison(model, read_table(table), samples, "cv18xx_int8", refinement=refinement)
    int8 = comparison.evaluate(per_layer=True)
    every = comparison.evaluate(int8.int8_layers, per_layer=False)
    # the refit in bf16 everywhere (what every layer in bf16 computed before): further from the model
    refit_bf16 = Comparison(model, read_table(table), comparison.feeds, "cv18xx_bf16", refinement=refinement)
    assert 1 - every.output_cosine < (1 - refit_bf16.evaluate(per_layer=False).output_cosine) / 3  # 5e-6 vs 4e-5
    write_qtable(beside(table), [kept.outputs[0]], "BF16")
    built = npuc.build(model, "cv18xx", tmp_path / "m.cvimodel", calib=table)
    assert built.summary["qtable_bf16_layers"] == [kept.outputs[0]]
    beside(table).unlink()  # the same layer named by --float-layers instead: the same rule, the same file
    npuc.build(model, "cv18xx", tmp_path / "f.cvimodel", calib=table, options={"float_layers": [kept.outputs[0]]})
    assert (tmp_path / "m.cvimodel").read_bytes() == (tmp_path / "f.cvimodel").read_bytes()


def test_a_missed_target_prints_a_wider_search_that_reaches_it(tmp_path: Path) -> None:
    """--target-cos missed within --max-float-layers while every int8 layer in float reaches it: the closing notes
    give the `npuc compare --sensitivity --auto-mixed` line that searches all of them, and that line, run as
    printed (PICTURES: samples), reaches the target and writes the qtable the build then reads."""
    model, data, table, run = _calibrate_tinycnn(tmp_path, "--max-float-layers", "1")
    assert run.returncode == 0 and "NOT reached" in run.stderr, run.stderr
    (hint,) = [line for line in run.stderr.splitlines() if "npuc compare" in line]
    command = hint.split("): npuc ", 1)[1].split(", PICTURES", 1)[0].split()
    assert command[:2] == ["compare", str(model)] and command[-2:] == ["--write-qtable", str(beside(table))]
    before = read_qtable(beside(table))
    wider = _npuc(*[str(data) if word == "PICTURES" else word for word in command])
    assert wider.returncode == 0, wider.stderr
    after = read_qtable(beside(table))
    assert list(after)[: len(before)] == list(before) and len(after) > len(before)
    assert "auto-mixed 0.99999: reached" in wider.stdout
    build = _npuc("build", str(model), "--target", "cv18xx", "--calib", str(table), "-o", str(tmp_path / "m.cvimodel"),
                  "--json")  # fmt: skip
    assert build.returncode == 0 and json.loads(build.stdout)["details"]["qtable_bf16_layers"] == list(after)
