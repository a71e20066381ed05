"""Options several commands share, declared once: the preprocessing of pictures (calibrate, compare, run) and
target options (build, export)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from npuc.compiler.errors import UserError

if TYPE_CHECKING:
    from npuc.passes.calibration.calibrate import Progress
    from npuc.passes.calibration.preprocess import Preprocess

Mean = Annotated[str, typer.Option("--mean", help="Per-channel mean subtracted from pixels (0..255 scale).")]
Scale = Annotated[str, typer.Option("--scale", help="Per-channel factor applied after the mean.")]
Color = Annotated[str, typer.Option("--color", help="Channel order the model takes: rgb, bgr, gray.")]
Resize = Annotated[str | None, typer.Option("--resize", help="Resize pictures to H,W, then centre-crop.")]
Layout = Annotated[str, typer.Option("--layout", help="Input layout: nchw or nhwc.")]
KeepAspect = Annotated[
    bool, typer.Option("--keep-aspect-ratio", help="Letterbox: fit inside the resize size, pad the rest.")
]
PadValue = Annotated[int, typer.Option("--pad-value", help="Pixel value of the letterbox padding, 0..255.")]
PadType = Annotated[str, typer.Option("--pad-type", help="Letterbox placement: center or normal (top left).")]
# the same options where a calibration table may supply them (its `# preprocess:` line): unset means the table's
_RECORDED = " Default: the table's (calibrated on pictures), else"
TableMean = Annotated[str | None, typer.Option("--mean", help=f"Per-channel mean (0..255 scale).{_RECORDED} 0.")]
TableScale = Annotated[str | None, typer.Option("--scale", help=f"Factor after the mean.{_RECORDED} 1.")]
TableColor = Annotated[str | None, typer.Option("--color", help=f"rgb, bgr or gray.{_RECORDED} rgb.")]
TableResize = Annotated[str | None, typer.Option("--resize", help=f"H,W, then centre-crop.{_RECORDED} none.")]
TableLayout = Annotated[str | None, typer.Option("--layout", help=f"nchw or nhwc.{_RECORDED} nchw.")]
TableKeepAspect = Annotated[
    bool | None, typer.Option("--keep-aspect-ratio/--stretch", help=f"Letterbox or stretch.{_RECORDED} stretch.")
]
TablePadValue = Annotated[int | None, typer.Option("--pad-value", help=f"Letterbox padding.{_RECORDED} 0.")]
TablePadType = Annotated[str | None, typer.Option("--pad-type", help=f"center or normal.{_RECORDED} center.")]


def preprocess(mean: str, scale: str, color: str, resize: str | None, layout: str, keep_aspect_ratio: bool = False,
               pad_value: int = 0, pad_type: str = "center") -> Preprocess:  # fmt: skip
    """The Preprocess the picture options describe (checked, one line on a bad value)."""
    from npuc.passes.calibration.preprocess import Preprocess, parse_floats, parse_hw

    return Preprocess(
        mean=parse_floats(mean, "--mean"),
        scale=parse_floats(scale, "--scale"),
        color=color,
        resize=parse_hw(resize) if resize else None,
        layout=layout,
        keep_aspect_ratio=keep_aspect_ratio,
        pad_value=pad_value,
        pad_type=pad_type,
    )


def parse_options(texts: list[str]) -> dict[str, Any]:
    """`--option KEY=VALUE`s as a dict; a value that parses as JSON is taken as JSON."""
    options: dict[str, Any] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise UserError(f"bad --option '{text}': write KEY=VALUE, e.g. --option parallel_mode=MP")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def split_names(text: str | None) -> list[str]:
    """'a, b,c' as ['a', 'b', 'c'] (--float-layers, --output-names); None or '' as []."""
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def progress_bar() -> tuple[Progress, object | None]:
    """(start(label, total) -> advance(n), the bar to enter): a rich progress bar on a terminal; a no-op otherwise
    (quiet in Makefiles and CI)."""
    if not sys.stderr.isatty():
        return (lambda label, total: lambda n: None), None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )

    def start(label: str, total: int) -> Callable[[int], None]:
        task = bar.add_task(label, total=total)
        return lambda n: bar.advance(task, n)

    return start, bar
