"""CV18xx VLC weight compression: the golden bf16 FC weights decode to the ONNX weights and re-encode byte for byte."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from golden import GOLDEN_ROOT
from onnx import numpy_helper

from npuc.backends.cv18xx import compression as vlc
from npuc.backends.cv18xx import isa
from npuc.backends.cv18xx.chips import CHIPS
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim import Machine
from npuc.backends.cv18xx.sim_mem import GlobalMemory
from npuc.backends.cv18xx.sim_tiu import f32_to_bf16
from npuc.compiler.errors import CorruptFileError

GOLDEN = GOLDEN_ROOT / "cv18xx"
FC_ELEMENTS = 32 * 10  # fc_w_41_fix_bf16: the Gemm weight transposed to 32x10, stored compressed at weight+0
FC_STORED_BYTES = 640  # its weight_map size: the uncompressed size, the compressed buffer padded with zeros


def _fc_weight_bf16() -> np.ndarray:
    model = onnx.load(GOLDEN / "smallcnn.onnx")
    w = next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == "fc_w_41")
    assert w.shape == (10, 32)
    return f32_to_bf16(np.ascontiguousarray(w.T)).reshape(-1)


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
def test_golden_fc_weights_decode_to_the_onnx_weights(chip: str) -> None:
    weight = read_cvimodel(GOLDEN / f"smallcnn_{chip}_bf16.cvimodel").weight
    header = vlc.VlcHeader.unpack(weight[:16])
    assert header == vlc.VlcHeader(stream_bytes=448, signed=0, bf16=1, bias0=123, bias1=0, zero_guard=0)
    assert vlc.compressed_size(header, FC_ELEMENTS) == 16 + 32 + 448
    decoded = vlc.decompress(weight[:FC_STORED_BYTES], FC_ELEMENTS, bf16=True)
    assert decoded.dtype == np.uint16
    assert np.array_equal(decoded, _fc_weight_bf16())


def test_encoder_reproduces_the_golden_compressed_bytes() -> None:
    weight = read_cvimodel(GOLDEN / "smallcnn_cv183x_bf16.cvimodel").weight
    encoded = vlc.compress(_fc_weight_bf16())
    assert len(encoded) == 496
    assert encoded == weight[:496]
    assert weight[496:FC_STORED_BYTES] == bytes(FC_STORED_BYTES - 496)


def test_all_zero_int8_block_by_hand() -> None:
    # 16 unsigned zeros: order 0, unary field of sixteen 1s; k-map byte 0 (k=0, ulen=0); stream 16-byte padded
    encoded = vlc.compress(np.zeros(16, np.uint8))
    header = (16).to_bytes(3, "little") + bytes(13)
    assert encoded == header + bytes(16) + b"\xff\xff" + bytes(14)
    assert vlc.decompress(encoded, 16, bf16=False).tolist() == [0] * 16


def test_signed_int8_header_biases() -> None:
    values = np.array([3, 4, 5, -2, -7, 0, 3, 9] * 4, np.int8)
    header = vlc.VlcHeader.unpack(vlc.compress(values))
    assert (header.signed, header.bf16, header.bias0, header.bias1, header.zero_guard) == (1, 0, 2, 1, 0)
    assert np.array_equal(vlc.decompress(vlc.compress(values), 32, bf16=False).view(np.int8), values)


def _bf16_with_zeros(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    bits = f32_to_bf16(rng.normal(0, scale, n).astype(np.float32))
    bits[rng.random(n) < 0.3] = 0
    return bits


@pytest.mark.parametrize("n", [1, 15, 16, 17, 100, 1000, 4099])
def test_round_trip(n: int) -> None:
    rng = np.random.default_rng(n)
    cases = {
        "int8 uniform": rng.integers(-128, 128, n).astype(np.int8),
        "int8 narrow": np.clip(rng.normal(0, 5, n), -128, 127).astype(np.int8),
        "uint8 uniform": rng.integers(0, 256, n).astype(np.uint8),
        "uint8 small": rng.integers(0, 4, n).astype(np.uint8),
        "bf16": f32_to_bf16(rng.normal(0, 0.1, n).astype(np.float32)),
        "bf16 huge": f32_to_bf16(rng.normal(0, 1e30, n).astype(np.float32)),
        "bf16 zero guard": _bf16_with_zeros(rng, n, 0.1),
        "bf16 zero guard tiny": _bf16_with_zeros(rng, n, 1e-30),
    }
    for name, values in cases.items():
        bf16 = values.dtype == np.uint16
        encoded = vlc.compress(values)
        header = vlc.VlcHeader.unpack(encoded)
        assert len(encoded) == vlc.compressed_size(header, n) and len(encoded) % 16 == 0, name
        decoded = vlc.decompress(encoded, n, bf16)
        # zero guard keeps no fraction for zero exponents: -0 and denormals decode to +0
        want = np.where((values >> 7) & 0xFF == 0, 0, values) if header.zero_guard else values.view(decoded.dtype)
        assert np.array_equal(decoded, want), name


def test_zero_guard_is_used_for_bf16_zeros() -> None:
    values = np.array([0x3F80, 0, 0xBF80, 0x8000] * 8, np.uint16)  # 1, 0, -1, -0
    encoded = vlc.compress(values)
    assert vlc.VlcHeader.unpack(encoded).zero_guard == 1
    assert vlc.decompress(encoded, 32, bf16=True).tolist() == [0x3F80, 0, 0xBF80, 0] * 8


@pytest.mark.parametrize("bias", [0, 1, 64, 123, 127, 128, 129, 200, 255])
def test_exponent_remapping_is_a_bijection(bias: int) -> None:
    values = np.arange(256)
    for zero_guard in (0, 1):
        mapped = vlc.remap_exponents(values, bias, zero_guard)
        assert sorted(mapped.tolist()) == list(range(256))
        assert np.array_equal(vlc.unmap_exponents(mapped, bias, zero_guard), values)
    assert vlc.remap_exponents(values, bias, 1)[0] == 0


def test_corrupt_buffers_raise_corrupt_file_error() -> None:
    good = vlc.compress(np.arange(-64, 64, dtype=np.int8))
    with pytest.raises(CorruptFileError, match="16-byte VLC header"):
        vlc.decompress(good[:10], 128, bf16=False)
    with pytest.raises(CorruptFileError, match="header says int8 data, the transfer is bf16"):
        vlc.decompress(good, 64, bf16=True)
    with pytest.raises(CorruptFileError, match="needs .* bytes"):
        vlc.decompress(good[:-16], 128, bf16=False)
    bad_order = bytearray(good)
    bad_order[16] = 6 << 5
    with pytest.raises(CorruptFileError, match="block 0 has order 6"):
        vlc.decompress(bytes(bad_order), 128, bf16=False)


def test_fuzzed_buffers_never_raise_anything_else() -> None:
    rng = np.random.default_rng(7)
    sources = [
        (vlc.compress(_bf16_with_zeros(rng, 200, 0.1)), True),
        (vlc.compress(f32_to_bf16(rng.normal(0, 1, 200).astype(np.float32))), True),
        (vlc.compress(rng.integers(-20, 20, 200).astype(np.int8)), False),
    ]
    outcomes = {"ok": 0, "corrupt": 0}
    for good, bf16 in sources:
        for _ in range(150):
            data = bytearray(good)
            for pos in rng.integers(0, len(data), 3):
                data[pos] = int(rng.integers(0, 256))
            try:
                assert len(vlc.decompress(bytes(data), 200, bf16)) == 200
                outcomes["ok"] += 1
            except CorruptFileError:
                outcomes["corrupt"] += 1
    assert outcomes["ok"] > 0 and outcomes["corrupt"] > 0


def test_tdma_decompressing_tensor_load_into_local_memory() -> None:
    """An int8 tensor-mode load with compress_en=1: gmem holds the VLC buffer, lmem gets the dense tensor."""
    chip = CHIPS["cv182x"]
    values = np.random.default_rng(3).integers(-100, 100, 2 * 8 * 3 * 5).astype(np.int8)
    weight = np.zeros(4096, np.uint8)
    encoded = np.frombuffer(vlc.compress(values), np.uint8)
    weight[64 : 64 + len(encoded)] = encoded
    machine = Machine(chip, GlobalMemory({1: weight}))
    f = isa.decode(isa.tdma_table(), bytes(isa.TDMA_BYTES))
    f.update(vld=1, compress_en=1, cmprs_fmt=1, trans_dir=0, src_fmt=1, dst_fmt=1, src_base_reg_sel=1)
    f.update(src_base_addr_low=64, src_n=2, src_c=8, src_h=3, src_w=5, dst_c=8, dst_h=3, dst_w=5)
    f.update(src_n_stride=120, src_c_stride_low=15, src_h_stride=5)
    f.update(dst_base_addr_low=0x100, dst_n_stride=16, dst_c_stride_low=16, dst_h_stride=5)
    machine.tdma(f)
    got = machine.lmem.read(0x100, (2, 8, 3, 5), (16, 16, 5, 1), "i8")
    assert np.array_equal(got, values.reshape(2, 8, 3, 5))
