"""`npuc calibrate MODEL --data PATH... -o TABLE` and `npuc calibrate merge STATS... -o TABLE`.

`calibrate` is a command group whose default command is `run`: a first argument that is not a subcommand
name (`run`, `merge`) or a help flag is taken as the MODEL of `run`, so `npuc calibrate MODEL ...` and
`npuc calibrate run MODEL ...` are the same command.

Sharded calibration (exactly the single run's table):
  npuc calibrate MODEL --data shardK --range-only --save-stats rK.npz     (each shard)
  npuc calibrate merge r*.npz --save-stats ranges.npz
  npuc calibrate MODEL --data shardK --ranges ranges.npz --save-stats hK.npz          (each shard)
  npuc calibrate merge h*.npz -o TABLE

`--tune N` runs tpu-mlir's tune step (its run_calibration default: 5 samples) after KL on the first N
samples of a single run; merged shards are not tuned.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from npuc.compiler.commands.compare import DEFAULT_MAX_FLOAT_LAYERS
from npuc.compiler.errors import UserError
from npuc.frontends.onnx import parse_input_shapes
from npuc.passes.calibrate import CalibrationOptions, calibrate, merge_stats_files, stats_to_table
from npuc.passes.calitable import CalibrationTable, write_table
from npuc.passes.histogram import DEFAULT_BINS, load_stats, save_stats
from npuc.passes.preprocess import Preprocess, list_samples, parse_floats, parse_hw
from npuc.passes.refinement import Refinement, save_refinement, side_file
from typer.core import TyperGroup

DEFAULT_COMMAND = "run"
HELP_FLAGS = ("--help", "-h")


class DefaultCommandGroup(TyperGroup):
    """A group that runs DEFAULT_COMMAND when the first argument names no subcommand."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:  # noqa: ANN001 - click's Context
        if args and args[0] not in self.commands and args[0] not in HELP_FLAGS:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


def _check_output(path: Path | None, option: str) -> None:
    """Fail before hours of calibration rather than after, when an output cannot be written."""
    if path is not None and not path.resolve().parent.is_dir():
        raise UserError(f"{option} {path}: folder {path.parent} does not exist; create it or choose another path")


def _progress_factory() -> tuple[Callable[[str, int], Callable[[int], None]], object | None]:
    """A rich progress bar on a terminal; a no-op otherwise (quiet in Makefiles and CI)."""
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


def _note(message: str) -> None:
    if sys.stderr.isatty():
        typer.echo(message, err=True)


METHOD_HELP = "Threshold method: kl (tpu-mlir's default), max, percentile, mse."


HELD_OUT_SHARE = 5  # --target-cos measures on every 5th sample's worth, taken from the end of the list


