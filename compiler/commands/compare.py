"""`npuc compare MODEL --target cv18xx --calib TABLE --data DIR [--json]`: quantized reference vs float.

For every sample in DIR (.npz keyed by input name, or .npy for a one-input model) the model runs on
onnxruntime (float) and on the quantized reference interpreter. Per output: cosine, SQNR, max abs error and
top-1 agreement; per layer (every quantized tensor the float IR also has): cosine, SQNR and max error, worst
first. Statistics are pooled over all samples.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from npuc.compiler.errors import UserError
from npuc.compiler.fileio import load_arrays
from npuc.compiler.interp import run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.kernels.quantized.formats import convert
from npuc.frontends.onnx import import_onnx
from npuc.passes.calitable import read_table
from npuc.passes.canonicalize import canonicalize
from npuc.passes.quantize import quantize

# target -> quantize name -> scheme
TARGET_SCHEMES = {"cv18xx": {"int8": "cv18xx_int8", "bf16": "cv18xx_bf16"}}


@dataclass
class Agreement:
    """Pooled similarity of a quantized tensor to its float reference."""

    name: str
    cosine: float = 0.0
    sqnr_db: float = 0.0
    max_abs_error: float = 0.0
    top1_agreement: float | None = None
    _dot: float = field(default=0.0, repr=False)
    _ref2: float = field(default=0.0, repr=False)
    _q2: float = field(default=0.0, repr=False)
    _err2: float = field(default=0.0, repr=False)
    _top1: list[bool] = field(default_factory=list, repr=False)

    def add(self, ref: np.ndarray, quant: np.ndarray, top1: bool = False) -> None:
        r, q = ref.astype(np.float64).ravel(), quant.astype(np.float64).ravel()
        self._dot += float(r @ q)
        self._ref2 += float(r @ r)
        self._q2 += float(q @ q)
        self._err2 += float((r - q) @ (r - q))
        self.max_abs_error = max(self.max_abs_error, float(np.abs(r - q).max(initial=0.0)))
        if top1:
            batch = ref.shape[0] if ref.ndim > 1 else 1
            self._top1 += list(ref.reshape(batch, -1).argmax(1) == quant.reshape(batch, -1).argmax(1))
        norm = np.sqrt(self._ref2 * self._q2)
        self.cosine = self._dot / norm if norm else float(self._ref2 == self._q2)
        self.sqnr_db = 10 * np.log10(self._ref2 / self._err2) if self._err2 else float("inf")
        self.top1_agreement = float(np.mean(self._top1)) if self._top1 else None

    def public(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


@dataclass
class CompareReport:
    samples: int
    outputs: list[Agreement]
    layers: list[Agreement]  # worst cosine first


def load_samples(folder: Path, inputs: list[str]) -> list[dict[str, np.ndarray]]:
    """One feed per .npz/.npy file of `folder`, in file-name order."""
    if not folder.is_dir():
        raise UserError(f"--data {folder}: not a folder; give a folder of .npz/.npy samples")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".npz", ".npy"))
    if not files:
        raise UserError(f"--data {folder}: no .npz or .npy files; save samples with numpy.savez(input=...)")
    feeds = []
    for path in files:
        arrays = load_arrays(path)
        if len(inputs) == 1 and len(arrays) == 1:
            feeds.append({inputs[0]: next(iter(arrays.values()))})
            continue
        missing = [n for n in inputs if n not in arrays]
        if missing:
            raise UserError(f"{path}: no array for input(s) {missing}; the keys must be the model's input names")
        feeds.append({n: arrays[n] for n in inputs})
    return feeds


def _float_outputs(model: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed)))


def _as_float(qgraph: Graph, name: str, value: np.ndarray) -> np.ndarray:
    fmt = qgraph.tensors[name].quant
    if fmt is not None and fmt.scheme == "int8_sym":
        return value.astype(np.float32) * np.float32(fmt.threshold / 127.0)
    return convert(value, fmt, None)


def compare_model(
    model: Path,
    table: Path,
    data: Path,
    target: str = "cv18xx",
    quant: str = "int8",
    float_layers: Iterable[str] = (),
) -> CompareReport:
    """Quantize `model` with `table` and compare it with the float model on every sample in `data`."""
    schemes = TARGET_SCHEMES.get(target)
    if schemes is None or quant not in schemes:
        raise UserError(f"--target {target} --quant {quant}: not supported; use --target cv18xx --quant int8|bf16")
    graph = import_onnx(model)
    canonicalize(graph)
    qgraph = quantize(graph, read_table(table), schemes[quant], float_layers)
    feeds = load_samples(data, graph.inputs)
    outputs = {name: Agreement(name) for name in graph.outputs}
    layers: dict[str, Agreement] = {}
    for feed in feeds:
        ref_out = _float_outputs(model, feed)
        ref_all = run(graph, feed, keep_all=True)
        q_all = run(qgraph, feed, keep_all=True, kernels=QUANT_KERNELS)
        for name, agreement in outputs.items():
            agreement.add(ref_out[name], q_all[name], top1=True)
        for name, value in q_all.items():
            if name in ref_all and name not in graph.inputs and qgraph.tensors[name].quant is not None:
                layers.setdefault(name, Agreement(name)).add(ref_all[name], _as_float(qgraph, name, value))
    ranked = sorted(layers.values(), key=lambda a: (a.cosine, a.name))
    return CompareReport(len(feeds), list(outputs.values()), ranked)


def _text(report: CompareReport) -> str:
    def row(a: Agreement) -> str:
        top1 = "" if a.top1_agreement is None else f"  top1 {a.top1_agreement:.3f}"
        return f"  {a.name:<32} cos {a.cosine:.6f}  sqnr {a.sqnr_db:7.2f} dB  max err {a.max_abs_error:.6g}{top1}"

    lines = [f"{report.samples} sample(s)", "outputs:", *map(row, report.outputs), "layers (worst first):"]
    return "\n".join(lines + [row(a) for a in report.layers])


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare(
        model: Annotated[Path, typer.Argument(help="The float .onnx model.")],
        calib: Annotated[Path, typer.Option("--calib", help="Calibration table (tpu-mlir cali_table format).")],
        data: Annotated[Path, typer.Option("--data", help="Folder of .npz (keys = input names) or .npy samples.")],
        target: Annotated[str, typer.Option("--target", help="Target whose quantized arithmetic to use.")] = "cv18xx",
        quant: Annotated[str, typer.Option("--quant", help="int8 or bf16.")] = "int8",
        float_layer: Annotated[
            list[str] | None, typer.Option("--float-layer", help="Keep this op or tensor in bf16.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
    ) -> None:
        """Per-output and per-layer agreement of the quantized reference with onnxruntime float."""
        report = compare_model(model, calib, data, target, quant, float_layer or ())
        if as_json:
            payload = {
                "samples": report.samples,
                "outputs": [a.public() for a in report.outputs],
                "layers": [a.public() for a in report.layers],
            }
            typer.echo(json.dumps(payload, indent=2))
        else:
            typer.echo(_text(report))
