"""DV700 weight packing: sizes, vendor offsets, slot maps and exact decode of fp16 and 8-bit LUT packs."""

from __future__ import annotations

import numpy as np
import pytest

from npuc.backends.dmp import weights as wp
from npuc.compiler.errors import CorruptFileError, UserError

SHAPES = [
    (64, 3, 7, 7),
    (64, 64, 1, 1),
    (10, 3, 3, 3),
    (13, 70, 1, 1),
    (9, 17, 5, 5),
    (11, 5, 7, 7),
    (64, 28, 2, 2),
    (8, 3, 4, 6),
]


def _expected(w: np.ndarray, quantized: bool, transposed: bool = False, dilated: bool = False) -> np.ndarray:
    """The weights a pack decodes to: fp16 values, or the LUT entries the k-means gives each stored value
    (clustered in storage order from OpenCV's initial random state, as pack_conv after a reset)."""
    if not quantized:
        return w.astype(np.float16).astype(np.float32)
    wp.reset_kmeans_seed()
    m, c, kh, kw = w.shape
    if dilated:
        stored = w.transpose(0, 1, 3, 2).copy().reshape(w.shape) if transposed else w
        lut, idx = wp.cluster_lut(stored)
        values = lut.astype(np.float32)[idx]
        return values.reshape(m, c, kw, kh).transpose(0, 1, 3, 2) if transposed else values
    lut, idx = wp.cluster_lut(wp.stored_kernels(w, transposed))
    values, p = lut.astype(np.float32)[idx], wp.effective_kernel(kh, kw)
    return values[:, :, p - kw :, :kh].transpose(0, 1, 3, 2) if transposed else values[:, :, p - kh :, :kw]


def _pack(w: np.ndarray, b: np.ndarray, **kw) -> bytes:
    wp.reset_kmeans_seed()
    return wp.pack_conv(w, b, **kw)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_roundtrip_and_size(shape: tuple[int, int, int, int], quantized: bool, transposed: bool) -> None:
    rng = np.random.default_rng(sum(shape))
    w = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape[0]).astype(np.float32)
    data = _pack(w, b, quantized=quantized, transposed=transposed)
    assert len(data) == wp.conv_weight_size(*shape, quantized=quantized)
    assert len(data) % 16 == 0
    dec = wp.unpack_conv(data, *shape, quantized=quantized, transposed=transposed)
    assert np.array_equal(dec.weight, _expected(w, quantized, transposed))
    assert np.array_equal(dec.bias, b.astype(np.float16).astype(np.float32))
    if quantized:
        assert dec.lut[0] == 0.0 and np.count_nonzero(dec.lut) == 255
        assert np.abs(dec.weight - w).max() < 0.1  # 255 clusters over standard-normal values


