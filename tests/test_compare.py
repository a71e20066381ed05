"""`npuc compare`: the quantized reference against onnxruntime float, per output and per layer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from npuc.compiler.cli import main
from npuc.compiler.commands.compare import compare_model

GOLDEN = Path(__file__).resolve().parents[1].parent / "shared" / "golden" / "cv18xx"
MODEL = GOLDEN / "smallcnn.onnx"
TABLE = GOLDEN / "smallcnn_cali_table.txt"


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
    assert sorted(names) == sorted(
        ["relu_8", "maxpool_9", "relu_17", "bn_24", "relu_26", "relu_34", "relu_38", "gap_39", "flatten_40"]
    )
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
    assert len(payload["layers"]) == 9 and set(payload["layers"][0]) == {
        "name", "cosine", "sqnr_db", "max_abs_error", "top1_agreement"
    }  # fmt: skip


def test_cli_bad_inputs_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(MODEL), "--calib", str(TABLE), "--data", str(tmp_path)])
    assert exc.value.code == 2 and "no .npz or .npy files" in capsys.readouterr().err
    np.savez(tmp_path / "a.npz", other=np.zeros(3, np.float32), more=np.zeros(3, np.float32))
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(MODEL), "--calib", str(TABLE), "--data", str(tmp_path)])
    assert exc.value.code == 2 and "no array for input(s) ['input']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(MODEL), "--target", "bm1880", "--calib", str(TABLE), "--data", str(tmp_path)])
    assert exc.value.code == 2 and "not supported" in capsys.readouterr().err
