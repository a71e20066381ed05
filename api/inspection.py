"""What the API does with a model or artifact that exists: describe it (`npuc inspect`), run it (`npuc run`),
and list the ops each target cannot run (`npuc inspect MODEL --target T`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from npuc.api.shapes import InputShapes, as_shape_dict
from npuc.compiler.errors import UserError

QUANT_ALIASES = {"float16": "fp16"}  # spellings a target accepts for the same format


def inspect(
    path: str | Path, disasm: bool = False, input_shapes: InputShapes = None, output_names: Sequence[str] = ()
) -> str:
    """The description `npuc inspect` prints of a model or artifact (`output_names`: an ONNX model ended there)."""
    from npuc.compiler.artifacts import ArtifactOptions, check_options, detect

    kind, options = detect(Path(path)), ArtifactOptions(disasm=disasm, input_shapes=as_shape_dict(input_shapes),
                                                        output_names=tuple(output_names))  # fmt: skip
    check_options(kind, Path(path), options)
    return kind.describe(Path(path), options)


def run(
    path: str | Path,
    feeds: Mapping[str, np.ndarray],
    input_shapes: InputShapes = None,
    output_names: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """Run an ONNX model on the float reference (ended at `output_names` when given), or an artifact on npuc's
    simulator from its bytes."""
    from npuc.compiler.artifacts import ArtifactOptions, check_options, detect

    kind = detect(Path(path))
    if kind.run is None:
        raise UserError(f"{path}: npuc cannot run {kind.name} artifacts yet; `npuc inspect` reads them")
    options = ArtifactOptions(input_shapes=as_shape_dict(input_shapes), output_names=tuple(output_names))
    check_options(kind, Path(path), options)
    return kind.run(Path(path), dict(feeds), options)


class CheckResult(dict):
    """(target, format) -> the gaps `check` found there, and how many ops the canonical graph has."""

    def __init__(self, op_count: int) -> None:
        super().__init__()
        self.op_count = op_count


def check(
    model: str | Path,
    target: str = "all",
    *,
    quant: str | None = None,
    chip: str | None = None,
    input_shapes: InputShapes = None,
    output_names: Sequence[str] = (),
) -> CheckResult:
    """Every op of an ONNX `model` that `target` ("all": every target that builds) cannot run, per number format.

    Each (target, quant) pair gets a trial build into a temporary folder, on a throwaway max-abs table from one
    seeded random sample where the format needs one; its per-op loops record each failing op instead of stopping
    (compiler/coverage.py). An empty list: the whole model builds. A `Gap` whose `op` is None stops the model as
    a whole (its input shape, an option)."""
    import tempfile

    from npuc.compiler.coverage import Gap, GapsFound, collecting
    from npuc.compiler.targets import BuildRequest, all_targets, check_request, get_target
    from npuc.frontends.onnx import import_onnx
    from npuc.passes.rewrite.canonicalize import canonicalize

    model = Path(model)
    if model.suffix.lower() != ".onnx":
        raise UserError(f"{model}: --target checks an ONNX model; convert it first or build it directly")
    if target == "all":  # --quant / --chip narrow "all" to the targets that have them
        chosen = [t for t in all_targets() if t.build is not None]
        chosen = [t for t in chosen if (quant is None or quant in t.quants) and (chip is None or chip in t.chips)]
        if not chosen:
            raise UserError(f"no target has {' and '.join(f for f in (quant, chip) if f)}; see `npuc targets`")
    else:
        chosen = [get_target(target)]
        check_request(chosen[0], {}, chip, quant, None)
    shapes = as_shape_dict(input_shapes) or None
    graph = import_onnx(model, shapes, [], tuple(output_names))
    canonicalize(graph)
    found = CheckResult(op_count=len(graph.ops))
    with tempfile.TemporaryDirectory(prefix="npuc-check-") as scratch:
        table = None
        for t in chosen:
            if t.build is None:
                raise UserError(f"target '{t.name}' cannot build yet ({t.status}); see `npuc targets`")
            for q in [quant] if quant else list(dict.fromkeys(QUANT_ALIASES.get(q, q) for q in t.quants)) or [None]:
                if t.uses_calib and q not in ("bf16", "fp16", "float32") and table is None:
                    table = _probe_table(model, shapes, Path(scratch))
                out = Path(scratch) / f"{t.name}_{q}"
                request = BuildRequest(
                    copy.deepcopy(graph), model, out, chip=chip, quant=q,
                    calib_table=table if t.uses_calib else None, output_names=tuple(output_names),
                )  # fmt: skip
                with collecting() as gaps:
                    try:
                        t.build(request)
                    except GapsFound:
                        pass
                    except UserError as exc:
                        gaps.append(Gap(None, None, str(exc)))
                found[(t.name, q or "")] = list(gaps)
    return found


def _probe_table(model: Path, shapes: dict | None, folder: Path) -> Path:
    """A max-abs calibration table from one seeded random sample: numbers only a coverage check may use."""
    from npuc.compiler.fileio import save_npz
    from npuc.passes.calibration.calibrate import CalibrationOptions, calibrate, plan_calibration
    from npuc.passes.calibration.calitable import write_table

    rng = np.random.default_rng(0)
    sample = {
        spec.name: rng.standard_normal(spec.shape).astype(spec.dtype)
        if np.dtype(spec.dtype).kind == "f"
        else np.ones(spec.shape, spec.dtype)  # token ids, masks: 1 is valid for both
        for spec in plan_calibration(model, shapes).inputs
    }
    save_npz(folder / "probe.npz", sample)
    result = calibrate(model, [folder / "probe.npz"], options=CalibrationOptions(method="max"), input_shapes=shapes)
    write_table(result.table, folder / "probe_table.txt")
    return folder / "probe_table.txt"
