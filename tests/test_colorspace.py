"""Horizon preprocessing: BT.601 YUV, NV12 layout, HzPreprocess and the composed per-pixel affine map."""

from __future__ import annotations

import numpy as np
import pytest

from npuc.compiler.errors import UserError
from npuc.frontends import colorspace as cs


def test_bt601_full_range_known_pixels():
    rgb = np.array([[255, 255, 255], [0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255]], np.uint8)
    yuv = cs.rgb_to_yuv444(rgb)
    # Y = .299R + .587G + .114B; U = -.168736R - .331264G + .5B + 128; V = .5R - .418688G - .081312B + 128
    assert yuv.tolist() == [[255, 128, 128], [0, 128, 128], [76, 85, 255], [150, 44, 21], [29, 255, 107]]


def test_bt601_video_range_known_pixels():
    rgb = np.array([[255, 255, 255], [0, 0, 0], [255, 0, 0]], np.uint8)
    yuv = cs.rgb_to_yuv444(rgb, "bt601_video")
    # Y' = 16 + 219·luma/255, C = 128 + 224·chroma/255 (red: 16+65.481 = 81.48, Cb 128-37.797, Cr 240)
    assert yuv.tolist() == [[235, 128, 128], [16, 128, 128], [81, 90, 240]]


def test_yuv_rgb_round_trip_is_within_one_level():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    for space in cs.YUV_SPACES:
        back = cs.yuv444_to_rgb(cs.rgb_to_yuv444(rgb, space), space)
        tolerance = 1 if space == "regular" else 2  # video range has fewer levels
        assert np.abs(back.astype(int) - rgb).max() <= tolerance


def test_nv12_byte_layout():
    yuv = np.zeros((2, 4, 3), np.uint8)
    yuv[..., 0] = np.arange(8).reshape(2, 4)
    yuv[:, :2, 1], yuv[:, 2:, 1] = 10, 31  # U per 2x2 block
    yuv[:, :2, 2], yuv[:, 2:, 2] = 20, 40
    yuv[0, 0, 1] = 11  # block mean (11+10+10+10)/4 = 10.25 -> 10
    nv12 = cs.yuv444_to_nv12(yuv)
    assert nv12.shape == (3, 4)
    assert nv12.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [10, 20, 31, 40]]
    back = cs.nv12_to_yuv444(nv12, 2, 4)
    assert back[..., 1].tolist() == [[10, 10, 31, 31], [10, 10, 31, 31]]
    assert back[..., 2].tolist() == [[20, 20, 40, 40], [20, 20, 40, 40]]


def test_nv12_chroma_rounds_half_to_even():
    yuv = np.zeros((2, 4, 3), np.uint8)
    yuv[:, :2, 1] = [[1, 1], [1, 2]]  # mean 1.25 -> 1
    yuv[:, 2:, 1] = [[2, 3], [2, 3]]  # mean 2.5 -> 2 (ties to even)
    yuv[:, :2, 2] = [[3, 4], [3, 4]]  # mean 3.5 -> 4
    assert cs.yuv444_to_nv12(yuv)[2].tolist() == [1, 4, 2, 0]


@pytest.mark.parametrize("shape", [(3, 4, 3), (4, 5, 3)])
def test_nv12_needs_even_height_and_width(shape):
    with pytest.raises(UserError, match=r"input 'cam'.*even height and width.*got \d+x\d+"):
        cs.yuv444_to_nv12(np.zeros(shape, np.uint8), name="cam")


def test_nv12_buffer_size_is_checked():
    with pytest.raises(UserError, match="NV12 buffer has 10 bytes, a 2x4 picture needs 12"):
        cs.nv12_to_yuv444(np.zeros(10, np.uint8), 2, 4)


def test_hz_preprocess_formula():
    x = np.array([[-128, 0, 127]], np.int8).reshape(1, 3, 1)  # channels on axis 1
    y = cs.hz_preprocess(x, np.array([128.0, 100.0, 0.0]), np.array([0.5, 2.0, 1 / 255]), channel_axis=1)
    # ((x + 128) - mean) * scale
    assert y.ravel().tolist() == pytest.approx([(0 - 128) * 0.5, (128 - 100) * 2.0, 255 / 255])


def test_affine_equals_step_by_step_nv12_to_rgb():
    mean, scale = (123.675, 116.28, 103.53), (0.017, 0.0175, 0.0174)
    affine = cs.preprocess_affine("nv12", "rgb", "data_mean_and_scale", mean, scale)
    rng = np.random.default_rng(1)
    yuv_int8 = rng.integers(-128, 128, (5, 7, 3)).astype(np.int8)
    yuv = yuv_int8.astype(np.float64) + 128
    inv, inv_off = cs.YUV_SPACES["regular"].inverse()
    rgb = yuv @ inv.T + inv_off
    expected = (rgb - np.array(mean)) * np.array(scale)
    np.testing.assert_allclose(affine.apply(yuv_int8), expected, rtol=0, atol=1e-5)


def test_affine_rgb_to_bgr_swaps_and_normalizes():
    affine = cs.preprocess_affine("rgb", "bgr", "data_mean", (10.0, 20.0, 30.0), None)
    x = np.array([[[-128, 0, 100]]], np.int8)  # r=0, g=128, b=228
    assert affine.apply(x).ravel().tolist() == pytest.approx([228 - 10, 128 - 20, 0 - 30])


def test_affine_gray_data_scale():
    affine = cs.preprocess_affine("gray", "gray", "data_scale", None, (0.5,))
    assert affine.apply(np.array([[[-128], [127]]], np.int8)).ravel().tolist() == [0.0, 127.5]


def test_disallowed_pair_is_refused():
    with pytest.raises(UserError, match="input_type_rt nv12 cannot feed input_type_train gray"):
        cs.preprocess_affine("nv12", "gray")


def test_runtime_pixels_nv12_applies_chroma_subsampling():
    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[0, 0] = (255, 0, 0)  # one red pixel in a 2x2 block: chroma is the block mean
    px = cs.runtime_pixels(rgb, "nv12").astype(int) + 128
    yuv = cs.rgb_to_yuv444(rgb).astype(int)
    assert px[..., 0].tolist() == yuv[..., 0].tolist()
    assert px[0, 0, 1] == px[1, 1, 1] == round(yuv[..., 1].mean())
    assert cs.runtime_pixels(rgb, "bgr")[0, 0].tolist() == [-128, -128, 127]


def test_int8_offset():
    assert cs.to_int8_128(np.array([0, 128, 255], np.uint8)).tolist() == [-128, 0, 127]
