"""backends/cv18xx/vendor_cost.py: the vendor's per-descriptor cost formulas, worked by hand on single
descriptors and DDR runs; timing.schedule_model prices whole files with them; and the paired-channel conv
(double_conv) npuc now sets where tpu-mlir does, which the simulator refuses where the chip cannot pair."""

from __future__ import annotations

import numpy as np
import pytest
from cv18xx_smallcnn import build_smallcnn
from golden import GOLDEN_ROOT

from npuc.backends.cv18xx import isa
from npuc.backends.cv18xx.chips import CHIPS
from npuc.backends.cv18xx.cmdbuf import split_cmdbuf, tiu_op_name
from npuc.backends.cv18xx.container import read_cvimodel
from npuc.backends.cv18xx.sim_mem import LocalMemory
from npuc.backends.cv18xx.sim_tiu import TiuContext, normalize_tiu_fields, tiu_conv
from npuc.backends.cv18xx.timing import NOMINAL, ZeroFields, schedule_model
from npuc.backends.cv18xx.vendor_cost import VENDOR_COSTS, run_bytes, tdma_cost, tiu_cost
from npuc.compiler.errors import UnsupportedError

CV183X = CHIPS["cv183x"]
TPU_MLIR_ONET = GOLDEN_ROOT / "cv18xx" / "onet_tpumlir_cv183x_int8.cvimodel"


@pytest.mark.parametrize(
    ("start", "length", "expected"),
    [
        (0, 256, 256),  # one burst on a 64-byte line: four beats
        (16, 256, 320),  # off the line: one beat more
        (0, 300, 256 + 64),  # a burst and a 44-byte tail, one beat
        (4000, 200, 128 + 128),  # cut at 4096: 96 bytes from 4000 (two beats), 104 from 4096 (two beats)
        (1 << 40, 64, 64),  # the region bits above the 32-bit address do not count
    ],
)
def test_ddr_runs_are_counted_in_bursts_of_64_byte_beats(start, length, expected):
    assert int(run_bytes(np.array([start]), np.array([length]))[0]) == expected


def _conv(double: int) -> dict[str, int]:
    return ZeroFields(tsk_typ=0, opd_typ=0, opt_chl_quan=1, tsk_opd_num=3, res0_n=1, res0_c=32, res0_h=4, res0_w=4,
                   opd0_c=16, opd1_h=3, opd1_w=3, conv_op_x_str=1, double_conv=double)  # fmt: skip


def test_tiu_formulas_worked_by_hand():
    # 32 output channels on 32 lanes, 16 outputs on 16 EUs: one tile. Loop: 3x3 taps x 16 channels + rounding
    # shift 1 (per-channel); no bias cycles (per-channel), no partial sums; + 41 sync + 31 per-channel post.
    assert tiu_cost(_conv(0), CV183X) == 41 + (9 * 16 + 1) + 31
    assert tiu_cost(_conv(1), CV183X) == 41 + (9 * 8 + 1) + 31  # two channels a cycle
    add = ZeroFields(tsk_typ=3, tsk_eu_typ=2, res0_n=1, res0_c=32, res0_h=4, res0_w=4, opt_opd0_seg=1, opt_res0_seg=1,
                  res0_c_str=16)  # fmt: skip
    assert tiu_cost(add, CV183X) == 5 + 26 + 12  # int8 add latency, command latency, post
    assert tiu_cost({**add, "res0_c_str": 24}, CV183X) == int(5 * 30 / 16) + 26 + 12  # an unaligned write
    bf16_add = {**add, "opd_typ": 1, "opt_opd0_seg": 0, "opt_res0_seg": 0}
    assert tiu_cost(bf16_add, CV183X) == 2 * (7 + 1) + 26 + 12  # 8 EUs: two steps of 16 outputs


def test_tdma_formula_worked_by_hand():
    # a load of 1x32x4x4 int8, rows and channels contiguous: one run of 512 bytes (two bursts), 32 lanes x
    # one 16-byte row each in local memory; DDR time 512 B / (1886 MHz x 4 B) = 67.9 ns = 45 cycles at 650 MHz
    load = ZeroFields(trans_dir=0, src_fmt=1, dst_fmt=1, src_n=1, src_c=32, src_h=4, src_w=4, src_h_stride=4,
                   src_c_stride_low=16, src_n_stride=512, dst_c=32, dst_h=4, dst_w=4, dst_h_stride=4)  # fmt: skip
    assert tdma_cost(load, CV183X, b"", "x", 0) == int(np.ceil(512 * 1000 / (1886 * 4) * 650 / 1000))
    strided = {**load, "src_h_stride": 64, "src_c_stride_low": 256}  # rows 64 bytes apart: 128 runs of 4 bytes
    assert tdma_cost(strided, CV183X, b"", "x", 0) == int(np.ceil(128 * 64 * 1000 / (1886 * 4) * 650 / 1000))


def test_both_cost_models_price_the_vendor_files_and_npucs():
    tpu_mlir = read_cvimodel(TPU_MLIR_ONET)
    ours = read_cvimodel(build_smallcnn("cv183x")[0])
    for model in (tpu_mlir, ours):
        nominal, vendor = schedule_model(model, NOMINAL), schedule_model(model, VENDOR_COSTS)
        assert nominal.scheduled == schedule_model(model).scheduled  # the nominal model stays the default
        assert 0 < vendor.scheduled <= vendor.serial == vendor.tiu_busy + vendor.tdma_busy
        assert vendor.scheduled != nominal.scheduled  # a different model, not a copy


def _convs(data: bytes, chip: str) -> list[dict[str, int]]:
    model = read_cvimodel(data)
    found = []
    for section, body in model.cmdbufs().items():
        for ins in split_cmdbuf(body, CHIPS[chip], section):
            if ins.engine == isa.ENGINE_TIU and tiu_op_name(normalize_tiu_fields(ins.fields)) == "conv":
                found.append(ins.fields)
    return found


@pytest.mark.parametrize("chip", ["cv183x", "cv181x"])
def test_int8_convs_pair_channels_where_the_chip_allows(chip):
    convs = _convs(build_smallcnn(chip)[0], chip)
    assert convs
    for f in convs:
        pairs = f["opd0_c"] % 2 == 0 and f["opd0_c"] >= 4 and f["opd0_addr"] % 2 == 0 and f["opd1_addr"] % 2 == 0
        assert f["double_conv"] == int(pairs), f
    assert any(f["double_conv"] for f in convs)
    assert not any(f["double_conv"] for f in _convs(build_smallcnn(chip, "bf16")[0], chip))


def test_the_simulator_refuses_channel_pairs_the_chip_cannot_make():
    (first, *_) = _convs(build_smallcnn("cv183x")[0], "cv183x")
    assert first["opd0_c"] == 3  # the RGB input: odd
    lmem = LocalMemory.create(CV183X.lanes, CV183X.lmem_size)
    with pytest.raises(UnsupportedError, match="double_conv on a conv it cannot pair"):
        tiu_conv(TiuContext({**first, "double_conv": 1}, lmem, CV183X))
