"""Options several commands share, declared once: the preprocessing of pictures (calibrate, compare)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from npuc.passes.calibration.preprocess import Preprocess

Mean = Annotated[str, typer.Option("--mean", help="Per-channel mean subtracted from pixels (0..255 scale).")]
Scale = Annotated[str, typer.Option("--scale", help="Per-channel factor applied after the mean.")]
Color = Annotated[str, typer.Option("--color", help="Channel order the model takes: rgb, bgr, gray.")]
Resize = Annotated[str | None, typer.Option("--resize", help="Resize pictures to H,W, then centre-crop.")]
Layout = Annotated[str, typer.Option("--layout", help="Input layout: nchw or nhwc.")]
# the same options where a calibration table may supply them (its `# preprocess:` line): unset means the table's
_RECORDED = " Default: the table's (calibrated on pictures), else"
TableMean = Annotated[str | None, typer.Option("--mean", help=f"Per-channel mean (0..255 scale).{_RECORDED} 0.")]
TableScale = Annotated[str | None, typer.Option("--scale", help=f"Factor after the mean.{_RECORDED} 1.")]
TableColor = Annotated[str | None, typer.Option("--color", help=f"rgb, bgr or gray.{_RECORDED} rgb.")]
TableResize = Annotated[str | None, typer.Option("--resize", help=f"H,W, then centre-crop.{_RECORDED} none.")]
TableLayout = Annotated[str | None, typer.Option("--layout", help=f"nchw or nhwc.{_RECORDED} nchw.")]


def preprocess(mean: str, scale: str, color: str, resize: str | None, layout: str) -> Preprocess:
    """The Preprocess the picture options describe (checked, one line on a bad value)."""
    from npuc.passes.calibration.preprocess import Preprocess, parse_floats, parse_hw

    return Preprocess(
        mean=parse_floats(mean, "--mean"),
        scale=parse_floats(scale, "--scale"),
        color=color,
        resize=parse_hw(resize) if resize else None,
        layout=layout,
    )
