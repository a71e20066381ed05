"""The BM1880 simulator: vendor-compiled MTCNN P-Net against the float ONNX P-Net, multi-shape runs,
hand-built descriptors against numpy, and `npuc run` on damaged bmodels (seeded mutation fuzzing)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from golden import GOLDEN_ROOT
from metrics import cosine, softmax
from mutation import mutate
from onnx import numpy_helper

from npuc.backends.bm1880 import isa
from npuc.backends.bm1880.cmdbuf import encode_cmdbuf, make_instruction
from npuc.backends.bm1880.container import BModel, Command, TensorInfo, load_bmodel, read_bmodel, write_bmodel
from npuc.backends.bm1880.sim import quantize, run_bmodel
from npuc.cli.app import main
from npuc.compiler.errors import CorruptFileError, UnsupportedError, UserError

GOLDEN = GOLDEN_ROOT / "bm1880"
PNET = GOLDEN / "mtcnn_pnet_multishape.bmodel"


def _face_tensor(rows: int, cols: int) -> np.ndarray:
    """The astronaut's face, resized to rows x cols, normalised (x-127.5)/128, as NHWC RGB float32."""
    import skimage.data
    from skimage.transform import resize

    face = skimage.data.astronaut()[20:240, 140:340]
    pic = resize(face, (rows, cols), order=1, preserve_range=True, anti_aliasing=False)
    return ((pic.astype(np.float32) - 127.5) / 128.0)[None].astype(np.float32)


@pytest.fixture(scope="module")
def pnet() -> BModel:
    return load_bmodel(PNET)


@pytest.fixture(scope="module")
def pnet_onnx(real_model) -> Path:
    return real_model("mtcnn_pnet")


def test_pnet_bmodel_shares_the_onnx_weights_in_its_orientation(pnet, pnet_onnx):
    # this multi-shape build keeps the ONNX model's conventions (RGB, same H/W orientation): its int8 conv1
    # weights [oc][kh·kw][ic] match the ONNX OIHW kernel directly; with BGR or H/W swapped they do not
    # (det1_nchw.bmodel is the Caffe-convention build, see golden/README.md)
    kernel = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(pnet_onnx)).graph.initializer}["conv2d/kernel:0"]
    vendor = np.frombuffer(pnet.weights[0][:270], np.int8).reshape(10, 3, 3, 3).transpose(0, 3, 1, 2)
    corr = {
        (bgr, swap): np.corrcoef(vendor.ravel(), (kernel[:, ::-1] if bgr else kernel).swapaxes(2, 3).ravel()
                                 if swap else (kernel[:, ::-1] if bgr else kernel).ravel())[0, 1]
        for bgr in (0, 1) for swap in (0, 1)
    }  # fmt: skip
    assert corr[(0, 0)] > 0.999
    assert max(corr[(0, 1)], corr[(1, 0)], corr[(1, 1)]) < 0.4


@pytest.mark.parametrize("shape", [(1, 3, 12, 12), (1, 3, 36, 48)])
def test_vendor_pnet_matches_float_onnx_on_a_face(pnet, pnet_onnx, shape):
    a, b = shape[2:]
    onnx_in = _face_tensor(b, a).transpose(0, 2, 1, 3)  # the ONNX P-Net takes the picture transposed
    box, prob = ort.InferenceSession(str(pnet_onnx)).run(None, {"input_1": np.ascontiguousarray(onnx_in)})
    out = run_bmodel(pnet, {"input": np.ascontiguousarray(onnx_in.transpose(0, 3, 1, 2))})
    command = pnet.command_for_shape(shape)
    assert {k: v.shape for k, v in out.items()} == {t.name: t.shape for t in command.outputs}
    assert cosine(out["conv4-2"], box.transpose(0, 3, 1, 2)) >= 0.98
    face = softmax(out["conv4-1"], 1)
    assert cosine(face, prob.transpose(0, 3, 1, 2)) >= 0.99
    if shape == (1, 3, 12, 12):  # one window: 0.103 vs 0.169 measured (~10 steps of the logits' int8 grid)
        assert abs(face[0, 1, 0, 0] - prob[0, 0, 0, 1]) < 0.08


def test_multishape_bmodel_runs_at_every_shape(pnet):
    rng = np.random.default_rng(1)
    for command in pnet.commands:
        shape = command.inputs[0].shape
        out = run_bmodel(pnet, {"input": rng.uniform(-1, 1, shape).astype(np.float32)}, shape)
        assert [(k, v.shape) for k, v in out.items()] == [(t.name, t.shape) for t in command.outputs]
        for tensor in command.outputs:  # dequantized int8: q·T/128 with q in [-128, 127]
            q = out[tensor.name] * 128.0 / tensor.threshold
            assert np.allclose(q, np.round(q), atol=1e-3) and q.min() >= -128 and q.max() <= 127
            assert len(np.unique(q)) > 1


