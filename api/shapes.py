"""Input shapes as the API takes them: "NAME:D0,D1,..." strings (an input named again starts another
resolution) or {name: dims}."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

InputShapes = Sequence[str] | Mapping[str, Sequence[int]] | None


def shape_specs(shapes: InputShapes) -> list[str]:
    if shapes is None:
        return []
    if isinstance(shapes, Mapping):
        return [f"{name}:{','.join(str(int(d)) for d in dims)}" for name, dims in shapes.items()]
    return list(shapes)


def as_shape_dict(shapes: InputShapes) -> dict[str, tuple[int, ...]]:
    from npuc.frontends.onnx import parse_input_shapes

    return parse_input_shapes(shape_specs(shapes))


def resolution_sets(specs: list[str]) -> list[dict[str, tuple[int, ...]]]:
    """Repeated shapes for the same input start a new set (one per resolution)."""
    from npuc.frontends.onnx import parse_input_shapes

    sets: list[dict[str, tuple[int, ...]]] = []
    for spec in specs:
        ((name, shape),) = parse_input_shapes([spec]).items()
        if not sets or name in sets[-1]:
            sets.append({})
        sets[-1][name] = shape
    return sets
