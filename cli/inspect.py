"""`npuc inspect PATH`: describe an ONNX model or a vendor artifact; with --target, what will not run where."""

from __future__ import annotations

from pathlib import Path

import typer

from npuc.cli.options import split_names
from npuc.compiler.errors import UserError


def coverage_report(found: dict, graph_ops: int) -> str:
    """One block per (target, format): the ops it cannot run, each with the reason the build would give."""
    lines = []
    for (target, quant), gaps in found.items():
        label = f"{target} ({quant})" if quant else target
        if not gaps:
            lines.append(f"{label}: every op runs")
            continue
        ops = [g for g in gaps if g.op is not None and g.judged]
        unjudged = [g for g in gaps if not g.judged]
        whole = [g for g in gaps if g.op is None]
        if ops:
            lines.append(f"{label}: {len(ops)} of {graph_ops} ops will not run")
        else:
            lines.append(f"{label}: the model does not build")
        for g in ops:
            after = f" (after {', '.join(g.after)}; may run once that does)" if g.after else ""
            lines.append(f"  {g.op} ({g.kind}): {g.reason}{after}")
        lines += [f"  {g.reason}" for g in whole]
        if unjudged:
            lines.append(f"  and {len(unjudged)} op(s) after those cannot be judged until they run")
    return "\n".join(lines)


def coverage_record(path: Path, found: dict) -> dict:
    """`npuc inspect MODEL --target T --json`: per (target, format) whether every op runs, and each gap."""
    from npuc.compiler.version import VERSION

    checks = [
        {"target": target, "quant": quant or None, "runs": not gaps,
         "gaps": [{"op": g.op, "kind": g.kind, "reason": g.reason, "after": list(g.after), "judged": g.judged}
                  for g in gaps]}
        for (target, quant), gaps in found.items()
    ]  # fmt: skip
    return {"npuc": VERSION, "model": str(path), "ops": found.op_count, "checks": checks}


def artifact_record(path: Path, input_shapes: list[str], output_names: list[str]) -> dict:
    """`npuc inspect PATH --json` without --target: the kind of file, its inputs as a runtime feeds them (name,
    shape, dtype, the camera frame's pixel format), and the description `npuc inspect` prints, line by line."""
    from dataclasses import asdict

    from npuc.api import inspection
    from npuc.api.shapes import as_shape_dict
    from npuc.compiler.artifacts import ArtifactOptions, detect
    from npuc.compiler.version import VERSION

    text = inspection.inspect(path, input_shapes=input_shapes, output_names=output_names)  # checks the options
    kind = detect(path)
    options = ArtifactOptions(input_shapes=as_shape_dict(input_shapes), output_names=tuple(output_names))
    inputs = [{k: list(v) if k == "shape" else v for k, v in asdict(spec).items() if v is not None}
              for spec in (kind.inputs(path, options) if kind.inputs is not None else [])]  # fmt: skip
    return {"npuc": VERSION, "path": str(path), "kind": kind.name, "runs": kind.run is not None, "inputs": inputs,
            "description": text.splitlines()}  # fmt: skip


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect(
        path: Path = typer.Argument(..., help="An .onnx model, a .cvimodel, a .bmodel or a target output folder."),
        disasm: bool = typer.Option(False, "--disasm", help="List the decoded instructions of command buffers."),
        input_shape: list[str] = typer.Option([], "--input-shape", help="Pin an input: NAME:D0,D1,... (ONNX)."),
        output_names: str = typer.Option(
            None, "--output-names", help="Comma-separated tensors to end the ONNX graph at (as `build` does)."
        ),
        target: str = typer.Option(
            None, "--target", help="Also list every op this target ('all': every target) cannot run (ONNX)."
        ),
        quant: str = typer.Option(None, "--quant", help="With --target: check this number format only."),
        chip: str = typer.Option(None, "--chip", help="With --target: check for this chip."),
        as_json: bool = typer.Option(
            False, "--json", help="Print JSON only: the file's kind, inputs and description; with --target, the checks."
        ),
    ) -> None:
        """Print what a model or artifact contains (ops, shapes, FLOPs; headers, sections, tensors).

        Example: npuc inspect model.onnx --target all   (every op each target cannot run, before calibrating)
        """
        from npuc.api import inspection

        ends = split_names(output_names)
        if target is None and (quant is not None or chip is not None):
            raise UserError("--quant and --chip go with --target T; add it or drop them")
        if as_json and target is None:
            import json

            typer.echo(json.dumps(artifact_record(path, input_shape, ends), indent=2))
            return
        if as_json:
            import json

            found = inspection.check(path, target, quant=quant, chip=chip, input_shapes=input_shape,
                                     output_names=ends)  # fmt: skip
            typer.echo(json.dumps(coverage_record(path, found), indent=2))
            return
        typer.echo(inspection.inspect(path, disasm=disasm, input_shapes=input_shape, output_names=ends))
        if target is not None:
            found = inspection.check(path, target, quant=quant, chip=chip, input_shapes=input_shape,
                                     output_names=ends)  # fmt: skip
            typer.echo(coverage_report(found, found.op_count))
