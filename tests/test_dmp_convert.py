"""The DMP input convert policies: the conv v1 u8→fp16 table (6x256 bytes) of each named policy against its
formula, the network run from uint8 pixels, and the option errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npuc.backends.dmp.artifact import load_network
from npuc.backends.dmp.convert import TABLE_BYTES, input_convert, u8_table
from npuc.compiler.artifacts import ArtifactOptions, detect
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph
from npuc.compiler.ops import Conv2d
from npuc.compiler.targets import BuildRequest, get_target

PIXELS = np.arange(256, dtype=np.float64)
# the five policies of the DMP network API, written out independently of the implementation
FORMULAS = {
    "div_255": PIXELS / 255,
    "minus_128": PIXELS - 128,
    "minus_128_div_128": (PIXELS - 128) / 128,
    "minus_127_5_div_128": (PIXELS - 127.5) / 128,
    "direct": PIXELS,
}


@pytest.mark.parametrize("policy", sorted(FORMULAS))
def test_named_policy_table_matches_formula(policy: str) -> None:
    table = u8_table(input_convert({"convert": policy}), 3)
    assert len(table) == TABLE_BYTES == 6 * 256
    values = np.frombuffer(table, np.float16).reshape(3, 256)
    expected = FORMULAS[policy].astype(np.float16)
    for channel in range(3):
        assert np.array_equal(values[channel].view(np.uint16), expected.view(np.uint16)), channel


def test_table_spot_values() -> None:
    def entry(policy: str, i: int) -> float:
        return float(np.frombuffer(u8_table(input_convert({"convert": policy}), 3), np.float16)[i])

    assert entry("div_255", 255) == 1.0 and entry("div_255", 0) == 0.0
    assert entry("minus_128", 0) == -128.0 and entry("minus_128", 255) == 127.0
    assert entry("minus_128_div_128", 0) == -1.0 and entry("minus_128_div_128", 192) == 0.5
    assert entry("minus_127_5_div_128", 255) == float(np.float16(127.5 / 128))
    assert entry("direct", 200) == 200.0


def test_mean_scale_per_channel() -> None:
    convert = input_convert({"convert": "mean_scale", "mean": [123.675, 116.28, 103.53], "scale": 0.017})
    assert convert == {"policy": "mean_scale", "mean": [123.675, 116.28, 103.53], "scale": [0.017] * 3, "color": "rgb"}
    values = np.frombuffer(u8_table(convert, 3), np.float16).reshape(3, 256)
    mean = np.array([123.675, 116.28, 103.53]).reshape(3, 1)
    assert np.array_equal(values, ((PIXELS - mean) * 0.017).astype(np.float16))


def _graph() -> Graph:
    g = Graph("t")
    g.add_tensor("x", (1, 3, 6, 5))
    g.inputs = ["x"]
    g.add_const("w", np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32))
    g.add_op("conv2d", ["x", "w"], ["y"], Conv2d(pads=(1, 1, 1, 1)))
    g.outputs = ["y"]
    return g


@pytest.mark.parametrize("policy", sorted(FORMULAS))
def test_uint8_network_equals_float_network_on_converted_pixels(tmp_path: Path, policy: str) -> None:
    """The u8 build fed pixels gives exactly the fp16 build fed the formula's values."""
    get_target("dmp").build(BuildRequest(_graph(), Path("t.onnx"), tmp_path / "u8", options={"convert": policy}))
    get_target("dmp").build(BuildRequest(_graph(), Path("t.onnx"), tmp_path / "f16"))
    img = np.random.default_rng(1).integers(0, 256, (1, 3, 6, 5)).astype(np.uint8)
    as_float = FORMULAS[policy][img].astype(np.float16).astype(np.float32)
    kind = detect(tmp_path / "u8")
    assert kind.inputs(tmp_path / "u8", ArtifactOptions())[0].dtype == "uint8"
    a = kind.run(tmp_path / "u8", {"x": img}, ArtifactOptions())["y"]
    b = kind.run(tmp_path / "f16", {"x": as_float}, ArtifactOptions())["y"]
    assert np.array_equal(a, b)
    net, blob = load_network(tmp_path / "u8")
    offs = net.layers[0].conv.u8tofp16_offs
    assert offs == len(blob) - TABLE_BYTES and offs % 16 == 0
    assert net.weights_size == len(blob) and net.input_convert["policy"] == policy
    cpp = (tmp_path / "u8" / "t_gen.cpp").read_text()
    assert f"conf_v1.u8tofp16_table.offs = {offs};" in cpp and "conf_v1.u8tofp16_table.mem = weights_mem_;" in cpp


def test_bgr_swaps_channels(tmp_path: Path) -> None:
    opts = {"convert": "mean_scale", "mean": [10.0, 20.0, 30.0], "scale": 0.5, "color": "bgr"}
    get_target("dmp").build(BuildRequest(_graph(), Path("t.onnx"), tmp_path / "bgr", options=opts))
    get_target("dmp").build(BuildRequest(_graph(), Path("t.onnx"), tmp_path / "f16"))
    net, _ = load_network(tmp_path / "bgr")
    assert net.layers[0].conv.to_bgr == 1
    img = np.random.default_rng(2).integers(0, 256, (1, 3, 6, 5)).astype(np.uint8)
    # channel c of the converted image is table row c applied to pixel channel 2 - c
    expected = ((img[:, ::-1].astype(np.float64) - np.array([10.0, 20.0, 30.0]).reshape(1, 3, 1, 1)) * 0.5).astype(
        np.float16
    )
    kind = detect(tmp_path / "bgr")
    a = kind.run(tmp_path / "bgr", {"x": img}, ArtifactOptions())["y"]
    b = kind.run(tmp_path / "f16", {"x": expected.astype(np.float32)}, ArtifactOptions())["y"]
    assert np.array_equal(a, b)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"convert": "div_256"}, "convert='div_256' is not a DMP convert policy"),
        ({"convert": "div_255", "mean": 3}, "option mean only applies to convert=mean_scale"),
        ({"convert": "mean_scale", "mean": [1, 2]}, "give one number or three"),
        ({"convert": "mean_scale", "scale": "x"}, "give one number or three"),
        ({"color": "bgr"}, "color=bgr needs a uint8 convert policy"),
        ({"convert": "direct", "color": "yuv"}, "color='yuv' must be rgb or bgr"),
        ({"convert": "direct", "input_convert": "div_255"}, "disagree"),
    ],
)
def test_option_errors(options: dict, match: str) -> None:
    with pytest.raises(UserError, match=match):
        input_convert(options)


