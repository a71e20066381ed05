"""PP-OCRv6 tiny on BM1880, the text detector and recogniser, built, written, read back and simulated from the
bytes: every output code equals the exact integer reference's (`write_qdq_bm1880` run by onnxruntime) and the
outputs follow onnxruntime's float model.

- The recogniser (SVTR-style neck: (1, C, 40) features transposed to (1, 40, C), two linear layers on each of
  the 40 positions, softmax on the host): its transposes move the last axis (S2S copies of single bytes), its
  linear layers run the 40 positions as the samples of one FC with the bias Add folded in, and the 6906-class
  FC is cut into output-channel chunks a BD can address.
- The detector (DB head): its two 2x2 stride-2 transposed convs are one 1x1 conv per phase with the bias Add and
  ReLU folded in, interleaved by TIU copies; its SE blocks' global pools span 48x96 maps.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from metrics import cosine
from qdq_cases import session
from test_qdq_bm1880 import assert_codes_equal, bmodel_codes, run_named, with_bmodel_output_codes

from npuc.backends.bm1880.build import compile_bmodel
from npuc.backends.bm1880.cmdbuf import decode_cmdbuf
from npuc.backends.bm1880.container import read_bmodel, write_bmodel
from npuc.backends.bm1880.isa import BD_MAX_CHANNELS
from npuc.backends.bm1880.qdq import lower_for_export, write_qdq_bm1880
from npuc.frontends.onnx import import_onnx
from npuc.models.fetch import REAL_MODELS
from npuc.models.images import model_inputs
from npuc.passes.calibration.calibrate import max_abs_thresholds
from npuc.passes.rewrite.canonicalize import canonicalize

NAME, SHAPE = "ppocrv6_rec_tiny", [1, 3, 48, 320]
LOGITS = "Add.107"  # the last FC's output, before the host's softmax
DETECTOR = "ppocrv6_det_tiny"


def test_ppocrv6_rec_runs_bit_exact_and_follows_float(real_model) -> None:  # noqa: ANN001
    path = real_model(NAME)
    graph = import_onnx(path, {"x": SHAPE})
    canonicalize(graph)
    feeds = model_inputs(NAME, 3)
    table = max_abs_thresholds(graph, feeds[:2])
    layers = lower_for_export(graph, table, None, True).net.layers
    assert sum(layer.kind == "copy" and layer.perm[3] != 3 for layer in layers) == 3  # the three transposes
    model = read_bmodel(write_bmodel(compile_bmodel([graph], table, None, "layer-group", NAME, "channel")[0]))
    widths = [i.fields["res0_c"] for i in decode_cmdbuf(model.commands[0].cmdbuf) if i.engine == 0]
    assert max(widths) <= BD_MAX_CHANNELS
    probe, names = with_bmodel_output_codes(write_qdq_bm1880(graph, table, channel_gains=True))
    codes, floats = bmodel_codes(model, feeds[2]["x"])
    assert assert_codes_equal(run_named(session(probe), feeds[2]), names, codes) == 40 * 6906
    proto = onnx.load(str(path))
    proto.graph.output.extend([onnx.helper.make_empty_tensor_value_info(LOGITS)])
    (want,) = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        [LOGITS], feeds[2]
    )
    got = floats[LOGITS].reshape(want.shape)
    agreement = float(np.mean(got.argmax(-1) == want.argmax(-1)))
    # measured with these max-abs thresholds: cosine 0.853, every position's class equal; npuc calibrate's
    # default table on 24 lines: 0.87 - 0.93, 0.82 - 0.98 of the positions on four other lines (no bf16 here)
    assert cosine(got, want) >= 0.83 and agreement >= 0.95


def test_ppocrv6_det_runs_bit_exact_and_follows_float(real_model) -> None:  # noqa: ANN001
    path = real_model(DETECTOR)
    shape = list(REAL_MODELS[DETECTOR].input_shapes["x"])
    graph = import_onnx(path, {"x": shape})
    canonicalize(graph)
    feeds = model_inputs(DETECTOR, 3)  # text pictures (two scans)
    table = max_abs_thresholds(graph, feeds[:2])
    layers = lower_for_export(graph, table, None, True).net.layers
    assert sum(layer.kind == "interleave" for layer in layers) == 2
    model = read_bmodel(write_bmodel(compile_bmodel([graph], table, None, "layer-group", DETECTOR, "channel")[0]))
    probe, names = with_bmodel_output_codes(write_qdq_bm1880(graph, table, channel_gains=True))
    codes, floats = bmodel_codes(model, feeds[2]["x"])
    assert assert_codes_equal(run_named(session(probe), feeds[2]), names, codes) == shape[2] * shape[3]
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds[2])
    got = next(iter(floats.values())).reshape(want.shape)
    found, wanted = got > 0.3, want > 0.3  # DB post-processing's binarisation threshold
    # measured with these max-abs thresholds: cosine 0.990, text-pixel IoU 0.952; npuc calibrate's default table
    # (10 pictures) on the ten mirrored ones: mean cosine 0.975, worst 0.896, IoU 0.75 - 0.96
    assert cosine(got, want) >= 0.98 and (found & wanted).sum() / (found | wanted).sum() >= 0.9
