"""hb_mapper YAML configs: what npuc honours, what it ignores (one line each), and every documented error."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml

from npuc.compiler.errors import UserError
from npuc.frontends.hbconfig import load_config, parse_config

SOURCE = Path("/cfg/model.yaml")

BASE = {
    "model_parameters": {
        "onnx_model": "m.onnx",
        "march": "bernoulli2",
        "output_model_file_prefix": "net",
        "layer_out_dump": False,
    },
    "input_parameters": {
        "input_name": "x",
        "input_type_train": "rgb",
        "input_layout_train": "NCHW",
        "input_type_rt": "nv12",
        "input_shape": "1x3x224x224",
        "norm_type": "data_mean_and_scale",
        "mean_value": "123.675 116.28 103.53",
        "scale_value": "0.0171 0.0175 0.0174",
    },
    "calibration_parameters": {"cal_data_dir": "cal", "calibration_type": "default"},
    "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
}


def config(**changes) -> dict:
    """BASE with `group__key=value` changes (value None deletes the key)."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        group, key = dotted.split("__")
        if value is None:
            data[group].pop(key, None)
        else:
            data[group][key] = value
    return data


def test_base_config_maps_what_npuc_honours():
    cfg = parse_config(config(), SOURCE)
    assert cfg.model == Path("/cfg/m.onnx")
    assert cfg.working_dir == Path("/cfg/model_output")  # hb_mapper's default working_dir
    assert cfg.output_prefix == "net" and cfg.march == "bernoulli2"
    assert cfg.cal_data_dir == Path("/cfg/cal")
    assert cfg.calib_method == ("kl", 99.99)
    (inp,) = cfg.inputs
    assert (inp.name, inp.type_train, inp.layout_train, inp.type_rt, inp.space) == (
        "x",
        "rgb",
        "NCHW",
        "nv12",
        "regular",
    )
    assert inp.shape == (1, 3, 224, 224)
    assert inp.mean == (123.675, 116.28, 103.53) and inp.scale == (0.0171, 0.0175, 0.0174)
    assert cfg.input_shapes() == {"x": (1, 3, 224, 224)}
    assert cfg.ignored == (
        "model_parameters.layer_out_dump: per-layer dumps: use `npuc compare` instead, ignored",
        "compiler_parameters.compile_mode: npuc writes no .bin (Horizon's compiler makes it), ignored",
        "compiler_parameters.optimize_level: npuc writes no .bin (Horizon's compiler makes it), ignored",
    )


def test_hz_preprocess_of_the_config_input():
    (inp,) = parse_config(config(), SOURCE).inputs
    affine = inp.affine()
    assert affine.weight.shape == (3, 3)
    grey = np.zeros((1, 1, 3), np.int8)  # u8 128 everywhere: Y=128, U=V=128 -> rgb 128
    expected = (128 - np.array([123.675, 116.28, 103.53])) * np.array([0.0171, 0.0175, 0.0174])
    np.testing.assert_allclose(affine.apply(grey).ravel(), expected, atol=1e-6)


@pytest.mark.parametrize(
    ("ctype", "extra", "method"),
    [
        ("default", {}, ("kl", 99.99)),
        ("kl", {}, ("kl", 99.99)),
        ("max", {}, ("max", 99.99)),
        ("max", {"calibration_parameters__max_percentile": 0.99999}, ("percentile", pytest.approx(99.999))),
        ("max", {"calibration_parameters__max_percentile": 1}, ("max", 99.99)),
    ],
)
def test_calibration_type_mapping(ctype, extra, method):
    cfg = parse_config(config(calibration_parameters__calibration_type=ctype, **extra), SOURCE)
    assert cfg.calib_method == method


def test_mix_is_noted_and_runs_as_default():
    cfg = parse_config(config(calibration_parameters__calibration_type="mix"), SOURCE)
    assert cfg.calib_method == ("kl", 99.99)
    assert "calibration_parameters.calibration_type: mix search is not implemented" in "\n".join(cfg.ignored)


