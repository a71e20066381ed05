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
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from npuc.cli.options import (
    Color,
    KeepAspect,
    Layout,
    Mean,
    PadType,
    PadValue,
    Resize,
    Scale,
    preprocess,
    progress_bar,
)
from npuc.compiler.defaults import DEFAULT_BINS, DEFAULT_BUDGET, DEFAULT_MAX_FLOAT_LAYERS

DEFAULT_COMMAND = "run"


class DefaultCommandGroup(TyperGroup):
    """A group that runs DEFAULT_COMMAND when the first argument names no subcommand; `--help` shows its options
    (what `npuc calibrate MODEL ...` takes), and its help names the other subcommands."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:  # noqa: ANN001 - click's Context
        if args and args[0] not in self.commands:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


def _note(message: str) -> None:
    if sys.stderr.isatty():
        typer.echo(message, err=True)


METHOD_HELP = "Threshold method: auto (each measured on the network, the best kept), kl, max, percentile, mse."
MERGE_METHOD_HELP = "Threshold method: kl (tpu-mlir's default), max, percentile, mse."


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        cls=DefaultCommandGroup,
        no_args_is_help=True,
        rich_markup_mode=None,  # plain help, as the app's
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
        method: Annotated[str, typer.Option("--method", help=METHOD_HELP)] = "auto",
        percentile: Annotated[float, typer.Option("--percentile", help="Percentile for --method percentile.")] = 99.99,
        input_shape: Annotated[
            list[str] | None, typer.Option("--input-shape", help="Pin an input: NAME:D0,D1,...; repeatable.")
        ] = None,
        mean: Mean = "0",
        scale: Scale = "1",
        color: Color = "rgb",
        resize: Resize = None,
        layout: Layout = "nchw",
        keep_aspect_ratio: KeepAspect = False,
        pad_value: PadValue = 0,
        pad_type: PadType = "center",
        save_stats_path: Annotated[
            Path | None, typer.Option("--save-stats", help="Also write mergeable statistics.")
        ] = None,
        ranges: Annotated[Path | None, typer.Option("--ranges", help="Merged range statistics of all shards.")] = None,
        range_only: Annotated[
            bool, typer.Option("--range-only", help="Stop after the range pass (needs --save-stats).")
        ] = False,
        batch: Annotated[int, typer.Option("--batch", help="Samples per onnxruntime run.")] = 1,
        bins: Annotated[int, typer.Option("--bins", help="Histogram bins (tpu-mlir: 2048).")] = DEFAULT_BINS,
        histogram: Annotated[
            str,
            typer.Option(
                "--histogram",
                help="Histogram geometry: global (one range per tensor, power-of-two bins, independent of the "
                "sample order, one pass) or tpu-mlir (its sample-by-sample histogram, folders read in its order: "
                "tpu-mlir's own table).",
            ),
        ] = "global",
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
            typer.Option(
                "--jobs",
                "-j",
                help="Cores to use: worker processes of one thread each (default: every core; fewer workers for "
                "few samples; 1: one process, one thread).",
            ),
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
                "writes TABLE.qtable, which `npuc build --calib TABLE` reads. Default with --method auto and 10+ "
                "samples: 0.99 on the report samples; 0 turns it off.",
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
        budget: Annotated[
            float,
            typer.Option(
                "--budget",
                help="Seconds (estimated) --method auto spends on each search (a method per tensor, the fit); 0: "
                "neither. "
                "A fixed cost model turns it into a trial count: the same inputs give the same table anywhere.",
            ),
        ] = DEFAULT_BUDGET,
        fit: Annotated[
            bool,
            typer.Option(
                "--fit/--no-fit",
                help="--method auto also tries splitting channel runs, the tune step and a weight refit (TABLE."
                "refine.npz), kept only when better on samples it never saw; --no-fit: thresholds only.",
            ),
        ] = True,
        depfile: Annotated[
            Path | None,
            typer.Option("--depfile", help="Also write a Makefile rule: the files written depend on every file read."),
        ] = None,
        on_bad_sample: Annotated[
            str,
            typer.Option(
                "--on-bad-sample",
                help="A sample that cannot be read (checked before the first pass): fail (stop, naming it) or skip.",
            ),
        ] = "fail",
        as_json: Annotated[
            bool, typer.Option("--json", help="Print a machine-readable summary on stdout (notes, choices, report).")
        ] = False,
    ) -> None:
        """Calibrate MODEL on sample data and write a tpu-mlir cali_table (`run` is the default subcommand;
        `npuc calibrate merge --help` combines shards).

        Example: npuc calibrate model.onnx --data photos/ --mean 123.675,116.28,103.53 --scale 0.0171 -o t.cali_table
        """
        from npuc.api import calibration

        pre = preprocess(mean, scale, color, resize, layout, keep_aspect_ratio, pad_value, pad_type)
        progress, bar = progress_bar()
        with bar or nullcontext():
            done = calibration.calibrate(
                model, data, output, method=method, percentile=percentile, batch=batch, bins=bins, tune=tune,
                histogram=histogram, refine=refine, refine_samples=refine_samples, split_channels=split_channels,
                preprocess=pre, input_shapes=input_shape or [], samples=samples, ranges=ranges, range_only=range_only,
                save_stats=save_stats_path, bmnet=bmnet, jobs=jobs, ray=ray, target_cos=target_cos,
                max_float_layers=max_float_layers, float_patterns=float_patterns, budget=budget, fit=fit,
                depfile=depfile, on_bad_sample=on_bad_sample, progress=progress,
            )  # fmt: skip
        if as_json:
            import json

            typer.echo(json.dumps(done.record(output), indent=2))
            return
        for line in done.notes:
            typer.echo(f"npuc: note: {line}", err=True)
        for line in done.details:
            _note(line)
        for line in done.report:
            typer.echo(f"npuc: {line}", err=True)

    @group.command("merge", no_args_is_help=True)
    def merge(
        stats: Annotated[list[Path], typer.Argument(help="Statistics files written with --save-stats.")],
        output: Annotated[Path | None, typer.Option("--output", "-o", help="The cali_table to write.")] = None,
        save_stats_path: Annotated[
            Path | None, typer.Option("--save-stats", help="Write the merged statistics.")
        ] = None,
        method: Annotated[str, typer.Option("--method", help=MERGE_METHOD_HELP)] = "kl",
        percentile: Annotated[float, typer.Option("--percentile", help="Percentile for --method percentile.")] = 99.99,
    ) -> None:
        """Merge statistics shards into one table (identical to a single run) or one statistics file.

        Example: npuc calibrate merge shard0.npz shard1.npz -o model.cali_table
        """
        from npuc.api import calibration

        calibration.merge_calibration(stats, output, save_stats=save_stats_path, method=method, percentile=percentile)

    app.add_typer(group, name="calibrate")
