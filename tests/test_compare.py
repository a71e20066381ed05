"""`npuc compare`: the quantized reference against onnxruntime float, per output and per layer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from golden import GOLDEN_ROOT

from npuc.cli.app import main
from npuc.compiler.errors import UserError
from npuc.passes.calibration.calitable import format_table, read_table
from npuc.passes.calibration.compare import Comparison, auto_mixed, compare_model
from npuc.passes.calibration.qtable import read_qtable
from npuc.passes.calibration.sensitivity import layer_sensitivity

GOLDEN = GOLDEN_ROOT / "cv18xx"
MODEL = GOLDEN / "smallcnn.onnx"
TABLE = GOLDEN / "smallcnn_cali_table.txt"
# every activation of the canonicalized IR; `output` is the fc layer (its dequantized result vs float)
LAYERS = ["relu_8", "maxpool_9", "relu_17", "bn_24", "relu_26", "relu_34", "relu_38", "gap_39", "flatten_40", "output"]


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("samples")
    for i in range(3):
        with np.load(GOLDEN / "smallcnn_cali_samples" / f"{i:02d}.npz") as data:
            np.savez(folder / f"s{i}.npz", input=data["input"])
    np.save(folder / "s3.npy", np.load(GOLDEN / "smallcnn_in.npz")["input"])  # one-input model: any key
    return folder


def test_compare_report_on_smallcnn(samples):
    report = compare_model(MODEL, TABLE, samples)
    assert report.samples == 4
    (out,) = report.outputs
    assert out.name == "output" and out.cosine >= 0.999 and out.top1_agreement == 1.0
    assert out.sqnr_db > 30 and 0 < out.max_abs_error < 0.05
    names = [a.name for a in report.layers]
    assert sorted(names) == sorted(LAYERS)
    cosines = [a.cosine for a in report.layers]
    assert cosines == sorted(cosines) and min(cosines) > 0.99
    # the max pool passes codes through: its error is the relu_8 error sub-sampled
    layers = {a.name: a for a in report.layers}
    assert layers["maxpool_9"].max_abs_error <= layers["relu_8"].max_abs_error


def test_compare_bf16_is_closer_than_int8(samples):
    int8 = compare_model(MODEL, TABLE, samples, quant="int8").outputs[0]
    bf16 = compare_model(MODEL, TABLE, samples, quant="bf16").outputs[0]
    assert bf16.sqnr_db > int8.sqnr_db and bf16.cosine >= 0.9999


def test_cli_json(samples, capsys):
    try:
        main(["compare", str(MODEL), "--target", "cv18xx", "--calib", str(TABLE), "--data", str(samples), "--json"])
    except SystemExit as exc:  # the CLI may exit explicitly with success
        assert exc.code in (0, None)
    payload = json.loads(capsys.readouterr().out)
    assert payload["samples"] == 4
    assert payload["outputs"][0]["top1_agreement"] == 1.0
    assert payload["float_layers"] == [] and "auto_mixed" not in payload
    assert len(payload["layers"]) == 10 and set(payload["layers"][0]) == {
        "name", "cosine", "sqnr_db", "max_abs_error", "top1_agreement"
    }  # fmt: skip


def test_cli_bad_inputs_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(MODEL), "--calib", str(TABLE), "--data", str(tmp_path)])
    assert exc.value.code == 2 and "has no .npz/.npy/.jpg/.jpeg/.png/.bmp files" in capsys.readouterr().err
    np.savez(tmp_path / "a.npz", other=np.zeros(3, np.float32), more=np.zeros(3, np.float32))
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(MODEL), "--calib", str(TABLE), "--data", str(tmp_path)])
    assert exc.value.code == 2 and "sample a.npz: no array for input(s) input" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(MODEL), "--target", "bm1880", "--calib", str(TABLE), "--data", str(tmp_path)])
    assert exc.value.code == 2 and "not supported" in capsys.readouterr().err


def cli(*args: str) -> int:
    try:
        main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def shrunk_table(tmp_path: Path, row: str, factor: float = 0.05) -> Path:
    """The vendor table with one row's threshold cut to `factor` of itself: int8 made bad for one tensor."""
    table = read_table(TABLE)
    entry = table.entries[row]
    bad = dataclasses.replace(
        table, entries={**table.entries, row: dataclasses.replace(entry, threshold=entry.threshold * factor)}
    )
    path = tmp_path / f"{row}.txt"
    path.write_text(format_table(bad))
    return path