def test_per_channel_is_honoured_not_ignored():
    on = parse_config(config(calibration_parameters__calibration_type="kl", calibration_parameters__per_channel=True),
                      SOURCE)  # fmt: skip
    assert on.per_channel and not any("per_channel" in line for line in on.ignored)
    off = parse_config(config(calibration_parameters__per_channel=False), SOURCE)
    assert not off.per_channel and not any("per_channel" in line for line in off.ignored)


def test_unknown_keys_and_groups_are_reported_one_line_each():
    data = config(input_parameters__colour="rgb", compiler_parameters__core_num=2)
    data["extra_group"] = {"a": 1}
    data["custom_op"] = {"custom_op_method": "register", "op_register_files": "x.py"}
    lines = parse_config(data, SOURCE).ignored
    assert "extra_group: unknown group, ignored" in lines
    assert "input_parameters.colour: unknown key, ignored" in lines
    assert "compiler_parameters.core_num: npuc writes no .bin (Horizon's compiler makes it), ignored" in lines
    assert "custom_op.op_register_files: custom operators are not supported by npuc, ignored" in lines


def test_multi_input_values_follow_input_name_order():
    cfg = parse_config(
        config(
            input_parameters__input_name="a;b",
            input_parameters__input_type_train="rgb;featuremap",
            input_parameters__input_layout_train="NCHW;NCHW",
            input_parameters__input_type_rt="rgb;featuremap",
            input_parameters__input_shape="1x3x8x8;1x10",
            input_parameters__norm_type="data_mean_and_scale;no_preprocess",
            input_parameters__mean_value="128;None",
            input_parameters__scale_value="0.5;None",
        ),
        SOURCE,
    )
    a, b = cfg.inputs
    assert (a.name, a.type_rt, a.mean, a.shape) == ("a", "rgb", (128.0,), (1, 3, 8, 8))
    assert (b.name, b.type_rt, b.mean, b.shape, b.affine()) == ("b", "featuremap", None, (1, 10), None)


def test_bind_fills_name_and_shape_from_the_model():
    cfg = parse_config(config(input_parameters__input_name=None, input_parameters__input_shape=None), SOURCE)
    bound = cfg.bind({"image": (1, 3, 32, 64)})
    assert (bound.inputs[0].name, bound.inputs[0].shape) == ("image", (1, 3, 32, 64))


def test_load_config_reads_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config()))
    cfg = load_config(path)
    assert cfg.model == tmp_path / "m.onnx" and cfg.inputs[0].name == "x"


# ---- every documented validation error ------------------------------------------------------------------