def test_one_weight_blob_per_command_runs_at_every_shape():
    model = load_bmodel(GOLDEN / "mtcnn_det1_nchw.bmodel")  # no input threshold: int8 input
    rng = np.random.default_rng(2)
    for command in model.commands:
        feed = rng.integers(-128, 128, command.inputs[0].shape).astype(np.int8)
        out = run_bmodel(model, {"input": feed})
        assert [v.shape for v in out.values()] == [t.shape for t in command.outputs]


def test_command_selection_errors(pnet):
    with pytest.raises(UserError, match="no command for input shape"):
        run_bmodel(pnet, {"input": np.zeros((1, 3, 13, 12), np.float32)}, (1, 3, 13, 12))
    with pytest.raises(UserError, match="expects 1x3x12x12"):
        run_bmodel(pnet, {"input": np.zeros((1, 3, 18, 24), np.float32)}, (1, 3, 12, 12))


# ---- hand-built descriptors: layouts and arithmetic against numpy ------------------------------------------


def _gdma(direction: int, area: int, gaddr: int, laddr: int, shape: tuple, gstr: tuple, lstr: tuple):
    n, c, h, w = shape
    src, dst = ((gaddr, laddr), (laddr, gaddr))[direction]
    src_str, dst_str = ((gstr, lstr), (lstr, gstr))[direction]
    fields = dict(
        valid=1, stride_en=1, direction=direction, src_fmt=4, dst_fmt=1, chw_share=1,
        src_addr=src, dst_addr=dst, src_n=n, src_c=c, src_h=h, src_w=w, dst_c=c, dst_h=h, dst_w=w,
        src_n_stride=src_str[0], src_c_stride=src_str[1], src_h_stride=src_str[2],
        dst_n_stride=dst_str[0], dst_c_stride=dst_str[1], dst_h_stride=dst_str[2],
    )  # fmt: skip
    return make_instruction(isa.ENGINE_GDMA, fields, area)


def _conv_model(x_shape, oc, k, rshift, relu) -> tuple[BModel, np.ndarray, np.ndarray]:
    """input -> conv kxk (pad 1, stride 1, 16-bit bias) -> output, as a one-command bmodel."""
    rng = np.random.default_rng(3)
    n, ic, h, w = x_shape
    weight = rng.integers(-128, 128, (oc, ic, k, k)).astype(np.int8)
    bias = rng.integers(-3000, 3000, oc).astype(np.int16)
    blob = weight.transpose(0, 2, 3, 1).tobytes() + (bias.view(np.uint16) & 0xFF).astype(np.uint8).tobytes()
    blob += (bias.view(np.uint16) >> 8).astype(np.uint8).tobytes()  # low-byte plane, then high-byte plane
    x_size, y_size = n * ic * h * w, n * oc * h * w
    aligned = -(-h * w // 16) * 16
    l_w, l_b, l_x, l_y = 0, 1024, 2048, 8192
    g = isa.GMEM_BASE
    bias_lstr = (-(-oc // 32), 1, 1)  # (2, C, 1, 1) packed: the high plane one lane group above the low one
    bd = dict(
        cmd_en=1, tsk_typ=0, tsk_opd_num=3, opt_right_shift=rshift, opt_rshift_typ=1, opt_relu=int(relu),
        opt_res0_sign=1, opt_opd0_sign=1, opt_opd1_sign=1, opt_opd2_sign=1, opt_res0_int8=1, opt_opd0_int8=1,
        opt_opd1_int8=1, short_opd1_str=1, short_opd2_str=2, res0_n=n, res0_c=oc, res0_h=h, res0_w=w,
        res0_addr=l_y, opd0_addr=l_x, opd1_addr=l_w, opd2_addr=l_b, opd0_n=n, opd0_c=ic, opd0_h=h, opd0_w=w,
        opd1_n=ic, opd1_c=oc, opd1_h=k, opd1_w=k, opd2_n=1, opd2_c=oc, opd2_h=1, opd2_w=1,
        conv_opd0_up_pad=1, conv_opd0_dn_pad=1, conv_opd0_lf_pad=1, conv_opd0_rt_pad=1,
        conv_op_x_str=1, conv_op_y_str=1,
    )  # fmt: skip
    instructions = [
        _gdma(0, isa.FLAG_WEIGHT, g, isa.LMEM_BASE + l_w, (1, oc, k * k, ic), (0, ic * k * k, ic), (0, ic * k * k, ic)),
        _gdma(0, isa.FLAG_WEIGHT, g + weight.size, isa.LMEM_BASE + l_b, (2, oc, 1, 1), (oc, 1, 1), bias_lstr),
        _gdma(0, isa.FLAG_NEURON, g, isa.LMEM_BASE + l_x, x_shape, (ic * h * w, h * w, w), (aligned, aligned, w)),
        make_instruction(isa.ENGINE_BD, bd),
        _gdma(1, isa.FLAG_NEURON, g + x_size, isa.LMEM_BASE + l_y, (n, oc, h, w), (oc * h * w, h * w, w),
              (aligned, aligned, w)),
    ]  # fmt: skip
    command = Command(
        (TensorInfo("", x_shape, 0, 0.0),),
        (TensorInfo("y", (n, oc, h, w), x_size, 0.0),),
        encode_cmdbuf(instructions),
        x_size + y_size,
    )
    return BModel("conv", 1880, 4, (command,), (blob,)), weight, bias


@pytest.mark.parametrize("relu", [False, True])
def test_conv_descriptor_layouts_and_rounding(relu):
    model, weight, bias = _conv_model((1, 5, 6, 7), 40, 3, 7, relu)  # 40 output channels: two lane groups
    x = np.random.default_rng(4).integers(-128, 128, (1, 5, 6, 7)).astype(np.int8)
    y = run_bmodel(read_bmodel(write_bmodel(model)), {"input": x})["y"]
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((1, 40, 6, 7), np.int64)
    for ky in range(3):
        for kx in range(3):
            acc += np.einsum("nchw,oc->nohw", xp[:, :, ky : ky + 6, kx : kx + 7], weight[:, :, ky, kx].astype(np.int64))
    acc += bias.reshape(1, -1, 1, 1)
    if relu:
        acc = np.maximum(acc, 0)
    expect = np.clip((acc + 64) >> 7, -128, 127).astype(np.int8)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, expect)


def test_unsupported_descriptor_names_its_offset(pnet):
    command = pnet.commands[0]
    buf = bytearray(command.cmdbuf)
    bd = 0xD8 + isa.CMD_HDR_SIZE  # the first BD (conv1) of the 12x12 command
    fields = isa.BD.decode(bytes(buf[bd : bd + 112]))
    buf[bd : bd + 112] = isa.BD.encode({**fields, "tsk_typ": 9})
    damaged = BModel("PNet", 1880, 4, (Command(command.inputs, command.outputs, bytes(buf), command.neuron_size),),
                     pnet.weights)  # fmt: skip
    with pytest.raises(UnsupportedError, match=r"BD descriptor at offset 216: BD task type 9"):
        run_bmodel(damaged, {"input": np.zeros((1, 3, 12, 12), np.float32)})


# ---- npuc run ----------------------------------------------------------------------------------------------


def test_npuc_run_selects_the_shape(tmp_path, pnet):
    x = _face_tensor(24, 18).transpose(0, 3, 2, 1)
    np.savez(tmp_path / "in.npz", input=x)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(PNET), "--input", str(tmp_path / "in.npz"), "--shape", "1,3,18,24", "-o",
              str(tmp_path / "out.npz")])  # fmt: skip
    assert exit_info.value.code in (0, None)
    got = np.load(tmp_path / "out.npz")
    expect = run_bmodel(pnet, {"input": x})
    assert set(got.files) == {"conv4-2", "conv4-1"}
    np.testing.assert_array_equal(got["conv4-1"], expect["conv4-1"])
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(PNET), "--input", str(tmp_path / "in.npz"), "--shape", "1,3,12,12"])
    assert exit_info.value.code == 2


