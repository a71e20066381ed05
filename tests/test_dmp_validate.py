"""The DV700 driver's validation rules (spec §1.7; CheckRaw_v0 and the kernel driver's UBUF check): one case
per rule, each asserting the exact message fragment, plus the unified-buffer arithmetic by hand-worked numbers."""

from __future__ import annotations

import pytest

from npuc.backends.dmp.layers import ConvConf, Layer, Run, pack2, pack4
from npuc.backends.dmp.ubuf import Tiles, run_tiles, single_tile_usage
from npuc.backends.dmp.validate import Hardware, check_layer, hardware_from_options
from npuc.compiler.errors import UserError

OLD = Hardware(svn_version=92)  # a bitstream before non-square pooling / deconvolution


def _layer(runs: list[Run], c: int = 16, w: int = 8, h: int = 8, topo: int | None = None, **conf: int) -> Layer:
    cc = ConvConf(w=w, h=h, c=c, runs=runs, topo=topo if topo is not None else 1 << (len(runs) - 1), **conf)
    return Layer("probe", "LT_CONV", 0, 0, 0, [w, h, c], [w, h, c], conv=cc)


def _conv(**kw: int) -> Run:
    return Run(**{"m": 16, "conv_enable": 1, "p": 3, "conv_pad": pack4(1, 1, 1, 1), **kw})


def _dil(**kw: int) -> Run:
    return _conv(conv_dilation=pack2(2, 2), conv_pad=pack4(2, 2, 2, 2), **kw)


def _pool(mode: int, kw: int, kh: int, **more: int) -> Run:
    return Run(**{"m": 16, "pool_enable": mode, "pool_size": pack2(kw, kh), "pool_stride": pack2(kw, kh), **more})


def _aligned_layer() -> Layer:
    layer = _layer([_conv()])
    layer.input_offs = 8
    return layer