ERRORS = [
    # groups and model_parameters
    ({"__drop_group": "compiler_parameters"}, "compiler_parameters: group is missing"),
    ({"model_parameters__onnx_model": None}, r"model_parameters.onnx_model: is required"),
    ({"model_parameters__caffe_model": "m.caffemodel"}, "both onnx_model and caffe_model are set"),
    (
        {"model_parameters__onnx_model": None, "model_parameters__caffe_model": "m.caffemodel"},
        "model_parameters.prototxt: caffe_model needs prototxt",
    ),
    (
        {"model_parameters__onnx_model": None, "model_parameters__caffe_model": "m", "model_parameters__prototxt": "p"},
        "Caffe models are not supported by npuc",
    ),
    ({"model_parameters__march": None}, r"model_parameters.march: is required"),
    (
        {"model_parameters__march": "nash-e"},
        r"model_parameters.march = 'nash-e' is not one of bernoulli2, bayes, bayes-e",
    ),
    ({"model_parameters__output_model_file_prefix": None}, "output_model_file_prefix: is required"),
    ({"model_parameters__layer_out_dump": "yes"}, r"layer_out_dump = 'yes' is not a boolean"),
    ({"model_parameters__remove_node_type": "Quantize;Softmax"}, r"remove_node_type: 'Softmax' is not allowed"),
    (
        {"model_parameters__debug_mode": "dump_all"},
        r"debug_mode = 'dump_all' is not one of dump_calibration_data",
    ),
    (
        {"model_parameters__node_info": {"conv1": {"ON": "CPU"}}},
        "node_info: is for marches bayes, bayes-e, not bernoulli2",
    ),
    ({"model_parameters__set_node_data_type": "int16"}, "set_node_data_type: is for marches bayes, bayes-e"),
    # input_parameters
    ({"input_parameters__input_type_train": None}, r"input_parameters.input_type_train: is required"),
    ({"input_parameters__input_type_train": "nv12"}, r"input_type_train: 'nv12' is not allowed"),
    ({"input_parameters__input_layout_train": None}, r"input_parameters.input_layout_train: is required"),
    (
        {"input_parameters__input_layout_train": "CHW"},
        r"input_layout_train: 'CHW' is not allowed; use one of NHWC, NCHW",
    ),
    ({"input_parameters__input_type_rt": None}, r"input_parameters.input_type_rt: is required"),
    ({"input_parameters__input_type_rt": "yuv420"}, r"input_type_rt: 'yuv420' is not allowed"),
    ({"input_parameters__input_type_train": "gray"}, "nv12 cannot feed input_type_train gray; allowed for gray: gray"),
    (
        {"input_parameters__input_type_train": "yuv444", "input_parameters__input_type_rt": "rgb"},
        "rgb cannot feed input_type_train yuv444; allowed for yuv444: nv12, yuv444",
    ),
    (
        {"input_parameters__input_type_train": "featuremap", "input_parameters__input_type_rt": "rgb"},
        "rgb cannot feed input_type_train featuremap",
    ),
    ({"input_parameters__input_layout_rt": "HWC"}, r"input_layout_rt: 'HWC' is not allowed"),
    (
        {"input_parameters__input_type_rt": "yuv444", "input_parameters__input_layout_rt": "NCHW"},
        "X3 \\(bernoulli2\\) does not take yuv444 as NCHW",
    ),
    ({"input_parameters__input_space_and_range": "full"}, r"input_space_and_range: 'full' is not allowed"),
    (
        {"input_parameters__input_type_rt": "rgb", "input_parameters__input_space_and_range": "bt601_video"},
        "input_space_and_range: applies to nv12 only, not rgb",
    ),
    ({"input_parameters__input_shape": "1x3x224"}, None),  # a valid 3-D shape parses (checked against the model later)
    ({"input_parameters__input_shape": "1,3,224,224"}, r"input_shape: '1,3,224,224' is not a shape"),
    ({"input_parameters__input_shape": "1x0x224x224"}, r"input_shape: '1x0x224x224' is not a shape"),
    ({"input_parameters__input_batch": 0}, r"input_batch = 0 breaks minimum 1"),
    ({"input_parameters__input_batch": 129}, r"input_batch = 129 breaks maximum 128"),
    ({"input_parameters__norm_type": None}, r"norm_type: is required"),
    ({"input_parameters__norm_type": "mean_std"}, r"norm_type: 'mean_std' is not allowed"),
    ({"input_parameters__mean_value": None}, "mean_value: is required by norm_type data_mean_and_scale"),
    ({"input_parameters__scale_value": None}, "scale_value: is required by norm_type data_mean_and_scale"),
    ({"input_parameters__mean_value": "1 2"}, "mean_value: has 2 values for a 3-channel rgb input; give 1 or 3"),
    ({"input_parameters__scale_value": "a b c"}, r"scale_value: 'a b c' is not a list of numbers"),
    ({"input_parameters__input_name": "a;b"}, "input_type_train: has 1 ';'-separated value\\(s\\) for 2 input\\(s\\)"),
    # calibration_parameters
    (
        {"calibration_parameters__calibration_type": "percentile"},
        r"calibration_type = 'percentile' is not one of default, mix, kl, max, load, skip",
    ),
    ({"calibration_parameters__calibration_type": "load"}, "load \\(a QAT model's ranges\\) is not supported"),
    ({"calibration_parameters__calibration_type": "skip"}, "skip \\(random data, for speed tests\\) is not supported"),
    ({"calibration_parameters__max_percentile": 0.9}, "max_percentile: applies to calibration_type max only"),
    (
        {"calibration_parameters__calibration_type": "max", "calibration_parameters__max_percentile": 1.5},
        r"max_percentile = 1.5 breaks maximum 1",
    ),
    (
        {"calibration_parameters__cal_data_type": "int8"},
        r"cal_data_type = 'int8' is not one of float32, uint8",
    ),
    ({"calibration_parameters__preprocess_on": "maybe"}, "preprocess_on = 'maybe' is not a boolean"),
    ({"calibration_parameters__per_channel": True}, "per_channel: is not available with calibration_type default"),
    (
        {"calibration_parameters__optimization": "set_model_output_int16"},
        r"optimization: 'set_model_output_int16' is not allowed; use one of set_model_output_int8",
    ),
    # compiler_parameters
    ({"compiler_parameters__compile_mode": None}, r"compile_mode: is required"),
    (
        {"compiler_parameters__compile_mode": "fast"},
        r"compile_mode = 'fast' is not one of latency, bandwidth",
    ),
    ({"compiler_parameters__optimize_level": None}, r"optimize_level: is required"),
    ({"compiler_parameters__optimize_level": "O4"}, r"optimize_level = 'O4' is not one of O0, O1, O2, O3"),
    ({"compiler_parameters__debug": "on"}, "debug = 'on' is not a boolean"),
    ({"compiler_parameters__core_num": 3}, "core_num = 3 is not one of 1, 2"),
    (
        {"compiler_parameters__input_source": {"x": "camera"}},
        r"input_source.x = 'camera' is not one of ddr, pyramid, resizer",
    ),
    ({"compiler_parameters__input_source": {"y": "ddr"}}, r"input_source.y: is not an input_name"),
    ({"compiler_parameters__input_source": {"x": "resizer"}}, "resizer needs h\\*w < 18432, got 224x224"),
    ({"compiler_parameters__max_time_per_fc": 500}, r"max_time_per_fc = 500 is not 0 or an integer 1000"),
    ({"compiler_parameters__max_time_per_fc": 1 << 32}, r"max_time_per_fc = 4294967296 is not 0 or an integer 1000"),
    ({"compiler_parameters__jobs": 0}, "jobs = 0 breaks minimum 1"),
]