FUZZ_MUTATIONS = 3000


def test_fuzz_run_parses_runs_or_rejects(pnet, tmp_path):
    # the 12x12 command alone: its protobuf header and cmdbuf are the first ~4 KB, the weights follow
    single = write_bmodel(BModel("PNet", 1880, 4, (pnet.commands[0],), pnet.weights))
    hot = len(single) - len(pnet.weights[0])
    feed = {"input": _face_tensor(12, 12).transpose(0, 3, 2, 1)}
    rng = random.Random("bm1880-sim-fuzz")
    outcomes = {"ran": 0, "rejected": 0}
    for _ in range(FUZZ_MUTATIONS):
        data = mutate(single, rng, hot, 0.7)
        try:
            run_bmodel(read_bmodel(data, "fuzz.bmodel"), feed)
            outcomes["ran"] += 1
        except (CorruptFileError, UserError):
            outcomes["rejected"] += 1
    assert outcomes["ran"] > FUZZ_MUTATIONS // 10 and outcomes["rejected"] > FUZZ_MUTATIONS // 10
    # and through the CLI: exit 0 or 2, never an internal error (1)
    np.savez(tmp_path / "in.npz", **feed)
    codes = set()
    for index in range(40):
        path = tmp_path / f"m{index}.bmodel"
        path.write_bytes(mutate(single, rng, hot, 0.7))
        with pytest.raises(SystemExit) as exit_info:
            main(["run", str(path), "--input", str(tmp_path / "in.npz")])
        codes.add(exit_info.value.code or 0)
    assert codes <= {0, 2} and 2 in codes


def test_quantize_rounds_half_up_and_saturates():
    x = np.array([0.5, 1.5, -0.5, -1.5, 200.0, -200.0], np.float32) * (1 / 128)
    np.testing.assert_array_equal(quantize(x, 1.0), np.array([1, 2, 0, -1, 127, -128], np.int8))