_ROW = Hardware()
# (rule, layer, hardware, exact message fragment)
RULES = [
    ("topo_zero", _layer([_conv()], topo=0), _ROW, "topo is 0, so no run writes anything"),
    ("z_zero", _layer([_conv()], z=0), _ROW, "z: input depth z is 0"),
    ("topo_runs", _layer([_conv(), _conv()], topo=1), _ROW, "topo 0x1 does not match its 2 runs"),
    ("width_limit", _layer([_conv()], w=4000), _ROW, "w: input w = 4000 exceeds the DV700 limit 2047"),
    ("no_operation", _layer([Run(m=16)]), _ROW, "does nothing (no conv, pool, activation or LRN)"),
    ("kernel_size", _layer([_conv(p=9)]), _ROW, "p: kernel 9x9 is outside 1..7"),
    ("conv_stride", _layer([_conv(conv_stride=pack2(0, 1))]), _ROW, "conv_stride: stride 0x1 must be at least 1"),
    ("pz_zero", _layer([_conv(pz=0)]), _ROW, "pz: kernel depth must be non-zero"),
    (
        "conv_fits",
        _layer([_conv(p=7, conv_pad=0)], w=4, h=4),
        _ROW,
        "conv_pad: padded input 4x4 is smaller than the 7x7",
    ),
    (
        "pad_bits",
        _layer([_conv(conv_pad=pack4(130, 1, 1, 1))], w=200),
        _ROW,
        "conv_pad: left 130 / top 1 exceed the 7-bit",
    ),
    (
        "depthwise",
        _layer([_conv(conv_enable=3, m=8)]),
        _ROW,
        "m: depthwise conv needs as many outputs as inputs (m=8, c=16)",
    ),
    ("pool_mode", _layer([_pool(3, 2, 2)]), _ROW, "pool_enable=3 is not 0 (off), 1 (max), 2 (average) or 4"),
    (
        "pool_with_conv",
        _layer([_conv(pool_enable=2, pool_size=0x202)]),
        _ROW,
        "pool_enable: average pooling and upsampling",
    ),
    ("max_pool_size", _layer([_pool(1, 4, 4)]), _ROW, "pool_size: max pool 4x4 is not one of 2x1, 2x2"),
    ("avg_pool_size", _layer([_pool(2, 8, 8)]), _ROW, "pool_size: average pool 8x8 is outside 1..7"),
    (
        "pool_stride",
        _layer([_pool(1, 2, 2, pool_stride=pack2(0, 2))]),
        _ROW,
        "pool_stride: stride 0x2 must be at least 1",
    ),
    ("pool_fits", _layer([_pool(2, 2, 2)], w=1, h=1), _ROW, "pool_pad: padded input 1x1 is smaller than the 2x2 pool"),
    (
        "non_square_pool",
        _layer([_pool(1, 2, 3)]),
        OLD,
        "pool_size: non-square pooling 2x3 needs svn_version >= 93 (device has 92)",
    ),
    ("deconv_svn", _layer([_conv(conv_enable=5)]), OLD, "conv_enable=5: deconvolution needs svn_version >= 93"),
    (
        "dilated_deconv",
        _layer([_dil(conv_enable=5, conv_stride=0x202)]),
        _ROW,
        "conv_stride: a dilated deconvolution needs stride 1",
    ),
    ("lrn_channels", _layer([Run(m=12, lrn=1)], c=12), _ROW, "lrn: LRN needs a multiple of 16 channels, got 12"),
    ("lrn_alone", _layer([Run(m=16, lrn=1, pool_enable=1, pool_size=0x202)]), _ROW, "lrn: LRN must be a standalone"),
    (
        "dilated_alone",
        _layer([_dil(), Run(m=16, actfunc=2)]),
        _ROW,
        "conv_dilation: a dilated conv must be the only run",
    ),
    (
        "dilated_pool",
        _layer([_dil(pool_enable=1, pool_size=0x202)]),
        _ROW,
        "conv_dilation: a dilated conv cannot be fused",
    ),
    ("dilated_odd", _layer([_dil(p=4)]), _ROW, "p: a dilated conv needs an odd kernel, got 4x4"),
    ("dilated_fits", _layer([_conv(conv_dilation=0x303)], w=4, h=4), _ROW, "smaller than the dilated 7x7 kernel"),
    (
        "dilated_pads",
        _layer([_conv(conv_dilation=0x303, conv_pad=pack4(3, 3, 3, 3))], w=2),
        OLD,
        "conv_pad: pads l3 r3 t3 b3 exceed the 2x8 input",
    ),
    ("dilated_same", _layer([_conv(conv_dilation=0x202)]), _ROW, "conv_pad: a dilated conv needs 'same' padding"),
    ("dilated_prelu", _layer([_dil(actfunc=4)]), _ROW, "actfunc: a dilated conv cannot use PReLU"),
    (
        "quantized_prelu",
        _layer([_conv(weight_fmt=3, actfunc=4)]),
        _ROW,
        "weight_fmt: 8-bit quantized weights cannot be combined with PReLU",
    ),
    (
        "ubuf_no_fit",
        _layer([_conv(m=64)], w=8, h=1024, c=64),
        Hardware(ub_size=65536),
        "ub_size: 8x1024x64 input does not fit the 65536-byte unified buffer even in 8 tiles",
    ),
    (
        "ubuf_one_tile",
        _layer([_conv(m=128), _pool(1, 2, 2, m=128)], w=64, h=64, c=128),
        _ROW,
        "topo: the output stays in the unified buffer but the run needs 2 tiles",
    ),
    ("alignment", _aligned_layer(), _ROW, "input_buf.offs = 8 is not 16-byte aligned"),
    (
        "multi_run_depth",
        _layer([_conv(), _conv()], z=2),
        _ROW,
        "a command with depth (z=2 or pz > 1) cannot have multiple runs",
    ),
    (
        "ubuf_peak",
        _layer([_conv(p=1, conv_pad=0), _conv()]),
        Hardware(ub_size=4096),
        "ub_size: its 2 runs need 4608 bytes of unified buffer in one tile, more than the 4096",
    ),
    ("branch_sizes", _layer([_conv(conv_stride=0x202), _conv()], topo=3), _ROW, "its branches end in different sizes"),
    ("branch_channels", _layer([_conv(m=4), _conv()], topo=3), _ROW, "branch channels [4, 16] are not multiples of 8"),
]


@pytest.mark.parametrize("rule,layer,hw,fragment", RULES, ids=[r[0] for r in RULES])
def test_rule_rejects(rule: str, layer: Layer, hw: Hardware, fragment: str) -> None:
    with pytest.raises(UserError) as info:
        check_layer(3, layer, hw)
    message = str(info.value)
    assert fragment in message
    assert message.startswith("DMP layer 3 'probe'")


