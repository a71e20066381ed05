"""With `--histogram tpu-mlir`, npuc's KL thresholds equal tpu-mlir's on MTCNN O-Net, row by row.

tpu-mlir builds each tensor's |x| histogram sample by sample: the first sample sets 2048 bins over its range and
a later, wider sample appends bins at the old step, so the bins and KL candidates depend on the sample order.
npuc reproduces that geometry from pass 1's per-sample absmax (passes/calibration/histogram.py). The expected
values are tpu-mlir 1.30.2's `run_calibration onet.mlir --dataset s --input_num 31 --chip cv183x --tune_num 0`
on the 31 inputs of `model_inputs("mtcnn_onet", 31)` saved as s/00.npz .. s/30.npz; its DataSelector sorts the
folder and shuffles it with random.seed(1684), the order TPU_MLIR_ORDER lists. Rows compared: those both
tables name alike (tpu-mlir fuses MatMul+Add into Gemm and has an extra Transpose row).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate

SAMPLES = 31
TPU_MLIR_ORDER = [10, 11, 6, 2, 4, 7, 12, 24, 3, 1, 5, 25, 26, 23, 17, 30, 29, 27, 21, 22, 19, 28, 18, 20, 14, 13,
                  9, 8, 16, 0, 15]  # fmt: skip
TPU_MLIR_KL = {
    "input_3": 0.9960940,
    "convolution_output3_Conv": 4.5963693,
    "p_re_lu_7/add:0_PRelu": 1.5321231,
    "p_re_lu_7/add:0_pooling0_MaxPool": 2.2981846,
    "convolution_output2_Conv": 8.3914595,
    "p_re_lu_8/add:0_PRelu": 2.6506259,
    "p_re_lu_8/add:0_pooling0_MaxPool": 2.8715115,
    "convolution_output1_Conv": 7.2100143,
    "p_re_lu_9/add:0_PRelu": 2.3191788,
    "p_re_lu_9/add:0_pooling0_MaxPool": 2.3191788,
    "convolution_output_Conv": 2.3077168,
    "p_re_lu_10/add:0_PRelu": 1.4071645,
    "push_transpose_out_17_Transpose": 1.4071645,
    "flatten_1/Reshape:0_Flatten": 1.4071645,
    "p_re_lu_11/add:0_PRelu": 1.2184634,
    "softmax_2_Softmax": 0.9999988,
}


@pytest.fixture(scope="module")
def onet_samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from npuc.models.images import model_inputs

    folder = tmp_path_factory.mktemp("onet_kl")
    for i, feed in enumerate(model_inputs("mtcnn_onet", SAMPLES)):
        np.savez(folder / f"{i:02d}.npz", **feed)
    listed = folder / "tpu_mlir_order.txt"
    listed.write_text("".join(f"{folder / f'{i:02d}.npz'}\n" for i in TPU_MLIR_ORDER))
    return listed


def test_onet_kl_rows_equal_tpu_mlir(real_model, onet_samples: Path) -> None:  # noqa: ANN001
    assert sorted(TPU_MLIR_ORDER) == list(range(SAMPLES))
    model, kl = real_model("mtcnn_onet"), CalibrationOptions(method="kl", histogram="tpu-mlir")
    table = calibrate(model, [onet_samples], options=kl, jobs=1).table
    for name, expected in TPU_MLIR_KL.items():  # float32 rounding: tpu-mlir's interpreter is not onnxruntime
        assert table.entries[name].threshold == pytest.approx(expected, rel=2e-6), name
    # sorted instead, the first sample and the growth differ: convolution_output2 is then 10.559, not 8.391
    folder = onet_samples.parent
    sorted_table = calibrate(model, [folder / f"{i:02d}.npz" for i in range(SAMPLES)], options=kl, jobs=1).table
    assert sorted_table.entries["convolution_output2_Conv"].threshold == pytest.approx(10.5592546, rel=2e-6)
