"""Options several commands share, declared once: the preprocessing of pictures (calibrate, compare)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from npuc.passes.preprocess import Preprocess

Mean = Annotated[str, typer.Option("--mean", help="Per-channel mean subtracted from pixels (0..255 scale).")]
Scale = Annotated[str, typer.Option("--scale", help="Per-channel factor applied after the mean.")]
Color = Annotated[str, typer.Option("--color", help="Channel order the model takes: rgb, bgr, gray.")]
Resize = Annotated[str | None, typer.Option("--resize", help="Resize pictures to H,W, then centre-crop.")]
Layout = Annotated[str, typer.Option("--layout", help="Input layout: nchw or nhwc.")]


def preprocess(mean: str, scale: str, color: str, resize: str | None, layout: str) -> Preprocess:
    """The Preprocess the picture options describe (checked, one line on a bad value)."""
    from npuc.passes.preprocess import Preprocess, parse_floats, parse_hw

    return Preprocess(
        mean=parse_floats(mean, "--mean"),
        scale=parse_floats(scale, "--scale"),
        color=color,
        resize=parse_hw(resize) if resize else None,
        layout=layout,
    )