def test_each_rule_case_is_distinct() -> None:
    assert len({r[0] for r in RULES}) == len(RULES) == 37
    assert len({r[3] for r in RULES}) == len(RULES)


@pytest.mark.parametrize(
    "layer,hw",
    [
        (_layer([_conv(pool_enable=1, pool_size=0x202, pool_stride=0x202, actfunc=2)]), Hardware()),
        (_layer([_pool(1, 2, 3)]), Hardware()),  # non-square pooling is fine from svn 93
        (_layer([_conv(conv_enable=5)]), Hardware()),  # deconvolution too
        (_layer([_conv(conv_dilation=0x303, conv_pad=pack4(3, 3, 3, 3))], w=2), Hardware()),  # pads > input at 93
        (_layer([_conv(conv_dilation=0x202, conv_pad=pack4(1, 3, 2, 2))]), Hardware()),  # asymmetric 'same' is ok
        (_layer([Run(m=16, lrn=1)]), Hardware()),
        (_layer([_conv(p=1, conv_pad=0), _conv()]), Hardware(ub_size=8192)),  # the same two runs fit 8 KB
        (_layer([_conv(m=64)], w=8, h=1024, c=64), Hardware()),  # and the tall input fits 640 KB
    ],
)
def test_rule_accepts(layer: Layer, hw: Hardware) -> None:
    check_layer(0, layer, hw)


def test_tile_counts() -> None:
    """Hand-worked: lines of an 8-channel block raised to 2 mod 16, all blocks rounded up to 16 lines."""
    same3 = pack4(1, 1, 1, 1)
    # 64x64x128 3x3: one tile would need (66*64*8/8 -> 4226 lines) * 16 blocks * 16 B > 640 KB; two fit
    assert run_tiles(Run(m=128, conv_enable=1, p=3, conv_pad=same3), (64, 64, 128), 655360) == Tiles(2, 557568, 34816)
    assert run_tiles(Run(m=64, conv_enable=1, p=3, conv_pad=same3), (224, 224, 64), 655360).count == 13
    assert run_tiles(Run(m=16, conv_enable=1, p=1), (8, 8, 16), 4096) == Tiles(1, 2304, 1024)
    assert run_tiles(Run(m=8, conv_enable=1, p=3), (100, 100, 8), 4096) == Tiles(1, 0, 0)  # c, m <= 8 stream
    assert run_tiles(Run(m=16, conv_enable=1, p=3), (100, 100, 8), 4096).out_bytes == 0  # c <= 8: no out buffer
    assert run_tiles(Run(m=16, pool_enable=1, pool_size=0x202), (2047, 1024, 64), 4096) == Tiles(1, 0, 0)


def test_single_tile_usage() -> None:
    one = Run(m=16, conv_enable=1, p=1)
    three = Run(m=16, conv_enable=1, p=3, conv_pad=pack4(1, 1, 1, 1))
    # a chain: 2304 B of input + the 1x1 output's 144 lines kept whole (2304 B), ping-pong
    assert single_tile_usage(ConvConf(8, 8, 16, [one, three], topo=0b10), 655360) == 4608
    # two branches: input 2304 B, then each 8-channel output block of 66 lines (1056 B) after it
    halves = [Run(m=8, conv_enable=1, p=1), Run(m=8, conv_enable=1, p=1)]
    assert single_tile_usage(ConvConf(8, 8, 16, halves, topo=0b11), 655360) == 3360


@pytest.mark.parametrize(
    "options,expected",
    [({}, Hardware()), ({"ub_size": 524288, "svn_version": 83}, Hardware(ub_size=524288, svn_version=83))],
)
def test_hardware_options(options: dict, expected: Hardware) -> None:
    assert hardware_from_options(options) == expected


def test_hardware_option_errors() -> None:
    with pytest.raises(UserError, match=r"option ub_size='big': give an integer in 1024\.\.16777216"):
        hardware_from_options({"ub_size": "big"})
    with pytest.raises(UserError, match="option svn_version=-1"):
        hardware_from_options({"svn_version": -1})