@pytest.mark.parametrize(
    ("row", "chosen"),
    [
        # the fc output clipped at 5% of its range: keeping the fc in bf16 alone fixes it
        ("output_Gemm", ["output"]),
        # relu_26 (the residual add) clipped: both its producer and its consumer conv_28 (which would
        # re-quantize relu_26 with the same threshold) must leave int8: one greedy step takes the pair
        ("relu_26_Relu", ["relu_26", "relu_34"]),
    ],
)
def test_auto_mixed_finds_the_badly_calibrated_layer(samples, tmp_path, row, chosen):
    comparison = Comparison(MODEL, read_table(shrunk_table(tmp_path, row)), samples, "cv18xx_int8")
    result = auto_mixed(comparison, 0.999)
    assert result.reached and result.float_layers == chosen
    assert result.int8_cosine < 0.99 and result.report.output_cosine >= 0.999
    assert result.report.float_layers == chosen and result.all_float_cosine > 0.99999
    assert all(n not in result.report.int8_layers for n in chosen)
    # all-int8, all-float, one greedy step; no re-check: the last pick (here the only one) is needed, since
    # without it the target was missed
    assert result.evaluations == 3


def test_output_only_evaluations_skip_the_float_ir_run(samples, tmp_path, monkeypatch):  # noqa: ANN001
    """Searches score outputs: with no softmax output (judged by its logits) nothing needs the float IR's tensors;
    only the evaluations whose layers rank the picks pool them."""
    comparison = Comparison(MODEL, read_table(shrunk_table(tmp_path, "relu_26_Relu")), samples, "cv18xx_int8")
    float_runs, evaluate = [], comparison.evaluate
    monkeypatch.setattr(comparison, "ref_layers", lambda i, ref=comparison.ref_layers: float_runs.append(i) or ref(i))
    report = comparison.evaluate(per_layer=False)
    assert float_runs == [] and report.layers == [] and report.outputs[0].cosine < 0.999
    pooled = []

    def spy(layers=(), per_layer=True, samples=None):  # noqa: ANN001, ANN202
        pooled.append((list(layers), per_layer))
        return evaluate(layers, per_layer, samples)

    monkeypatch.setattr(comparison, "evaluate", spy)
    result = auto_mixed(comparison, 0.999)
    assert result.float_layers == ["relu_26", "relu_34"] and result.evaluations == 3
    # the base and the greedy's trial (their layers rank the picks); every int8 layer in float: outputs only
    assert [per_layer for _, per_layer in pooled] == [True, False, True]
    assert pooled[2][0] == ["relu_26", "relu_34"]
    assert float_runs == list(range(len(comparison.feeds))) * 2  # asked for by the two pooled evaluations only


def test_auto_mixed_bounded_by_max_float_layers(samples, tmp_path, capsys):
    table = shrunk_table(tmp_path, "relu_26_Relu")  # needs two float layers (see above)
    result = auto_mixed(Comparison(MODEL, read_table(table), samples, "cv18xx_int8"), 0.999, max_layers=1)
    assert not result.reached and len(result.float_layers) <= 1 and result.report.output_cosine < 0.999
    assert result.reason.startswith("not reached within --max-float-layers 1")
    assert result.evaluations <= 2 + 3  # all-int8, all-float, at most 3x the bound of trials
    args = ["compare", str(MODEL), "--calib", str(table), "--data", str(samples), "--auto-mixed", "0.999"]
    assert cli(*args, "--max-float-layers", "1") == 2
    assert "not reached within --max-float-layers 1" in capsys.readouterr().err