@pytest.mark.parametrize(("changes", "message"), ERRORS, ids=[m or "valid" for _, m in ERRORS])
def test_documented_validation_errors(changes, message):
    changes = dict(changes)
    drop = changes.pop("__drop_group", None)
    data = config(**changes)
    if drop:
        del data[drop]
    if message is None:
        assert parse_config(data, SOURCE).inputs[0].shape == (1, 3, 224)
        return
    with pytest.raises(UserError, match=message) as info:
        parse_config(data, SOURCE)
    assert str(info.value).startswith("/cfg/model.yaml: ") and "\n" not in str(info.value)


def test_bayes_allows_node_info_and_int16_output_but_not_core_num():
    data = config(model_parameters__march="bayes", model_parameters__node_info={"c": {"ON": "CPU"}})
    data["calibration_parameters"]["optimization"] = "set_model_output_int16"
    assert parse_config(data, SOURCE).march == "bayes"
    with pytest.raises(UserError, match="core_num: must not be set for march bayes"):
        parse_config(config(model_parameters__march="bayes", compiler_parameters__core_num=1), SOURCE)


def test_valid_optional_values_pass():
    data = config(
        compiler_parameters__max_time_per_fc=1000,
        compiler_parameters__core_num=2,
        compiler_parameters__input_source={"x": "pyramid"},
        compiler_parameters__jobs=4,
        input_parameters__input_space_and_range="bt601_video",
        calibration_parameters__cal_data_type="uint8",
        model_parameters__remove_node_type="Quantize;Dequantize",
    )
    cfg = parse_config(data, SOURCE)
    assert cfg.inputs[0].space == "bt601_video"