def test_transposed_panels_hold_each_kernel_with_kx_and_ky_exchanged() -> None:
    w = np.arange(2 * 3 * 9, dtype=np.float32).reshape(2, 3, 3, 3) / 64
    plain = np.frombuffer(wp.pack_conv(w, np.zeros(2), quantized=False), np.uint8)
    swapped = np.frombuffer(wp.pack_conv(w, np.zeros(2), quantized=False, transposed=True), np.uint8)
    assert plain.size == swapped.size
    panel = swapped[16 : 16 + 144].view(np.float16).reshape(12, 6)
    assert np.array_equal(panel[9:12, 0:3], w[0, 0].T.astype(np.float16))
    assert np.array_equal(panel[9:12, 3:6], w[0, 1].T.astype(np.float16))
    # an even kernel is padded at the bottom and left before the exchange: the HW reads the same cells
    even = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2) + 1
    panel = np.frombuffer(wp.pack_conv(even, np.zeros(1), quantized=False, transposed=True), np.uint8)
    cells = panel[16 : 16 + 144].view(np.float16).reshape(12, 6)[9:12, 0:3]
    assert cells.tolist() == [[0, 0, 0], [1, 3, 0], [2, 4, 0]]


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_depthwise_and_dilated_roundtrip(quantized: bool, transposed: bool) -> None:
    rng = np.random.default_rng(7)
    dw = rng.standard_normal((32, 1, 3, 3)).astype(np.float32)
    data = _pack(dw, np.zeros(32), quantized=quantized, transposed=transposed)
    assert len(data) == (2880 if quantized else 144 * 32 + 64)  # 512 + 72*32 + 16*4 (vendor MobileNet dw1)
    dec = wp.unpack_conv(data, 32, 1, 3, 3, quantized=quantized, transposed=transposed)
    assert np.array_equal(dec.weight, _expected(dw, quantized, transposed))
    dil = rng.standard_normal((12, 70, 3, 3)).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32)
    data = _pack(dil, b, quantized=quantized, dilated=True, transposed=transposed)
    tap = -(-((72 if quantized else 144) * 12 * 2 + 32) // 16) * 16
    assert len(data) == wp.dilated_weight_size(12, 70, 3, 3, quantized=quantized) == (512 if quantized else 0) + 9 * tap
    dec = wp.unpack_conv(data, 12, 70, 3, 3, quantized=quantized, dilated=True, transposed=transposed)
    assert np.array_equal(dec.weight, _expected(dil, quantized, transposed, dilated=True))
    assert np.array_equal(dec.bias, b.astype(np.float16).astype(np.float32))
    first_tap_bias = np.frombuffer(data, np.uint8)[(512 if quantized else 0) :][:16]
    assert not first_tap_bias.any()  # only the last tap carries the bias


def test_prelu_block_layout() -> None:
    w = np.arange(2 * 3 * 9, dtype=np.float32).reshape(2, 3, 3, 3) / 64
    data = np.frombuffer(wp.pack_conv(w, np.array([1.0, 2.0]), quantized=False, prelu=np.array([0.25, 0.5])), np.uint8)
    assert data.size == wp.conv_weight_size(2, 3, 3, 3, quantized=False, prelu=True) == 2 * 144 + 32
    assert list(data[:32].view(np.float16)) == [1, 2, 0, 0, 0, 0, 0, 0, 0.25, 0.5, 0, 0, 0, 0, 0, 0]
    panel = data[32 : 32 + 144].view(np.float16).reshape(12, 6)
    assert np.array_equal(panel[9:12, 0:3], w[0, 0].astype(np.float16))  # channel 0 at rows 9..11, cols 0..2
    assert np.array_equal(panel[9:12, 3:6], w[0, 1].astype(np.float16))  # channel 1 beside it
    assert np.array_equal(panel[6:9, 0:3], w[0, 2].astype(np.float16))  # channel 2 one tile up
    assert wp.unpack_conv(data.tobytes(), 2, 3, 3, 3, quantized=False, prelu=True).prelu.tolist() == [0.25, 0.5]


def test_slot_maps_are_permutations() -> None:
    assert sorted(wp.slot_map(1).reshape(-1)) == sorted(set(wp.slot_map(1).reshape(-1))) and wp.slot_map(1).size == 64
    assert len(set(wp.slot_map(3).reshape(-1))) == 72
    assert len(set(wp.slot_map(5).reshape(-1))) == 50
    seven = wp.slot_map(7)[0]
    assert len(set(seven.reshape(-1))) == 49
    assert seven[0, 6] == 2 * 6 + 5 and seven[4, 6] == 0 and seven[6, 0] == 11 * 6


def test_resnet50_vendor_offsets() -> None:
    """conv1 7x7 3->64 then a 1x1 64->64 (8-bit): the vendor's next offsets are 14464 and 19712."""
    sizes = [wp.conv_weight_size(64, 3, 7, 7, quantized=True), wp.conv_weight_size(64, 64, 1, 1, quantized=True)]
    assert np.cumsum(sizes).tolist() == [14464, 19712]
    assert wp.conv_weight_size(1000, 1024, 1, 1, quantized=True) == 512 + 72 * 1000 * 16 + 16 * 125


def test_lut_exact_for_few_values_and_deterministic() -> None:
    w = np.array([0.5, -0.25, 0.75, 1.0, 0.0], np.float32).reshape(5, 1, 1, 1)
    lut, idx = wp.cluster_lut(w)
    assert np.array_equal(lut.astype(np.float32)[idx], w)  # as many clusters as values
    big = np.random.default_rng(1).standard_normal(20000).astype(np.float32)
    wp.reset_kmeans_seed()
    a = wp.cluster_lut(big)
    wp.reset_kmeans_seed()
    b = wp.cluster_lut(big)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    err = np.abs(a[0].astype(np.float32)[a[1]] - big)
    assert err.mean() < 0.01


def test_errors() -> None:
    with pytest.raises(UserError, match="PReLU"):
        wp.pack_conv(np.ones((8, 1, 1, 1)), np.zeros(8), quantized=True, prelu=np.ones(8))
    with pytest.raises(UserError, match="7x7"):
        wp.conv_weight_size(8, 8, 9, 9, quantized=False)
    with pytest.raises(CorruptFileError, match="truncated"):
        wp.unpack_conv(b"\0" * 100, 8, 8, 3, 3, quantized=False)
