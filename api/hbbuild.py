"""What an hb_mapper config fills in a build request: the network name, march, inputs, the output path and
the calibration table — made from cal_data_dir, or reused while the model, samples, preprocessing and method it
records are unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npuc.api.hbcalib import calibrate_config, calibration_inputs, config_feeds
from npuc.compiler.errors import UserError
from npuc.frontends.hbconfig import HbConfig
from npuc.passes.calibration.calitable import read_table, write_table


def apply_config(
    hb: HbConfig,
    model: Path,
    target: str,
    options: dict[str, Any],
    notes: list[str],
    output: str | Path | None,
    calib: Path | None,
    recalibrate: bool = False,
) -> tuple[Path, Path | None]:
    """Fill what the request left open from the config: name, output, inputs, calibration table (the one in
    working_dir is reused while the model, samples, preprocessing and method it records are unchanged, unless
    `recalibrate`)."""
    options.setdefault("name", hb.output_prefix)
    options.setdefault("march", hb.march)
    options["hb_inputs"] = hb.inputs
    if hb.per_channel and target == "bpu":  # the channel ranges are measured on the samples of the table
        options.setdefault("act_scale", "channel")
        options.setdefault("calib_feeds", lambda: config_feeds(hb))
    elif hb.per_channel:
        notes.append(f"{hb.source.name}: calibration_parameters.per_channel: target {target} has per-tensor "
                     "activations (per-channel ones are the bpu target's), ignored")  # fmt: skip
    notes.extend(f"{hb.source.name}: {line}" for line in hb.ignored)
    if output is None or (calib is None and hb.cal_data_dir is not None):
        hb.working_dir.mkdir(parents=True, exist_ok=True)
    if calib is None and hb.cal_data_dir is not None:
        calib = hb.working_dir / f"{hb.output_prefix}_cali_table.txt"
        inputs = calibration_inputs(hb, model)
        try:
            recorded = read_table(calib).inputs if calib.is_file() and not recalibrate else None
        except UserError:  # a damaged table of an earlier run is made again
            recorded = None
        if recorded == inputs:
            notes.append(f"reused {calib}: same model, samples, preprocessing and method (--recalibrate redoes it)")
        else:
            table = calibrate_config(hb, model)
            table.inputs = inputs
            write_table(table, calib)
            notes.append(f"calibrated on {hb.cal_data_dir} ({hb.calib_method[0]}): {calib}")
    return Path(output) if output is not None else hb.working_dir / f"{hb.output_prefix}_{target}", calib
