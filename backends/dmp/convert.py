"""Input convert policies of the DMP network API and the conv v1 u8→fp16 table they fill (spec §1.4).

With a policy other than "none" the network is fed uint8 pixels; the first conv's `dmp_dv_cmdraw_conv_v1`
points `u8tofp16_table` at 6x256 bytes in the weights memory: 3 channels x 256 fp16 entries, entry i of
channel c being the fp16 value pixel value i becomes. Each policy is one formula over i.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npuc.compiler.errors import UserError

TABLE_CHANNELS = 3
TABLE_BYTES = TABLE_CHANNELS * 256 * 2  # 6x256 bytes, the driver's minimum

# name -> f(i, mean, scale): i is a (3, 256) float64 grid of pixel values, mean/scale are (3, 1)
Formula = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
POLICIES: dict[str, Formula] = {
    "div_255": lambda i, mean, scale: i / 255.0,
    "minus_128": lambda i, mean, scale: i - 128.0,
    "minus_128_div_128": lambda i, mean, scale: (i - 128.0) / 128.0,
    "minus_127_5_div_128": lambda i, mean, scale: (i - 127.5) / 128.0,
    "direct": lambda i, mean, scale: i,
    "mean_scale": lambda i, mean, scale: (i - mean) * scale,
}
CHOICES = ("none", *POLICIES)


def _per_channel(value: Any, key: str) -> list[float]:
    """One number or a list of 1 or 3 numbers, as 3 floats."""
    items = value if isinstance(value, (list, tuple)) else [value]
    ok = len(items) in (1, TABLE_CHANNELS) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in items
    )
    if not ok:
        raise UserError(f"option {key}={value!r}: give one number or three (one per channel), e.g. {key}=[1,2,3]")
    return [float(v) for v in np.broadcast_to(np.asarray(items, np.float64), (TABLE_CHANNELS,))]


def input_convert(options: dict[str, Any]) -> dict[str, Any]:
    """The convert settings from the target options: {} for fp16 input, else policy, mean, scale, color."""
    if "convert" in options and "input_convert" in options and options["convert"] != options["input_convert"]:
        raise UserError("options convert and input_convert disagree; give only convert=POLICY")
    custom = [k for k in ("mean", "scale") if k in options]
    dtype = options.get("input_dtype")
    if dtype not in (None, "uint8", "float16"):
        raise UserError(f"--input-dtype {dtype} is not a DMP input; use uint8 (pixels through the u8->fp16 table) or "
                        "leave it out (fp16 input)")  # fmt: skip
    # --mean/--scale (or --input-dtype uint8, the tpu-mlir spelling) describe the mean_scale policy
    default = "mean_scale" if custom or dtype == "uint8" else "none"
    policy = options.get("convert", options.get("input_convert", default))
    if dtype == "float16" and policy != "none" or dtype == "uint8" and policy == "none":
        raise UserError(f"--input-dtype {dtype} contradicts convert={policy}; keep one")
    if policy not in CHOICES:
        raise UserError(f"option convert='{policy}' is not a DMP convert policy; choose one of {', '.join(CHOICES)}")
    color = options.get("color", "rgb")
    if color not in ("rgb", "bgr"):
        raise UserError(f"option color='{color}' must be rgb or bgr")
    if custom and policy != "mean_scale":
        raise UserError(f"option {custom[0]} only applies to convert=mean_scale, not convert={policy}")
    if policy == "none":
        if color != "rgb":
            raise UserError("option color=bgr needs a uint8 convert policy (e.g. convert=div_255)")
        return {}
    return {
        "policy": policy,
        "mean": _per_channel(options.get("mean", 0.0), "mean"),
        "scale": _per_channel(options.get("scale", 1.0), "scale"),
        "color": color,
    }


def u8_table(convert: dict[str, Any], channels: int) -> bytes:
    """The 6x256-byte table: row c holds fp16(policy(i)) for i = 0..255 (rows beyond `channels` still filled)."""
    if channels > TABLE_CHANNELS:
        raise UserError(
            f"the u8→fp16 input table converts at most {TABLE_CHANNELS} channels; this input has {channels}, "
            "so build without convert"
        )
    policy = POLICIES.get(convert.get("policy", ""))
    if policy is None:
        raise UserError(f"convert policy {convert.get('policy')!r} is unknown; choose one of {', '.join(POLICIES)}")
    grid = np.broadcast_to(np.arange(256, dtype=np.float64), (TABLE_CHANNELS, 256))
    mean = np.asarray(convert.get("mean", [0.0] * 3), np.float64).reshape(TABLE_CHANNELS, 1)
    scale = np.asarray(convert.get("scale", [1.0] * 3), np.float64).reshape(TABLE_CHANNELS, 1)
    return np.ascontiguousarray(policy(grid, mean, scale).astype(np.float16)).tobytes()