def test_auto_mixed_cli_json_and_text(samples, tmp_path, capsys):
    table = shrunk_table(tmp_path, "output_Gemm")
    args = ["compare", str(MODEL), "--calib", str(table), "--data", str(samples), "--auto-mixed", "0.999"]
    assert cli(*args, "--json") == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["float_layers"] == ["output"] and payload["auto_mixed"]["float_layers"] == ["output"]
    assert payload["auto_mixed"]["reached"] is True and payload["outputs"][0]["cosine"] >= 0.999
    assert payload["auto_mixed"]["int8_cosine"] < 0.9
    assert cli(*args) == 0
    text = capsys.readouterr().out
    assert "float layers: output" in text.splitlines()[1]
    assert "auto-mixed 0.999: reached" in text and text.rstrip().endswith("float layers: output")


def test_auto_mixed_already_reached_and_unreachable(samples, capsys):
    comparison = Comparison(MODEL, read_table(TABLE), samples, "cv18xx_int8")
    easy = auto_mixed(comparison, 0.99)
    assert easy.reached and easy.float_layers == [] and easy.evaluations == 1
    # bf16 everywhere stays ~4e-6 short of 1: a target above it cannot be met by any choice of layers
    hard = auto_mixed(comparison, 0.9999999)
    assert not hard.reached and hard.float_layers == [] and 0.99999 < hard.all_float_cosine < 0.9999999
    assert "even all 10 int8 layers in float" in hard.reason
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(MODEL), "--calib", str(TABLE), "--data", str(samples), "--auto-mixed", "0.9999999"])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and "auto-mixed 0.9999999: NOT reached" in captured.out
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("npuc: error: --auto-mixed 0.9999999: unreachable: even all 10 int8 layers")


def test_sensitivity_ranks_the_layer_that_causes_the_error_first(samples, tmp_path):
    """relu_17 clipped to 5% of its range: quantizing it alone, or its consumer bn_24 alone (which quantizes its
    input at that threshold), costs the output most; the all-int8 report blames the layers after them as much
    (they inherit the error). Each entry is the evaluation with every other int8 layer in float."""
    comparison = Comparison(MODEL, read_table(shrunk_table(tmp_path, "relu_17_Relu")), samples, "cv18xx_int8")
    ranked = layer_sensitivity(comparison)
    assert sorted(s.layer for s in ranked) == sorted(LAYERS)  # every int8 layer once
    assert {s.layer for s in ranked[:2]} == {"relu_17", "bn_24"}
    assert all(s.output_cosine < 0.995 for s in ranked[:2])  # measured 0.99286, 0.99299
    assert all(s.output_cosine > 0.9999 for s in ranked[2:])  # the vendor's thresholds elsewhere
    assert [s.output_cosine for s in ranked] == sorted(s.output_cosine for s in ranked)
    alone = comparison.evaluate([n for n in LAYERS if n != ranked[0].layer], per_layer=False)
    # the scan sums bf16 convs in float32 (bf16_conv.float32_sums): the exact evaluation agrees to float noise
    assert ranked[0].output_cosine == pytest.approx(alone.output_cosine, abs=1e-6)
    all_int8 = {a.name: a.cosine for a in comparison.evaluate().layers}
    assert max(all_int8[n] for n in ("relu_26", "relu_34", "relu_38")) < 0.91  # inherited: measured 0.88-0.90
    # layers kept in float are not candidates and stay float in every trial
    rest = layer_sensitivity(comparison, float_layers=["relu_17"])
    assert "relu_17" not in {s.layer for s in rest} and rest[0].layer == "bn_24"
    with pytest.raises(UserError, match="'nosuch' is not an int8 layer"):
        layer_sensitivity(comparison, ["nosuch"])