def test_more_than_three_channels_rejected(tmp_path: Path) -> None:
    g = Graph("t")
    g.add_tensor("x", (1, 4, 6, 5))
    g.inputs = ["x"]
    g.add_const("w", np.ones((8, 4, 1, 1), np.float32))
    g.add_op("conv2d", ["x", "w"], ["y"], Conv2d())
    g.outputs = ["y"]
    with pytest.raises(UserError, match="at most 3 channels; this input has 4"):
        get_target("dmp").build(BuildRequest(g, Path("t.onnx"), tmp_path / "o", options={"convert": "div_255"}))
    assert not (tmp_path / "o").exists()


def test_cli_option(tmp_path: Path) -> None:
    """`npuc build ... --option convert=minus_128_div_128` reaches the target; a bad policy exits with 2."""
    from npuc.cli.app import main
    from npuc.models.make_models import make_all

    model = make_all(tmp_path / "models", ["tinycnn"])["tinycnn"]
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as info:
        main(["build", str(model), "--target", "dmp", "-o", str(out), "--option", "convert=minus_128_div_128"])
    assert info.value.code == 0
    net, blob = load_network(out)
    values = np.frombuffer(blob[net.layers[0].conv.u8tofp16_offs :], np.float16).reshape(3, 256)
    assert np.array_equal(values[1], FORMULAS["minus_128_div_128"].astype(np.float16))
    with pytest.raises(SystemExit) as info:
        main(["build", str(model), "--target", "dmp", "-o", str(tmp_path / "bad"), "--option", "convert=div_256"])
    assert info.value.code == 2 and not (tmp_path / "bad").exists()


MEAN = np.array([123.675, 116.28, 103.53]).reshape(3, 1)
CLI_CASES = [
    (["--convert", "minus_127_5_div_128"], np.broadcast_to(FORMULAS["minus_127_5_div_128"], (3, 256)), 0),
    (["--convert", "div_255", "--color", "bgr"], np.broadcast_to(FORMULAS["div_255"], (3, 256)), 1),
    (["--convert", "direct", "--color", "rgb"], np.broadcast_to(FORMULAS["direct"], (3, 256)), 0),
    (["--mean", "123.675,116.28,103.53", "--scale", "0.017"], (PIXELS - MEAN) * 0.017, 0),
    (
        ["--convert", "mean_scale", "--mean", "127.5", "--scale", "0.0078125"],
        np.tile((PIXELS - 127.5) / 128, (3, 1)),
        0,
    ),
    # --input-dtype uint8, as on cv18xx: the camera's pixels in, --mean/--scale/--color applied by the table
    (["--input-dtype", "uint8", "--mean", "127.5", "--scale", "0.0078125", "--color", "bgr"],
     np.tile((PIXELS - 127.5) / 128, (3, 1)), 1),
    (["--input-dtype", "uint8"], np.broadcast_to(FORMULAS["direct"], (3, 256)), 0),
]  # fmt: skip
CLI_IDS = ["named", "bgr", "direct", "mean_scale", "one_mean", "uint8_mean_scale", "uint8"]


@pytest.mark.parametrize("args,rows,to_bgr", CLI_CASES, ids=CLI_IDS)
def test_cli_flags_fill_the_u8_table(tmp_path: Path, args: list[str], rows: np.ndarray, to_bgr: int) -> None:
    """`npuc build --target dmp --mean/--scale/--color/--convert`: the conv v1 table is the policy's formula."""
    from npuc.cli.app import main
    from npuc.models.make_models import make_all

    model = make_all(tmp_path / "models", ["tinycnn"])["tinycnn"]
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as info:
        main(["build", str(model), "--target", "dmp", "-o", str(out), "--name", "Net", *args])
    assert info.value.code == 0
    net, blob = load_network(out)
    conf = net.layers[0].conv
    table = blob[conf.u8tofp16_offs :]
    assert len(table) == 6 * 256 and conf.to_bgr == to_bgr
    assert table == np.ascontiguousarray(rows.astype(np.float16)).tobytes()
    cpp = (out / "Net_gen.cpp").read_text()
    assert f"conf_v1.u8tofp16_table.offs = {conf.u8tofp16_offs};" in cpp and f"conf_v1.to_bgr = {to_bgr};" in cpp


@pytest.mark.parametrize(
    "args",
    [["--mean", "1,x"], ["--convert", "div_255", "--mean", "3"], ["--color", "bgr"], ["--convert", "div_256"],
     ["--input-dtype", "uint8", "--convert", "none"], ["--input-dtype", "int8"]],
)  # fmt: skip
def test_cli_flag_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    from npuc.cli.app import main
    from npuc.models.make_models import make_all

    model = make_all(tmp_path / "models", ["tinycnn"])["tinycnn"]
    with pytest.raises(SystemExit) as info:
        main(["build", str(model), "--target", "dmp", "-o", str(tmp_path / "bad"), *args])
    assert info.value.code == 2 and not (tmp_path / "bad").exists()