@pytest.mark.parametrize(
    ("model_shape", "message"),
    [
        ((1, 224, 224, 3), "NCHW puts 224 channels on input 'x'"),
        ((1, 3, 223, 224), "input 'x': input_type_rt nv12 needs even height and width, got 223x224"),
        ((1, 3, 224), "input 'x' has shape \\(1, 3, 224\\), not 4-D"),
    ],
)
def test_bind_checks_the_model(model_shape, message):
    cfg = parse_config(config(input_parameters__input_shape=None), SOURCE)
    with pytest.raises(UserError, match=message):
        cfg.bind({"x": model_shape})


def test_bind_checks_input_count_and_names():
    cfg = parse_config(config(), SOURCE)
    with pytest.raises(UserError, match="describes 1 input\\(s\\) but the model has 2"):
        cfg.bind({"x": (1, 3, 4, 4), "y": (1, 3, 4, 4)})
    with pytest.raises(UserError, match="'x' is not a model input"):
        cfg.bind({"image": (1, 3, 4, 4)})


def test_yaml_syntax_and_shape_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_parameters:\n  onnx_model: [unclosed\n")
    with pytest.raises(UserError, match="bad.yaml: line \\d+: invalid YAML"):
        load_config(bad)
    # bench/fuzz.py --seed 10, hb_yaml: a control byte in the file made pyyaml's report (and the message) two lines
    for byte in (b"\x00", b"\x08", b"\x1a", b"\x7f"):
        bad.write_bytes(b"model_parameters:\n  onnx_model: m" + byte + b".onnx\n")
        with pytest.raises(UserError) as info:
            load_config(bad)
        message = str(info.value)
        assert message.splitlines() == [message], message
        assert f"bad.yaml: line 2: invalid YAML (character #x{byte[0]:04x} is not allowed" in message, message
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="the config must be a mapping"):
        load_config(listy)
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    grouped = config()
    grouped["input_parameters"] = ["x"]
    with pytest.raises(UserError, match="input_parameters = \\['x'\\] is not of type object or null"):
        parse_config(grouped, SOURCE)


def _laughs(path, levels: int, fan: int):
    """A 'billion laughs' YAML: each level a list of `fan` aliases of the level before."""
    lines = ["a: &a [" + ", ".join(['"lol"'] * fan) + "]"]
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * fan) + "]")
    lines += ["model_parameters:", "  onnx_model: m.onnx", f"  output_model_file_prefix: *{cur}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_alias_bomb_is_refused_before_use(tmp_path):
    """Aliases are counted while the YAML is composed (a bomb is refused before it is built); a few aliases
    that still stand for too many values are measured without expanding them, then refused."""
    from npuc.frontends.hbconfig_schema import MAX_ALIASES, MAX_CONFIG_VALUES, expanded_size

    with pytest.raises(UserError, match=f"more than {MAX_ALIASES} aliases"):
        load_config(_laughs(tmp_path / "bomb.yaml", 9, 9))  # 72 aliases for 9**9 values
    with pytest.raises(UserError, match=r"expands to \d\.\d+e\+06 values through its aliases"):
        load_config(_laughs(tmp_path / "small_bomb.yaml", 6, 10))  # 51 aliases for 10**6 values
    shared = [1, 2, 3]
    assert expanded_size({"x": [shared, shared], "y": shared}) == 14 < MAX_CONFIG_VALUES
