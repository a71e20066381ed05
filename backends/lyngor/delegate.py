"""Delegate mode: hand the model to Lynxi's own compiler.

The output folder receives `model.onnx` (the input model with its shapes pinned and the frontend's ONNX-level
clean-up applied: constants folded, Identity/Dropout removed, nodes sorted) and `build_lyngor.py`, rendered from
templates/lyngor/build_lyngor.py.j2, which calls `lyn.DLModel().load(...)` and `lyn.Builder(target="apu")
.build(...)` with the same input names, shapes, dtypes and transposes as a native npuc build. When `lyngor` is
importable here, the script runs (out_path = the output folder) and the vendor's tree is checked with
`manifest.read_tree` before the folder is moved into place.

Several --input-shape sets (multi-resolution): the public Lyngor API documents no argument that compiles several
shape sets into one build, so the folder holds one pinned model per set (`model_res<i>.onnx`) and the script
runs one load + build per set, into `<out>/res<i>/`; each of those vendor trees is validated.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import onnx

from npuc.compiler import interp
from npuc.compiler.errors import UserError
from npuc.compiler.fileio import atomic_write_tree
from npuc.compiler.sanitize import py_string
from npuc.compiler.targets import BuildRequest, BuildResult

from .manifest import read_tree
from .options import NHWC_TO_NCHW, LyngorOptions

MODEL_FILE = "model.onnx"
SCRIPT_FILE = "build_lyngor.py"
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
# fed layout -> layout of the ONNX model's input: the vendor's transpose_axis
_TRANSPOSE = {("nhwc", "nchw"): NHWC_TO_NCHW, ("nchw", "nhwc"): (0, 2, 3, 1)}


def pinned_model(request: BuildRequest, shapes: dict[str, tuple[int, ...]]) -> bytes:
    """The request's ONNX model with `shapes` pinned and the frontend's ONNX clean-up applied, serialized."""
    from npuc.frontends.onnx import pin_input_shapes, simplify
    from npuc.frontends.onnx_load import load_model

    model = load_model(request.model_path)
    pin_input_shapes(model, shapes)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # onnx raises several types for inconsistent models
        raise UserError(
            f"{request.model_path}: shape inference failed ({str(exc)[:80]}); check --input-shape"
        ) from None
    return simplify(model).SerializeToString(deterministic=True)


def model_file(index: int, count: int) -> str:
    """The pinned model of resolution `index` of `count`: model.onnx, or model_res<i>.onnx for several."""
    return MODEL_FILE if count == 1 else f"model_res{index}.onnx"


def render_script(
    resolutions: list[list[tuple[str, tuple[int, ...]]]],
    in_types: list[str],
    out_type: str,
    transposes: list[tuple[int, ...] | None],
    run_batch: int = 1,
) -> str:
    """build_lyngor.py for one (input name, shape) list per resolution, same names, dtypes and transposes."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["py_string"] = py_string  # names in the generated Python: one literal each, never raw text
    in_type = json.dumps(in_types[0] if len(set(in_types)) == 1 else in_types)  # one string, or one per input
    transpose_axis = None
    if any(transposes):
        first = resolutions[0]
        transpose_axis = repr([t or tuple(range(len(shape))) for t, (_, shape) in zip(transposes, first)])
    return env.get_template("lyngor/build_lyngor.py.j2").render(
        resolutions=[
            {"model": model_file(i, len(resolutions)), "inputs": [(name, repr(tuple(shape))) for name, shape in res]}
            for i, res in enumerate(resolutions)
        ],
        in_type=in_type,
        out_type=out_type,
        transpose_axis=transpose_axis,
        build_mode="abc",
        run_batch=run_batch,
    )


def vendor_trees(folder: Path, count: int) -> list[Path]:
    """Where build_lyngor.py puts the vendor's trees: the folder itself, or res<i>/ per resolution."""
    return [folder] if count == 1 else [folder / f"res{i}" for i in range(count)]


def _run_vendor(folder: Path, count: int) -> None:
    spec = importlib.util.find_spec("lyngor")
    assert spec is not None
    env = dict(os.environ)
    if spec.submodule_search_locations:
        location = Path(next(iter(spec.submodule_search_locations))).parent
    else:
        location = Path(spec.origin or ".").parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(location), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(folder / SCRIPT_FILE), str(folder)], cwd=folder, env=env, capture_output=True, text=True
    )
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"the vendor's Lyngor build failed (exit {proc.returncode}): {last}; see {SCRIPT_FILE}")
    for tree in vendor_trees(folder, count):
        read_tree(tree)  # each vendor tree must have the documented manifests


def build_delegate(request: BuildRequest, opts: LyngorOptions) -> BuildResult:
    graph = request.graph
    shape_sets = opts.input_shapes_list or [{}]
    resolutions = [
        {n: tuple(shapes.get(n, interp.external_shape(graph, n))) for n in graph.inputs} for shapes in shape_sets
    ]
    model_layouts = {n: graph.input_layouts.get(n, "nchw") for n in graph.inputs}
    transposes = [_TRANSPOSE.get((opts.input_layout[n], model_layouts[n])) for n in graph.inputs]
    script = render_script(
        [[(n, shapes[n]) for n in graph.inputs] for shapes in resolutions],
        [opts.input_dtype[n] for n in graph.inputs],
        opts.output_dtype,
        transposes,
        opts.run_batch,
    )
    files = {model_file(i, len(resolutions)): pinned_model(request, shapes) for i, shapes in enumerate(resolutions)}
    files[SCRIPT_FILE] = script.encode()
    vendor = importlib.util.find_spec("lyngor") is not None
    finish = (lambda folder: _run_vendor(folder, len(resolutions))) if vendor else None
    atomic_write_tree(request.output, files, finish, what="a Lyngor build")
    summary = {"target": "lyngor", "delegate": True, "vendor_built": vendor, "resolutions": len(resolutions)}
    return BuildResult([Path(request.output)], summary, chip="ka200", quant="fp16")