def _hold_out(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(calibration samples, held-out samples): the last fifth (at least one) is held out."""
    if len(files) < 2:
        raise UserError(f"--target-cos needs at least 2 samples (one to calibrate, one to measure); found {len(files)}")
    count = max(1, len(files) // HELD_OUT_SHARE)
    return files[:-count], files[-count:]


def _write_qtable(model: Path, table: CalibrationTable, output: Path, shapes: dict, patterns: bool,
                  held_out: list[Path], pre: Preprocess, target: float | None, max_layers: int) -> None:  # fmt: skip
    """`<output>.qtable`: the layers the float patterns keep, plus those --target-cos finds; a stale one from an
    earlier table is removed. Always said on stderr: it decides what `npuc build --calib` does."""
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.canonicalize import canonicalize
    from npuc.passes.float_patterns import pattern_layers
    from npuc.passes.qtable import beside, write_qtable

    graph = import_onnx(model, shapes or None, [])
    canonicalize(graph)
    found = pattern_layers(graph) if patterns else {}
    base = list(dict.fromkeys(n for layers in found.values() for n in layers))
    comments = [f"npuc calibrate: the {name} pattern keeps {len(layers)} layer(s) in float"
                for name, layers in found.items()]  # fmt: skip
    lines = [f"{c.removeprefix('npuc calibrate: ')}" for c in comments]
    chosen: list[str] = []
    if held_out:
        from npuc.compiler.commands.compare import held_out_search
        from npuc.passes.calibrate import plan_calibration
        from npuc.passes.preprocess import load_sample

        inputs = plan_calibration(model, shapes or None).inputs
        feeds = [load_sample(p, inputs, pre) for p in held_out]
        mixed = held_out_search(model, table, feeds, target, max_layers, shapes or None, base)
        chosen = mixed.float_layers
        verdict = "" if mixed.reached else "NOT reached, the qtable holds the best layers found: "
        shown = ", ".join(chosen[:6]) + (", ..." if len(chosen) > 6 else "")
        comments.append(f"npuc calibrate --target-cos {target} on {len(feeds)} held-out sample(s): {mixed.reason}")
        lines.append(f"--target-cos {target} on {len(feeds)} held-out sample(s): {verdict}int8 output cosine "
                     f"{mixed.int8_cosine:.6f}; {mixed.reason}{f' ({shown})' if shown else ''}")  # fmt: skip
    path = beside(output)
    if base or held_out:
        write_qtable(path, [*base, *chosen], "BF16", comments)
        lines.append(f"wrote {path}")
    elif path.exists():
        path.unlink()
        lines.append(f"removed {path}, made for an earlier table")
    for line in lines:
        typer.echo(f"npuc: note: {line}", err=True)


def _write_bmnet(model: Path, table: CalibrationTable, shapes: dict, path: Path) -> None:
    """BMNet's NetCalibrationParameter: the thresholds plus the shifts and multipliers the bm1880 lowering picks."""
    import onnx
    from npuc.backends.bm1880.export_table import export_bmnet_table
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.calibrate import tensor_table_names
    from npuc.passes.canonicalize import canonicalize

    graph = import_onnx(model, shapes or None, [])
    canonicalize(graph)
    names = tensor_table_names(onnx.load(str(model), load_external_data=False))
    export_bmnet_table(graph, table.thresholds(), path, names)


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        cls=DefaultCommandGroup,
        no_args_is_help=True,
        help="Calibrate a model: `npuc calibrate MODEL --data DIR -o TABLE` (runs `run`), or merge shards.",
    )

    @group.command(DEFAULT_COMMAND, no_args_is_help=True)
    def run(
        model: Annotated[Path, typer.Argument(help="The ONNX model (float).")],
        data: Annotated[
            list[str],
            typer.Option("--data", "-d", help="Folder, sample file (.npz/.npy/.jpg/.png) or .txt list; repeatable."),
        ],
        output: Annotated[Path | None, typer.Option("--output", "-o", help="The cali_table to write.")] = None,
        samples: Annotated[
            int | None, typer.Option("--samples", "-n", help="Use the first N samples (default all).")
        ] = None,
        method: Annotated[str, typer.Option("--method", help=METHOD_HELP)] = "kl",
        percentile: Annotated[float, typer.Option("--percentile", help="Percentile for --method percentile.")] = 99.99,
        input_shape: Annotated[
            list[str] | None, typer.Option("--input-shape", help="Pin an input: NAME:D0,D1,...; repeatable.")
        ] = None,
        mean: Annotated[
            str, typer.Option("--mean", help="Per-channel mean subtracted from pixels (0..255 scale).")
        ] = "0",
        scale: Annotated[str, typer.Option("--scale", help="Per-channel factor applied after the mean.")] = "1",
        color: Annotated[str, typer.Option("--color", help="Channel order the model takes: rgb, bgr, gray.")] = "rgb",
        resize: Annotated[
            str | None, typer.Option("--resize", help="Resize pictures to H,W, then centre-crop.")
        ] = None,
        layout: Annotated[str, typer.Option("--layout", help="Input layout: nchw or nhwc.")] = "nchw",
        save_stats_path: Annotated[
            Path | None, typer.Option("--save-stats", help="Also write mergeable statistics.")
        ] = None,
        ranges: Annotated[Path | None, typer.Option("--ranges", help="Merged range statistics of all shards.")] = None,
        range_only: Annotated[
            bool, typer.Option("--range-only", help="Stop after the range pass (needs --save-stats).")
        ] = False,
        batch: Annotated[int, typer.Option("--batch", help="Samples per onnxruntime run.")] = 1,
        bins: Annotated[int, typer.Option("--bins", help="Histogram bins (tpu-mlir: 2048).")] = DEFAULT_BINS,
        tune: Annotated[
            int, typer.Option("--tune", help="Tune KL thresholds on the first N samples (tpu-mlir's default: 5).")
        ] = 0,
        bmnet: Annotated[
            Path | None,
            typer.Option("--bmnet", help="Also write BMNet's calibration table for bm1880 (.pb2 binary, else text)."),
        ] = None,
        refine: Annotated[
            str,
            typer.Option(
                "--refine",
                help="Refit conv/FC constants to the table (bias | weights), written beside it as TABLE.refine.npz; "
                "`build --calib TABLE` applies it.",
            ),
        ] = "",
        refine_samples: Annotated[
            int, typer.Option("--refine-samples", help="Samples --refine and --split-channels use.")
        ] = 100,
        split_channels: Annotated[
            int,
            typer.Option(
                "--split-channels",
                help="Split per-channel conv runs into up to K channel groups, each its own int8 tensor (e.g. 3): "
                "more accuracy for more ops and DDR traffic; the split is written beside the table as "
                "TABLE.refine.npz and replayed by `build --calib TABLE`.",
            ),
        ] = 0,
        jobs: Annotated[
            int | None,
            typer.Option("--jobs", "-j", help="Worker processes (default: one per core, fewer for few samples)."),
        ] = None,
        ray: Annotated[
            str | None,
            typer.Option("--ray", help="Run the passes on a Ray cluster: auto (the local `ray start`) or its address."),
        ] = None,
        target_cos: Annotated[
            float | None,
            typer.Option(
                "--target-cos",
                help="cv18xx: keep the fewest layers in bf16 for this output cosine on held-out samples; "
                "writes TABLE.qtable, which `npuc build --calib TABLE` reads.",
            ),
        ] = None,
        max_float_layers: Annotated[
            int, typer.Option("--max-float-layers", help="Bound of the --target-cos search.")
        ] = DEFAULT_MAX_FLOAT_LAYERS,
        float_patterns: Annotated[
            bool,
            typer.Option(
                "--float-patterns/--no-float-patterns",
                help="Keep the layers known to need float (a detector's decode) in TABLE.qtable, as tpu-mlir does.",
            ),
        ] = True,
    ) -> None:
        """Calibrate MODEL on sample data and write a tpu-mlir cali_table."""
        if (refine or split_channels > 1) and output is None:
            raise UserError("--refine / --split-channels write a file beside the table; give -o TABLE")
        if output is None and save_stats_path is None and bmnet is None:
            raise UserError("nothing to write; give -o TABLE, --bmnet TABLE and/or --save-stats FILE")
        if range_only and (save_stats_path is None or output is not None):
            raise UserError("--range-only writes statistics only; give --save-stats FILE and no -o")
        _check_output(output, "-o")
        _check_output(save_stats_path, "--save-stats")
        _check_output(bmnet, "--bmnet")
        options = CalibrationOptions(
            method=method, percentile=percentile, batch=batch, bins=bins, tune=tune, refine=refine,
            refine_samples=refine_samples, split_channels=split_channels,
        )  # fmt: skip
        pre = Preprocess(
            mean=parse_floats(mean, "--mean"),
            scale=parse_floats(scale, "--scale"),
            color=color,
            resize=parse_hw(resize) if resize else None,
            layout=layout,
        )
        range_stats = load_stats(ranges) if ranges is not None else None
        shapes = parse_input_shapes(input_shape or [])
        held_out: list[Path] = []
        if target_cos is not None:
            if output is None or refine or split_channels > 1 or range_only:
                raise UserError("--target-cos searches over a plain table: give -o TABLE, without --refine, "
                                "--split-channels or --range-only")  # fmt: skip
            data, held_out = _hold_out(list_samples(data, samples))
            samples = None
        progress, bar = _progress_factory()
        with bar or nullcontext():
            result = calibrate(
                model,
                data,
                pre,
                options,
                input_shapes=shapes,
                limit=samples,
                ranges=range_stats,
                range_only=range_only,
                keep_histograms=save_stats_path is not None,
                progress=progress,
                jobs=jobs,
                ray_address=ray,
            )
        if samples is not None and result.samples < samples:
            typer.echo(f"npuc: note: --samples {samples} but only {result.samples} found; used all", err=True)
        if result.skipped:  # tensors a converter created: no row in the table
            shown = ", ".join(result.skipped[:5]) + (", ..." if len(result.skipped) > 5 else "")
            typer.echo(
                f"npuc: note: {len(result.skipped)} IR tensor(s) have no ONNX tensor to observe: {shown}", err=True
            )
        if save_stats_path is not None:
            save_stats(result.stats, save_stats_path)
        if output is not None and result.table is not None:
            write_table(result.table, output)
            constants = result.refinement.constants if result.refinement is not None else {}
            if constants or result.groupings:
                save_refinement(side_file(output), Refinement(constants, result.groupings))
                _note(
                    f"split {len(result.groupings)} channel runs, refined {len(constants)} constants: "
                    f"{side_file(output)}"
                )
            _write_qtable(model, result.table, output, shapes, float_patterns, held_out, pre, target_cos,
                          max_float_layers)  # fmt: skip
        if bmnet is not None and result.table is not None:
            _write_bmnet(model, result.table, parse_input_shapes(input_shape or []), bmnet)
        rate = result.samples / max(result.seconds, 1e-9)
        _note(
            f"calibrated {len(result.stats.tensors)} tensors on {result.samples} samples "
            f"({options.method_label()}, {rate:.1f} samples/s)"
        )

    @group.command("merge", no_args_is_help=True)
    def merge(
        stats: Annotated[list[Path], typer.Argument(help="Statistics files written with --save-stats.")],
        output: Annotated[Path | None, typer.Option("--output", "-o", help="The cali_table to write.")] = None,
        save_stats_path: Annotated[
            Path | None, typer.Option("--save-stats", help="Write the merged statistics.")
        ] = None,
        method: Annotated[str, typer.Option("--method", help=METHOD_HELP)] = "kl",
        percentile: Annotated[float, typer.Option("--percentile", help="Percentile for --method percentile.")] = 99.99,
    ) -> None:
        """Merge statistics shards into one table (identical to a single run) or one statistics file."""
        if output is None and save_stats_path is None:
            raise UserError("nothing to write; give -o TABLE and/or --save-stats FILE")
        _check_output(output, "-o")
        _check_output(save_stats_path, "--save-stats")
        merged = merge_stats_files(stats)
        options = CalibrationOptions(method=method, percentile=percentile, bins=merged.bins)
        table = stats_to_table(merged, options) if output is not None else None
        if save_stats_path is not None:
            save_stats(merged, save_stats_path)
        if table is not None:
            write_table(table, output)

    app.add_typer(group, name="calibrate")
