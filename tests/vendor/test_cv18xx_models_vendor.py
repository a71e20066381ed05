"""npuc's cv18xx builds of one small generated model per op family, and of real models, on the vendor simulator.

Each build runs on the vendor simulator and on `npuc run`'s simulator: outputs equal bit for bit. Built with
--quant-output, the int8 outputs also equal npuc's quantized reference (passes.quantization.quantize + QUANT_KERNELS),
so the generated code computes what the quantization chose, not merely the same thing twice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import run_cvimodel

from .cv18xx_build_util import (
    build,
    float_graph,
    generated_model,
    quantized_reference,
    random_feeds,
    real_model_shapes,
    real_model_table,
)
from .cv18xx_sim import run_vendor

FAMILIES = [
    "conv_basic", "conv_stride2", "conv_depthwise", "conv_group", "conv_dilated", "conv_1x1_nobias", "conv_5x5",
    "conv_asym_pad", "conv_rect", "pad_conv", "conv_bn_relu",
    "pool_max", "pool_max_3x3_s2", "pool_avg", "pool_avg_3x3_pad", "pool_global_avg",
    "eltwise_add", "eltwise_sub", "eltwise_mul", "eltwise_div_const", "eltwise_broadcast",
    "act_relu", "act_relu6", "act_prelu",
    "gemm", "matmul_dense", "matmul_3d", "concat", "tinycnn", "reshape_transpose",
]  # fmt: skip
FLOAT_OUTPUT_FAMILIES = ["resize_nearest", "upsample_nearest"]  # int8 data movement, fp32 outputs


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
@pytest.mark.parametrize("family", FAMILIES)
def test_op_family_int8_equals_reference_and_vendor(family: str, chip: str, tmp_path: Path) -> None:
    model, table = generated_model(family, tmp_path)
    feeds = random_feeds(float_graph(model), 99)
    path = build(model, table, chip, "int8", tmp_path / f"{family}.cvimodel", quant_output=True)
    ours = run_cvimodel(read_cvimodel(path), feeds)
    vendor = run_vendor(path, feeds)
    reference = quantized_reference(model, table, feeds)
    for name, value in ours.items():
        assert name.endswith("_i8") and value.dtype == np.int8
        assert np.array_equal(value.ravel(), reference[name].ravel())
        assert np.array_equal(value.ravel(), vendor[name].ravel())
        assert len(np.unique(value)) > 2  # a real result, not a constant


@pytest.mark.parametrize("family", FLOAT_OUTPUT_FAMILIES)
def test_data_movement_families_equal_vendor(family: str, tmp_path: Path) -> None:
    model, table = generated_model(family, tmp_path)
    feeds = random_feeds(float_graph(model), 99)
    path = build(model, table, "cv183x", "int8", tmp_path / f"{family}.cvimodel")
    ours = run_cvimodel(read_cvimodel(path), feeds)
    vendor = run_vendor(path, feeds)
    assert all(_same(ours[n], vendor[n].reshape(ours[n].shape)) for n in ours)


@pytest.mark.parametrize(
    "family", ["conv_basic", "conv_depthwise", "pool_avg", "eltwise_add", "eltwise_div_const", "gemm", "concat"]
)
def test_bf16_families_equal_vendor(family: str, tmp_path: Path) -> None:
    model, _ = generated_model(family, tmp_path)
    feeds = random_feeds(float_graph(model), 7)
    path = build(model, None, "cv181x", "bf16", tmp_path / f"{family}.cvimodel")
    ours = run_cvimodel(read_cvimodel(path), feeds)
    vendor = run_vendor(path, feeds)
    assert all(_same(ours[n], vendor[n].reshape(ours[n].shape)) for n in ours)


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
@pytest.mark.parametrize("name", ["pplcnet_orientation", "mbv3_textline_cls"])
def test_real_models_run_bit_exactly(name: str, chip: str, tmp_path: Path, real_model) -> None:
    """Hard-swish/hard-sigmoid lookups, SE broadcast multiplies, FC and the CPU softmax on real pictures."""
    model = real_model(name)
    table, feeds = real_model_table(name, model, tmp_path)
    path = build(model, table, chip, "int8", tmp_path / f"{name}.cvimodel", real_model_shapes(name))
    for feed in feeds[:2]:
        ours = run_cvimodel(read_cvimodel(path), feed)
        vendor = run_vendor(path, feed)
        for out, value in ours.items():
            assert _same(value, vendor[out].reshape(value.shape))
            assert np.isclose(value.sum(), 1.0, atol=1e-5)  # the softmax over the classes ran


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
@pytest.mark.parametrize("name", ["mtcnn_pnet", "mtcnn_rnet"])
def test_mtcnn_int8_equals_reference_and_vendor(name: str, chip: str, tmp_path: Path, real_model) -> None:
    """PReLU, ceil-mode max pooling, the NHWC input (quantized as fed, transposed on the TPU), output
    transposes and FC: every int8 output equals the quantized reference and the vendor simulator.

    The fp32 softmax outputs equal the vendor's bit for bit too: P-Net's runs over the last axis of an NHWC
    tensor, one row per pixel, which exercises the runtime's max seeded from the first row."""
    model = real_model(name)
    table, feeds = real_model_table(name, model, tmp_path)
    shapes = real_model_shapes(name)
    path = build(model, table, chip, "int8", tmp_path / f"{name}.cvimodel", shapes, quant_output=True)
    ours = run_cvimodel(read_cvimodel(path), feeds[0])
    vendor = run_vendor(path, feeds[0])
    reference = quantized_reference(model, table, feeds[0], shapes)
    for out, value in ours.items():
        theirs = vendor[out].reshape(value.shape)
        if value.dtype == np.int8:
            assert np.array_equal(value.ravel(), reference[out].ravel())
            assert np.array_equal(value, theirs)
        else:
            assert _same(value, theirs)


@pytest.mark.parametrize("chip", ["cv181x"])
def test_onet_bf16_is_bit_exact_on_31_face_crops(chip: str, tmp_path: Path, real_model) -> None:
    """MTCNN O-Net in bf16 (PReLU, max pools, FC, the CPU softmax) on 31 real face crops (scikit-image's LFW
    subset, prepared as the face pipeline feeds O-Net): every output equals the vendor simulator's bit for bit.
    cv183x on faces 16..46 (the crops that once differed by one ulp): test_cv18xx_onet_bf16_vendor.py."""
    from npuc.models.images import face_crops, preprocess

    model = real_model("mtcnn_onet")
    path = build(model, None, chip, "bf16", tmp_path / "onet.cvimodel")
    cvimodel = read_cvimodel(path)
    feeds = [{"input_3": preprocess(crop, "mtcnn_onet")} for crop in face_crops()[:31]]
    for i, feed in enumerate(feeds):
        ours, vendor = run_cvimodel(cvimodel, feed), run_vendor(path, feed)
        assert set(ours) == set(vendor)
        assert all(_same(ours[n], vendor[n].reshape(ours[n].shape)) for n in ours), f"crop {i}"