def test_sensitivity_cli(samples, tmp_path, capsys):
    table = shrunk_table(tmp_path, "relu_17_Relu")
    args = ["compare", str(MODEL), "--calib", str(table), "--data", str(samples), "--sensitivity"]
    assert cli(*args, "--json") == 0
    ranked = json.loads(capsys.readouterr().out)["sensitivity"]
    assert len(ranked) == len(LAYERS) and ranked[0]["layer"] == "relu_17" and ranked[0]["output_cosine"] < 0.995
    assert cli(*args) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("int8 sensitivity"))
    assert "10 of 10 most sensitive" in lines[start] and lines[start + 1].split()[0] == "relu_17"
    # the search in sensitivity order takes relu_17 first: one step reaches the target
    assert cli(*args, "--auto-mixed", "0.9999", "--json") == 0
    mixed = json.loads(capsys.readouterr().out)["auto_mixed"]
    assert mixed["reached"] and mixed["float_layers"][0] == "relu_17" and mixed["evaluations"] <= 5


def test_calib_data_instead_of_a_table(samples):
    report = compare_model(MODEL, None, samples, calib_data=[GOLDEN / "smallcnn_cali_samples"])
    (out,) = report.outputs
    assert out.cosine >= 0.999 and out.top1_agreement == 1.0 and len(report.layers) == 10
    with pytest.raises(Exception, match="exactly one of --calib TABLE or --calib-data DIR"):
        compare_model(MODEL, TABLE, samples, calib_data=[GOLDEN / "smallcnn_cali_samples"])


