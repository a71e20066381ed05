"""`npuc run PATH --input x.npz -o y.npz`: execute an ONNX model (float IR) or simulate an artifact."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from npuc.compiler.errors import UserError

from .options import Color, KeepAspect, Layout, Mean, PadType, PadValue, Resize, Scale, preprocess, split_names

if TYPE_CHECKING:  # numpy and the artifact registry load when a command runs, not for --help
    import numpy as np

    from npuc.compiler.artifacts import TensorSpec


def _feeds_from_file(path: Path, specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    from npuc.compiler.arrays import load_arrays

    arrays = load_arrays(path)
    names = [s.name for s in specs]
    if len(arrays) == 1 and len(specs) == 1:  # one input: the key does not matter
        return {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise UserError(f"{path}: no array for input(s) {', '.join(missing)}; the file holds {', '.join(arrays)}")
    return {n: arrays[n] for n in names}


def _feeds_from_picture(path: Path, specs: list[TensorSpec], pre) -> dict[str, np.ndarray]:  # noqa: ANN001
    """A picture prepared as calibrate prepares it (the same --mean/--scale/--color/--resize/--layout)."""
    import numpy as np

    from npuc.passes.calibration.preprocess import InputSpec, load_sample

    frames = [s for s in specs if s.pixel_format]
    if frames:  # the model preprocesses on its own: feed the picture as the camera frame it takes
        from npuc.backends.cv18xx.frames import picture_frame
        from npuc.passes.calibration.pictures import decode_picture
        from npuc.passes.calibration.preprocess import Preprocess

        if len(specs) != 1:
            raise UserError(f"{path}: a picture feeds one input; the model has {len(specs)}")
        s = frames[0]
        for name, ours, _ in pre.differences(Preprocess()):  # the model's own preprocessing applies, not these
            raise UserError(f"--{name} {ours} is not used: input '{s.name}' takes the {s.pixel_format} camera "
                            "frame and preprocesses it on the TPU; remove it")  # fmt: skip
        aligned = s.aligned_for is not None
        picture = decode_picture(path, gray=s.pixel_format == "GRAYSCALE")  # as calibrate decodes for grey models
        return {s.name: picture_frame(picture, s.pixel_format, s.shape, aligned, s.aligned_for or "")}
    inputs = [InputSpec(s.name, tuple(s.shape), np.dtype(s.dtype)) for s in specs]
    return load_sample(path, inputs, pre)


def _is_picture(path: Path) -> bool:
    if path.suffix.lower() in (".npz", ".npy"):  # arrays: the picture decoders (and onnx) need not load
        return False
    from npuc.passes.calibration.preprocess import IMAGE_SUFFIXES

    return path.suffix.lower() in IMAGE_SUFFIXES


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        dims = ()
    if not dims or min(dims) < 1:
        raise UserError(f"bad --shape {text!r}: write positive dimensions D0,D1,... such as 1,3,12,12")
    return dims


def _random_feeds(specs: list[TensorSpec], seed: int) -> dict[str, np.ndarray]:
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = {}
    for s in specs:
        if np.dtype(s.dtype).kind == "f":
            feeds[s.name] = rng.standard_normal(s.shape).astype(s.dtype)
        else:
            info = np.iinfo(s.dtype)
            feeds[s.name] = rng.integers(max(info.min, -128), min(info.max, 127), s.shape, endpoint=True).astype(
                s.dtype
            )
    return feeds


def _figures(value: np.ndarray) -> dict[str, object]:
    """dtype, shape and (numeric, non-empty) min/max/mean of one output."""
    import numpy as np

    v = np.asarray(value)
    found: dict[str, object] = {"dtype": str(v.dtype), "shape": list(v.shape)}
    if v.size and v.dtype.kind in "fiu":
        f = v.astype(np.float64)
        found.update(min=float(f.min()), max=float(f.max()), mean=float(f.mean()))
    return found


def _summary(name: str, value: np.ndarray) -> str:
    f = _figures(value)
    stats = f"  min {f['min']:.6g}  max {f['max']:.6g}  mean {f['mean']:.6g}" if "mean" in f else ""
    return f"{name:<28} {f['dtype']:<8} {'x'.join(map(str, f['shape'])):<16}{stats}"


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        path: Path = typer.Argument(..., help="An .onnx model or an npuc-readable artifact."),
        input: Path = typer.Option(
            None, "--input", "-i", help=".npz (keys = input names), .npy for one input, or a picture (.jpg/.png/.bmp)."
        ),
        random_input: bool = typer.Option(False, "--random-input", help="Feed seeded random data instead."),
        seed: int = typer.Option(0, "--seed", help="Seed for --random-input."),
        output: Path = typer.Option(None, "--output", "-o", help="Write the outputs to this .npz."),
        input_shape: list[str] = typer.Option([], "--input-shape", help="Pin an input: NAME:D0,D1,... (ONNX)."),
        output_names: str = typer.Option(
            None, "--output-names", help="Comma-separated tensors to end the ONNX graph at (as `build` does)."
        ),
        shape: str = typer.Option(None, "--shape", help="Compiled input shape D0,D1,... to run (bmodel)."),
        mean: Mean = "0",
        scale: Scale = "1",
        color: Color = "rgb",
        resize: Resize = None,
        layout: Layout = "nchw",
        keep_aspect_ratio: KeepAspect = False,
        pad_value: PadValue = 0,
        pad_type: PadType = "center",
        as_json: bool = typer.Option(False, "--json", help="Print the outputs' dtype, shape, min, max, mean as JSON."),
    ) -> None:
        """Run a model on the float reference, or an artifact on npuc's simulator (from its bytes).

        Example: npuc run model.cvimodel --input photo.jpg -o outputs.npz
        """
        if path.suffix.lower() != ".onnx":
            # the simulators compute on one BLAS thread, as the vendors' do (cv18xx: sim._one_blas_thread), so
            # the pool OpenBLAS starts when numpy loads is idle: 0.07-0.1 s CPU of a small model's whole run
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        import numpy as np

        from npuc.compiler.artifacts import ArtifactOptions, check_options, detect
        from npuc.compiler.fileio import save_npz

        if (input is None) == (not random_input):
            raise UserError("give exactly one of --input FILE and --random-input")
        kind = detect(path)
        if kind.run is None or kind.inputs is None:
            raise UserError(f"{path}: npuc cannot run {kind.name} artifacts yet; `npuc inspect` reads them")
        options = ArtifactOptions(output_names=tuple(split_names(output_names)))
        check_options(kind, path, options)
        if input_shape:  # the ONNX frontend loads only for what needs it
            from npuc.frontends.onnx import parse_input_shapes

            options.input_shapes = parse_input_shapes(input_shape)
        if shape is not None:
            options.extra["shape"] = _parse_shape(shape)
        specs = kind.inputs(path, options)

        if random_input:
            feeds = _random_feeds(specs, seed)
        elif _is_picture(input):
            pre = preprocess(mean, scale, color, resize, layout, keep_aspect_ratio, pad_value, pad_type)
            feeds = _feeds_from_picture(input, specs, pre)
        else:
            feeds = _feeds_from_file(input, specs)
        outputs = kind.run(path, feeds, options)
        if output is not None:
            save_npz(output, {k: np.asarray(v) for k, v in outputs.items()})
        if as_json:
            import json

            from npuc.compiler.version import VERSION

            record = {"npuc": VERSION, "artifact": str(path), "kind": kind.name,
                      "outputs": {name: _figures(value) for name, value in outputs.items()},
                      "written": str(output) if output is not None else None}  # fmt: skip
            typer.echo(json.dumps(record, indent=2))
            return
        for name, value in outputs.items():
            typer.echo(_summary(name, value))
        if output is not None:
            typer.echo(f"wrote {output}")
