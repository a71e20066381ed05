"""`npuc calibrate --refine bias|weights` and `--split-channels 3` on MTCNN O-Net, through the CLI.

O-Net takes NHWC pictures (1x48x48x3) and its first Transpose is absorbed into the graph, so the batched runs
behind --refine and --split-channels must put the stacked samples into the graph's NCHW layout first. Before
that they failed on O-Net with "op 'conv2d_8' (conv2d) cannot run 31 samples as one batch (cannot reshape
array ...)", and the suggested --refine-samples 1 failed the same way ("cannot run 1 samples"). Here each
option runs on 20 real O-Net inputs (16 LFW faces, 4 photos), writes its side file, and `npuc build --calib`
applies it: the cvimodel differs from the plain table's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npuc.cli.app import main as cli_main
from npuc.passes.calibration.refinement import load_refinement, side_file

SAMPLES = 20


def _main(argv: list[str]) -> int:
    try:
        cli_main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture(scope="module")
def onet(real_model, tmp_path_factory) -> tuple[Path, Path, bytes]:  # noqa: ANN001
    """(model, folder of 20 .npz samples, the cv183x int8 cvimodel of the plain KL table)."""
    from npuc.models.images import model_inputs

    folder = tmp_path_factory.mktemp("onet_refine")
    data = folder / "data"
    data.mkdir()
    for i, feed in enumerate(model_inputs("mtcnn_onet", SAMPLES)):
        np.savez(data / f"{i:02d}.npz", **feed)
    model = real_model("mtcnn_onet")
    plain = folder / "plain.txt"
    assert _main(["calibrate", str(model), "--data", str(data), "--method", "kl", "-o", str(plain)]) == 0
    assert not side_file(plain).exists()
    out = folder / "plain.cvimodel"
    assert _main(["build", str(model), "--target", "cv18xx", "--chip", "cv183x", "--calib", str(plain),
                  "-o", str(out)]) == 0  # fmt: skip
    return model, data, out.read_bytes()


@pytest.mark.parametrize(
    "options",
    [
        ["--refine", "bias"],
        ["--refine", "weights"],
        ["--refine", "bias", "--refine-samples", "1"],
        ["--split-channels", "3"],
        ["--split-channels", "3", "--refine-samples", "1"],
    ],
    ids=["bias", "weights", "bias-1-sample", "split3", "split3-1-sample"],
)
def test_onet_refine_and_split_run_and_build(onet, options: list[str], tmp_path: Path, capsys) -> None:  # noqa: ANN001
    model, data, plain_build = onet
    table = tmp_path / "t.txt"
    assert _main(["calibrate", str(model), "--data", str(data), "--method", "kl", *options, "-o", str(table)]) == 0
    assert "split nothing" not in capsys.readouterr().err
    refinement = load_refinement(side_file(table))
    if "--split-channels" in options:
        assert refinement.groupings  # at least one conv run split into channel groups
        assert all(len(groups) > 1 for groups in refinement.groupings.values())
    else:
        assert refinement.constants  # refitted conv / FC constants
    out = tmp_path / "refined.cvimodel"
    assert _main(["build", str(model), "--target", "cv18xx", "--chip", "cv183x", "--calib", str(table),
                  "-o", str(out)]) == 0  # fmt: skip
    assert out.read_bytes() != plain_build  # the side file changed what was built
