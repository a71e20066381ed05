"""Helpers for the cv18xx build tests: generated models, in-process calibration, build, reference."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx

from npuc.backends.cv18xx.build import compile_cvimodel
from npuc.compiler.interp import run
from npuc.compiler.ir import Graph
from npuc.compiler.kernels.quantized import QUANT_KERNELS
from npuc.compiler.targets import BuildRequest
from npuc.frontends.onnx import import_onnx
from npuc.models.make_models import make_model
from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate, tensor_table_names
from npuc.passes.calibration.calitable import read_table, write_table
from npuc.passes.quantization.quantize import quantize
from npuc.passes.rewrite.canonicalize import canonicalize


def float_graph(model: Path, shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    graph = import_onnx(model, shapes, [])
    canonicalize(graph)
    return graph


def random_feeds(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(graph.shape(name)).astype(np.float32) for name in graph.inputs}


def generated_model(name: str, folder: Path) -> tuple[Path, Path]:
    """(model, calibration table from 8 random samples, max method) of a generated model."""
    model = folder / f"{name}.onnx"
    onnx.save(make_model(name), model)
    return model, calibrated(model, folder)


def calibrated(model: Path, folder: Path) -> Path:
    """A calibration table of `model` from 8 random samples (max method)."""
    name = model.stem
    graph = float_graph(model)
    samples = []
    for i in range(8):
        path = folder / f"{name}_sample{i}.npz"
        np.savez(path, **random_feeds(graph, i))
        samples.append(path)
    result = calibrate(model, samples, options=CalibrationOptions(method="max"))
    table = folder / f"{name}_cali_table.txt"
    write_table(result.table, table)
    return table


def build(model: Path, table: Path | None, chip: str, quant: str, out: Path,
          shapes: dict[str, tuple[int, ...]] | None = None, **options: object) -> Path:  # fmt: skip
    request = BuildRequest(float_graph(model, shapes), model, out, chip=chip, quant=quant, calib_table=table,
                           options=dict(options))  # fmt: skip
    data, _ = compile_cvimodel(request)
    out.write_bytes(data)
    return out


def quantized_reference(model: Path, table: Path, feeds: dict[str, np.ndarray],
                        shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Every tensor of npuc's int8 reference for the model (the int8 outputs are named `<output>_i8`)."""
    names = tensor_table_names(onnx.load(str(model), load_external_data=False))
    qgraph = quantize(copy.deepcopy(float_graph(model, shapes)), read_table(table), "cv18xx_int8", table_names=names)
    return run(qgraph, feeds, keep_all=True, kernels=QUANT_KERNELS)


def real_model_shapes(name: str) -> dict[str, tuple[int, ...]]:
    from npuc.models.fetch import REAL_MODELS

    spec = REAL_MODELS[name]
    return spec.input_shapes


def real_model_table(name: str, model: Path, folder: Path, samples: int = 4) -> tuple[Path, list[dict]]:
    """A KL calibration table of a real model from its real preprocessed images, and those feeds."""
    from npuc.models.images import model_inputs

    feeds = model_inputs(name, samples)
    paths = []
    for i, feed in enumerate(feeds):
        path = folder / f"{name}_sample{i}.npz"
        np.savez(path, **feed)
        paths.append(path)
    result = calibrate(model, paths, options=CalibrationOptions(method="kl"), input_shapes=real_model_shapes(name))
    table = folder / f"{name}_cali_table.txt"
    write_table(result.table, table)
    return table, feeds