def test_table_problems_are_one_line(samples, tmp_path, capsys):
    unknown = tmp_path / "unknown.txt"
    unknown.write_text(TABLE.read_text() + "bogus_tensor 1.0 -1.0 1.0\n")
    assert cli("compare", str(MODEL), "--calib", str(unknown), "--data", str(samples), "--json") == 0
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()  # warned once, listed, and the rows present are used
    assert line.startswith("npuc: warning: calibration table: 1 unknown name(s) ['bogus_tensor']")
    assert json.loads(captured.out)["outputs"][0]["cosine"] >= 0.999
    foreign = GOLDEN.parent / "bm1880" / "bmnet_lenet_calibration.pb2"  # BMNet's binary protobuf
    assert cli("compare", str(MODEL), "--calib", str(foreign), "--data", str(samples)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("npuc: error: ") and "pass a tpu-mlir calibration table" in line
    assert cli("compare", str(MODEL), "--data", str(samples)) == 2
    assert "exactly one of --calib TABLE or --calib-data DIR" in capsys.readouterr().err
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    np.savez(wrong / "s0.npz", input=np.zeros((1, 3, 32, 32), np.float32))
    assert cli("compare", str(MODEL), "--calib", str(TABLE), "--data", str(wrong)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "sample s0.npz: input 'input' has shape 1x3x32x32, expected 1x3x64x64" in line


def test_compare_reads_pictures_as_calibrate_does(tmp_path, capsys):
    """A folder of pictures, with the same preprocessing options as `npuc calibrate`."""
    from PIL import Image

    rng = np.random.default_rng(3)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (80, 100, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    args = ["compare", str(MODEL), "--calib", str(TABLE), "--data", str(tmp_path), "--json"]
    assert cli(*args, "--mean", "127.5", "--scale", "0.0078125", "--color", "bgr") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 3 and report["outputs"][0]["cosine"] > 0.9
    assert cli(*args, "--layout", "nhwc") == 2  # the model takes NCHW: one line naming the mismatch
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "sample 0.png" in line and "fix --color or --layout" in line


def test_automatic_choices_judge_a_softmax_output_by_its_logits(tmp_path: Path) -> None:
    """A softmax saturates on confident samples and hides the error the thresholds cause: the report keeps the
    output itself, while `judged` (what --method auto and its fit measure) holds the softmax's input."""
    import onnx

    from npuc.models.make_models import make_model
    from npuc.passes.calibration.calibrate import calibrate

    path = tmp_path / "softmax.onnx"
    onnx.save(make_model("act_softmax"), path)
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        np.save(data / f"{i}.npy", rng.normal(size=(1, 8, 4, 4)).astype(np.float32))
    table = calibrate(path, [data]).table
    comparison = Comparison(path, table, data, "cv18xx_int8")
    (output,) = comparison.graph.outputs
    logits = comparison.judged[output]
    assert logits != output and comparison.producers[output].kind == "softmax"
    assert comparison.producers[output].inputs[0] == logits
    report = comparison.evaluate()
    assert [a.name for a in report.outputs] == [output] and [a.name for a in report.judged] == [logits]
    assert len(report.judged[0].sample_cosines) == 4
    shape = comparison.graph.tensors[output].shape  # top-1 per position along the softmax's axis
    axis = comparison.producers[output].attrs.axis % len(shape)
    assert comparison.class_axes == {output: axis}
    assert len(report.outputs[0]._top1) == 4 * int(np.prod(shape)) // shape[axis]


def test_a_table_calibrated_on_pictures_records_its_preprocessing_and_compare_uses_it(tmp_path, capsys):
    """`npuc calibrate` on pictures writes `# preprocess: ...` into the table's header (tpu-mlir skips `#` lines);
    `npuc compare --calib T` then prepares pictures the same way without the flags, agrees when they are given
    again, and refuses a flag that contradicts the table, naming both values."""
    from PIL import Image

    rng = np.random.default_rng(4)
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (80, 100, 3), dtype=np.uint8)).save(pictures / f"{i}.png")
    table = tmp_path / "t.txt"
    flags = ["--mean", "127.5", "--scale", "0.0078125", "--color", "bgr"]
    assert cli("calibrate", str(MODEL), "--data", str(pictures), "-o", str(table), "--method", "kl", *flags) == 0
    header = [line for line in table.read_text().splitlines() if line.startswith("# preprocess:")]
    assert header == [
        "# preprocess: mean=127.5 scale=0.0078125 color=bgr resize=none layout=nchw keep_aspect_ratio=no "
        "pad_value=0 pad_type=center"
    ]
    assert read_table(table).preprocess == header[0].split(": ", 1)[1]
    capsys.readouterr()
    args = ["compare", str(MODEL), "--calib", str(table), "--data", str(pictures), "--json"]
    assert cli(*args) == 0
    recorded = json.loads(capsys.readouterr().out)
    assert cli(*args, *flags) == 0
    assert json.loads(capsys.readouterr().out) == recorded
    assert cli(*args, "--mean", "127.5,127.5,127.5") == 0  # the same numbers, written per channel
    capsys.readouterr()
    assert cli(*args, "--color", "rgb") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--color rgb contradicts {table}, calibrated with color=bgr" in line
    # tensor samples carry no preprocessing: no line
    assert cli("calibrate", str(MODEL), "--data", str(GOLDEN / "smallcnn_cali_samples"), "-o", str(table),
               "--method", "kl") == 0  # fmt: skip
    assert read_table(table).preprocess is None


def test_compare_keeps_the_qtable_beside_the_table_in_float_as_build_does(samples, tmp_path, capsys):
    table = tmp_path / "t.cali_table"
    table.write_bytes(TABLE.read_bytes())
    Path(f"{table}.qtable").write_text("# op_name   quantize_mode\nrelu_17 BF16\n")
    args = ["compare", str(MODEL), "--calib", str(table), "--data", str(samples), "--json"]
    assert cli(*args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["float_layers"] == ["relu_17"]
    assert f"1 layer(s) kept in bf16 by {table}.qtable" in captured.err
    other = tmp_path / "other.qtable"  # --qtable names another file, as build's
    other.write_text("relu_26 BF16\n")
    assert cli(*args, "--qtable", str(other)) == 0
    assert json.loads(capsys.readouterr().out)["float_layers"] == ["relu_26"]
    assert cli(*args, "--quant", "bf16", "--qtable", str(other)) == 2  # nothing to keep in bf16 there
    assert "for int8 comparisons" in capsys.readouterr().err
    Path(f"{table}.qtable").write_text("nosuch BF16\n")  # made for another model: one line, exit 2
    assert cli(*args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "'nosuch'" in line and "another model" in line


def test_top1_agreement_is_per_position_along_the_class_axis():
    """A sequence of class scores (OCR: positions x classes) agrees per position; an output with no one class
    axis (a detector's boxes) has no top-1 figure."""
    from npuc.passes.calibration.compare import Agreement

    ref = np.zeros((1, 4, 3), np.float32)
    ref[0, np.arange(4), [0, 1, 2, 0]] = 1.0
    quant = ref.copy()
    quant[0, 3] = [0.0, 0.0, 2.0]  # the last position's class differs
    per_position = Agreement("seq")
    per_position.add(ref, quant, class_axis=2)
    assert per_position.top1_agreement == 0.75
    none = Agreement("boxes")
    none.add(ref, quant)
    assert none.top1_agreement is None


def test_top1_agreement_where_float_is_confident() -> None:
    """Top-1 agreement per position along the class axis, and the same over the positions whose float top
    probability is at least 0.8 (from logits through a softmax, or the probabilities themselves): an int8 flip
    where float hesitates is told apart from one where it is sure."""
    from npuc.passes.calibration.compare import Agreement

    logits = np.array([[4.0, 0.0, 0.0], [0.1, 0.0, 0.0]])  # sure (p 0.96) / hesitant (p 0.36)
    flipped = np.array([[3.0, 0.0, 0.0], [0.0, 0.2, 0.0]])  # the hesitant position flips
    a = Agreement("logits")
    a.add(logits, flipped, class_axis=1)
    assert a.top1_agreement == 0.5 and a.confident_top1 == 1.0 and a.confident_positions == 1
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    b = Agreement("probs")
    b.add(probs, np.exp(flipped) / np.exp(flipped).sum(1, keepdims=True), class_axis=1, probabilities=True)
    assert (b.top1_agreement, b.confident_top1, b.confident_positions) == (0.5, 1.0, 1)
    sure_flip = Agreement("sure flip")
    sure_flip.add(logits[:1], np.array([[0.0, 4.0, 0.0]]), class_axis=1)
    assert sure_flip.confident_top1 == 0.0 and sure_flip.confident_positions == 1
    hesitant = Agreement("hesitant")
    hesitant.add(logits[1:], flipped[1:], class_axis=1)
    assert hesitant.confident_top1 is None and hesitant.confident_positions == 0
    assert "confident_top1" not in a.public()  # the JSON report keeps its fields


def test_sqnr_of_an_all_zero_reference_is_minus_infinity_and_the_report_stays_strict_json() -> None:
    """An output that float leaves all zero (a dead class map) but int8 does not: -inf dB, with no numpy
    warning; an exact match is +inf dB. The JSON report spells both as strings (JSON has no infinities)."""
    import warnings

    from npuc.passes.calibration.compare import Agreement

    zero = np.zeros((2, 3), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dead = Agreement("dead")
        dead.add(zero, zero + 0.25)
        exact = Agreement("exact")
        exact.add(zero + 1.0, zero + 1.0)
    assert dead.sqnr_db == float("-inf") and exact.sqnr_db == float("inf")
    text = json.dumps([dead.public(), exact.public()], allow_nan=False)
    assert json.loads(text)[0]["sqnr_db"] == "-inf" and json.loads(text)[1]["sqnr_db"] == "inf"


def test_write_qtable_hands_the_search_to_build(samples, tmp_path, capsys):
    """`--auto-mixed COS --write-qtable <calib>.qtable`: the qtable's layers and the search's, in tpu-mlir's format,
    read back by `npuc build --calib` (the build keeps them in bf16); written only when the target is reached."""
    import npuc

    table = shrunk_table(tmp_path, "relu_17_Relu")
    Path(f"{table}.qtable").write_text("# op_name   quantize_mode\nrelu_38 BF16\n")
    args = ["compare", str(MODEL), "--calib", str(table), "--data", str(samples), "--sensitivity"]
    out = tmp_path / "found.qtable"
    assert cli(*args, "--write-qtable", str(out)) == 2  # nothing searched: nothing to write
    assert "add --auto-mixed" in capsys.readouterr().err and not out.exists()
    assert cli(*args, "--auto-mixed", "0.99999999", "--max-float-layers", "1", "--write-qtable", str(out)) == 2
    assert not out.exists()  # target missed: no file
    capsys.readouterr()
    assert cli(*args, "--auto-mixed", "0.9999", "--write-qtable", str(out)) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    written = read_qtable(out)
    assert list(written)[0] == "relu_38" and "relu_17" in written and set(written.values()) == {"BF16"}
    assert "npuc compare --auto-mixed 0.9999 (by int8 sensitivity" in out.read_text()
    result = npuc.build(MODEL, "cv18xx", tmp_path / "m.cvimodel", calib=table, qtable=out)
    assert result.summary["qtable_bf16_layers"] == list(written)


class _Scored:
    """A stand-in report: the output cosine a prefix of `k` float layers gives."""

    def __init__(self, cosine: float) -> None:
        self.output_cosine = cosine


def _prefix_search(cosines: dict[int, float], target: float, max_layers: int):  # noqa: ANN202
    from npuc.passes.calibration.compare import _ranked_prefix

    order = [f"l{i}" for i in range(20)]
    seen = []

    def evaluate(layers=(), per_layer=False):  # noqa: ANN001, ANN202
        seen.append(len(layers))
        return _Scored(cosines[len(layers)])

    found = _ranked_prefix(evaluate, target, max_layers, order, _Scored(cosines[0]), _Scored(1.0), 2)
    return found, seen


def test_ranked_prefix_search_finds_the_shortest_prefix_by_doubling_then_bisection():
    rising = {k: 0.9 + 0.01 * k for k in range(21)}  # reaches 0.95 from 5 layers on
    found, seen = _prefix_search(rising, 0.95, 12)
    assert found.reached and found.float_layers == ["l0", "l1", "l2", "l3", "l4"]
    assert seen == [1, 2, 4, 8, 6, 5, 5]  # doubling, bisection in (4, 8], then the report's per-layer run
    assert found.evaluations == 2 + len(seen) and "first 5 ranked layer(s)" in found.reason
    # the last rung is the bound itself; nothing reaching: the best prefix measured, not reached
    bumpy = {k: 0.9 - 0.01 * abs(k - 3) for k in range(21)}
    missed, seen = _prefix_search(bumpy, 0.95, 6)
    assert not missed.reached and missed.float_layers == ["l0", "l1"] and seen == [1, 2, 4, 6, 2]
    assert "the best prefix of the ranking, 2 float layer(s)" in missed.reason
    # not monotone: what it returns as reached was measured to reach
    dip = {**rising, 6: 0.9}
    found, _ = _prefix_search(dip, 0.95, 12)
    assert found.reached and dip[len(found.float_layers)] >= 0.95


def test_the_scans_float32_sums_stay_inside_the_scan(samples, tmp_path):
    """The sensitivity scan sums bf16 convs in float32 (a ranking needs no TIU rounding); an evaluation before and
    after it gives the same bits, and the switch is off outside `float32_sums`."""
    from npuc.compiler.kernels.quantized.bf16_conv import conv2d_sums, float32_sums
    from npuc.compiler.numformats.bf16_fp16 import round_to_bf16

    rng = np.random.default_rng(0)
    x = round_to_bf16(rng.standard_normal((1, 16, 9, 9)).astype(np.float32))
    w = round_to_bf16(rng.standard_normal((8, 16, 3, 3)).astype(np.float32))
    exact = conv2d_sums(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    with float32_sums():
        fast = conv2d_sums(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert np.array_equal(conv2d_sums(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1), exact)  # off again
    assert not np.array_equal(fast, exact) and np.allclose(fast, exact, rtol=1e-5, atol=1e-5)
    comparison = Comparison(MODEL, read_table(shrunk_table(tmp_path, "relu_17_Relu")), samples, "cv18xx_int8")
    bf16_heavy = [n for n in LAYERS if n != "relu_26"]
    before = comparison.evaluate(bf16_heavy, per_layer=False).outputs[0].sample_cosines
    layer_sensitivity(comparison)
    assert comparison.runs.kept == []  # no run made with those sums is resumed
    after = comparison.evaluate(bf16_heavy, per_layer=False).outputs[0].sample_cosines
    assert after == before


def test_sensitivity_reports_its_progress_layer_by_layer(samples):
    """The scan takes minutes on a large model: `npuc compare --sensitivity` shows a bar on a terminal, fed one
    step per measured layer."""
    steps: list[tuple[str, int, int]] = []

    def progress(label: str, total: int):  # noqa: ANN202
        return lambda n: steps.append((label, total, n))

    ranked = layer_sensitivity(Comparison(MODEL, read_table(TABLE), samples, "cv18xx_int8"), progress=progress)
    assert steps == [("int8 sensitivity", len(LAYERS), 1)] * len(ranked) and len(ranked) == len(LAYERS)


class _Stand:
    """A stand-in comparison over int8 layers `pool` (averaging), `conv1`, `conv2`: the output cosine of each
    set of float layers from `scores` (0.9 for a set it does not list)."""

    def __init__(self, scores: dict[frozenset, float], samples: int) -> None:
        self.scores, self.feeds = scores, [{}] * samples

    def evaluate(self, layers=(), per_layer=False):  # noqa: ANN001, ANN202
        from npuc.passes.calibration.compare import Agreement, CompareReport

        kept = frozenset(layers)
        cosine = self.scores.get(kept, 0.9)
        left = [n for n in ("pool", "conv1", "conv2") if n not in kept]
        return CompareReport(1, [Agreement("y", cosine=cosine)], [], list(layers), left)

    def averaging_layers(self, layers):  # noqa: ANN001, ANN202
        return [n for n in layers if n == "pool"]

    def local_loss(self, report):  # noqa: ANN001, ANN202
        return {"conv1": 0.02, "conv2": 0.01}

    def unit(self, layer: str) -> list[str]:
        return [layer]


def test_wider_samples_judge_the_averaging_layers_and_drop_picks_that_do_not_hold():
    """The few held-out samples favour conv1 and not the pool; more samples say the opposite (PP-OCRv6 rec's
    case, passes/calibration/compare.py's docstring): the pool is kept, conv1 dropped, and the reason says so."""
    from npuc.passes.calibration.compare import auto_mixed

    every = frozenset({"pool", "conv1", "conv2"})
    held = _Stand({every: 0.999, frozenset({"pool"}): 0.899, frozenset({"pool", "conv1"}): 0.95,
                   frozenset({"conv1"}): 0.95}, 5)  # fmt: skip
    wide = _Stand({frozenset({"pool"}): 0.95, frozenset({"pool", "conv1"}): 0.94}, 24)
    found = auto_mixed(held, 0.99, 4, wider=lambda: wide)
    assert not found.reached and found.float_layers == ["pool"]
    # on the 5, conv1 then conv2 reach the target; on the 24 they lose
    assert "1 averaging one(s)" in found.reason and "2 pick(s) dropped: no gain on 24 samples" in found.reason
    assert found.report.output_cosine == 0.899  # the held-out report of what is kept
    # picks that the wider samples confirm stay; without `wider`, neither judgement is made
    wide.scores[every] = 0.999
    kept = auto_mixed(held, 0.99, 4, wider=lambda: wide)
    assert kept.reached and kept.float_layers == ["pool", "conv1", "conv2"]
    assert auto_mixed(held, 0.99, 4).float_layers == ["conv1"]
