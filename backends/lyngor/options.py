"""The Lyngor target's build options (the `options` dict of a BuildRequest), checked once into a dataclass.

Keys (all optional):
    input_dtype        "uint8" | "int16" | "float16" | "float32", or {input name: dtype}. The data type the
                       runtime is fed (--input-dtype). Default: float32 for float model inputs, int16 for
                       integer ones (token ids, as in Lynxi's BERT example).
    output_dtype       "float16" (default) | "float32": the data type of every output.
    input_layout       "nchw" | "nhwc", or {input name: layout}: the layout fed. Default: the model's own
                       (an NHWC model input read through Transpose(0,3,1,2) is fed NHWC). A fed NHWC layout is
                       recorded as transpose_axis (0, 3, 1, 2), the vendor's convention.
    input_shapes_list  [{input name: shape}, ...]: one entry per --input-shape set; two or more build one
                       multi-resolution artifact. Every entry must name the same inputs with the same ranks.
    parallel_mode      "DP" (default) | "MP"; run_batch: int >= 1 (default 1). Recorded in the manifests.
    delegate           True: write the shape-pinned ONNX model and build_lyngor.py for the vendor's compiler
                       (and run it when `lyngor` is importable) instead of npuc's own payload. With several
                       shape sets: one pinned model_res<i>.onnx each, built by the script into res<i>/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph

from .manifest import INPUT_DTYPES, OUTPUT_DTYPES

KNOWN_KEYS = (
    "input_dtype", "output_dtype", "input_layout", "input_shapes_list", "parallel_mode", "run_batch", "delegate",
)  # fmt: skip
LAYOUTS = ("nchw", "nhwc")
NHWC_TO_NCHW = (0, 3, 1, 2)  # transpose_axis of an NHWC-fed input (vendor convention)


@dataclass
class LyngorOptions:
    input_dtype: dict[str, str]
    output_dtype: str = "float16"
    input_layout: dict[str, str] = field(default_factory=dict)
    input_shapes_list: list[dict[str, tuple[int, ...]]] = field(default_factory=list)
    parallel_mode: str = "DP"
    run_batch: int = 1
    delegate: bool = False


def _per_input(value: Any, graph: Graph, key: str, choices: tuple[str, ...], default: dict[str, str]) -> dict[str, str]:
    if value is None:
        return dict(default)
    if isinstance(value, str):
        value = dict.fromkeys(graph.inputs, value)
    if not isinstance(value, dict):
        raise UserError(f"option {key}: expected one of {list(choices)} or a dict input name -> value")
    out = dict(default)
    for name, choice in value.items():
        if name not in graph.inputs:
            raise UserError(f"option {key}: '{name}' is not a model input; the inputs are {graph.inputs}")
        if choice not in choices:
            raise UserError(
                f"option {key}: '{choice}' for input '{name}' is not supported; choose one of {', '.join(choices)}"
            )
        out[name] = choice
    return out


def _shapes_list(value: Any, graph: Graph) -> list[dict[str, tuple[int, ...]]]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(d, dict) for d in value):
        raise UserError("option input_shapes_list: expected a list of {input name: shape} dicts, one per resolution")
    out: list[dict[str, tuple[int, ...]]] = []
    for i, shapes in enumerate(value):
        for name, shape in shapes.items():
            if name not in graph.inputs:
                raise UserError(f"input_shapes_list[{i}]: '{name}' is not a model input; the inputs are {graph.inputs}")
            if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d > 0 for d in shape):
                raise UserError(f"input_shapes_list[{i}]: shape of '{name}' must be positive integers, got {shape!r}")
        if out and set(shapes) != set(out[0]):
            raise UserError(
                f"input_shapes_list[{i}] names inputs {sorted(shapes)} but entry 0 names {sorted(out[0])}; give "
                "every --input-shape set the same inputs"
            )
        for name, shape in shapes.items():
            rank = len(out[0][name]) if out else len(graph.tensors[name].shape)
            if len(shape) != rank:
                raise UserError(
                    f"input_shapes_list[{i}]: input '{name}' has rank {len(shape)} but "
                    f"{'entry 0' if out else 'the model'} has rank {rank}; keep ranks equal across resolutions"
                )
        out.append({name: tuple(int(d) for d in shape) for name, shape in shapes.items()})
    return out


def parse_options(options: dict[str, Any], graph: Graph) -> LyngorOptions:
    """Check the user's options against the graph and fill the defaults."""
    unknown = sorted(set(options) - set(KNOWN_KEYS))
    if unknown:
        raise UserError(f"unknown lyngor option '{unknown[0]}'; the options are {', '.join(KNOWN_KEYS)}")
    default_dtypes = {
        name: "float32" if np.dtype(graph.tensors[name].dtype).kind == "f" else "int16" for name in graph.inputs
    }
    output_dtype = options.get("output_dtype", "float16")
    if output_dtype not in OUTPUT_DTYPES:
        raise UserError(f"option output_dtype: '{output_dtype}' is not supported; choose {' or '.join(OUTPUT_DTYPES)}")
    parallel_mode = options.get("parallel_mode", "DP")
    if parallel_mode not in ("DP", "MP"):
        raise UserError(f"option parallel_mode: '{parallel_mode}' is not DP or MP")
    run_batch = options.get("run_batch", 1)
    if not isinstance(run_batch, int) or isinstance(run_batch, bool) or run_batch < 1:
        raise UserError(f"option run_batch: {run_batch!r} is not an integer >= 1")
    layouts = _per_input(
        options.get("input_layout"), graph, "input_layout", LAYOUTS,
        {n: graph.input_layouts.get(n, "nchw") for n in graph.inputs},
    )  # fmt: skip
    for name, layout in layouts.items():
        if layout == "nhwc" and len(graph.tensors[name].shape) != 4:
            raise UserError(f"option input_layout: input '{name}' is not 4-D, so it cannot be fed NHWC")
    return LyngorOptions(
        input_dtype=_per_input(options.get("input_dtype"), graph, "input_dtype", INPUT_DTYPES, default_dtypes),
        output_dtype=output_dtype,
        input_layout=layouts,
        input_shapes_list=_shapes_list(options.get("input_shapes_list"), graph),
        parallel_mode=parallel_mode,
        run_batch=run_batch,
        delegate=bool(options.get("delegate", False)),
    )
