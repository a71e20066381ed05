"""ONNX frontend: load a model file, pin its input shapes, simplify it, and convert it to the npuc IR.

Steps: load (onnx_load.py: external data confined to the model's folder) → pin dynamic input dims → shape inference →
onnx-graphsurgeon clean-up (constant folding, Identity/Dropout removal, toposort) → one converter per node,
chosen by (op_type, since_version) → IR verification. Every unsupported op is reported at once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from npuc.compiler.errors import UnsupportedError, UserError
from npuc.compiler.fold import fold_constant_ops
from npuc.compiler.ir import Graph

from .onnx_load import load_model, short_reason
from .onnx_ops import ConvertContext, find_converter

InputShapes = dict[str, tuple[int, ...]]

_SHAPE_SPEC = re.compile(r"^(.+):(\d+(?:,\d+)*)$")  # the name may hold colons (TF exports: "input:0")


def parse_input_shapes(specs: Iterable[str]) -> InputShapes:
    """Parse `--input-shape name:1,3,224,224` values."""
    shapes: InputShapes = {}
    for spec in specs:
        match = _SHAPE_SPEC.match(spec.strip())
        if not match:
            raise UserError(f"bad --input-shape '{spec}': write NAME:D0,D1,... such as x:1,3,224,224")
        shapes[match.group(1)] = tuple(int(d) for d in match.group(2).split(","))
    return shapes


# ---------------------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------------------


def cut_outputs(model: onnx.ModelProto, names: Sequence[str]) -> str:
    """End the graph at the tensors `names` (tpu-mlir's --output_names): they become its outputs, and the nodes
    only the old outputs needed go with simplify()'s clean-up. Returns the note saying what was left out."""
    producers = {out: node for node in model.graph.node for out in node.output if out}
    for name in names:
        if name not in producers:
            raise UserError(
                f"--output-names '{name}' is made by no node of the model; give tensor names as Netron shows them "
                "(`npuc inspect MODEL` lists the IR's)"
            )
    if len(set(names)) != len(names):
        raise UserError("--output-names names a tensor twice; give each once")
    kept, stack = set(), list(names)
    while stack:  # the nodes the new outputs need
        node = producers.get(stack.pop())
        if node is not None and id(node) not in kept:
            kept.add(id(node))
            stack.extend(node.input)
    known = {vi.name: vi for vi in (*model.graph.value_info, *model.graph.output)}
    outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in names]
    for info in outputs:
        if info.name in known:  # the inferred type and shape
            info.CopyFrom(known[info.name])
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    left = len(model.graph.node) - len(kept)
    return f"the graph ends at {', '.join(names)} (--output-names): {left} of {len(model.graph.node)} nodes left out"


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in initializers]


def pin_input_shapes(model: onnx.ModelProto, shapes: InputShapes) -> list[str]:
    """Fix every input's dims; returns notes about defaults applied (a symbolic batch dim becomes 1)."""
    notes: list[str] = []
    inputs = {vi.name: vi for vi in _graph_inputs(model)}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise UserError(
            f"--input-shape names {', '.join(unknown)}, but the model's inputs are {', '.join(inputs)}; "
            "use one of those names"
        )
    for name, vi in inputs.items():
        dims = vi.type.tensor_type.shape.dim
        if name in shapes:
            given = shapes[name]
            if len(dims) and len(given) != len(dims):
                raise UserError(
                    f"--input-shape {name}: gives {len(given)} dims but the input has rank {len(dims)}; "
                    f"give {len(dims)} dims"
                )
            for i, d in enumerate(dims):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != given[i]:
                    raise UserError(
                        f"--input-shape {name}: dim {i} is fixed to {d.dim_value} in the model, not {given[i]}; "
                        "only dynamic dims can be changed"
                    )
            del vi.type.tensor_type.shape.dim[:]
            for d in given:
                vi.type.tensor_type.shape.dim.add().dim_value = int(d)
            continue
        for i, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            label = d.dim_param or "?"
            if i == 0 and len(dims) > 1:
                d.Clear()
                d.dim_value = 1
                notes.append(f"input '{name}': batch dim '{label}' set to 1")
                continue
            example = ",".join(str(x.dim_value) if x.dim_value > 0 else "N" for x in dims)
            raise UserError(
                f"input '{name}' dim {i} is dynamic ('{label}'); pin it with --input-shape {name}:{example}"
            )
    return notes


# ---------------------------------------------------------------------------------------------------------
# Clean-up with onnx-graphsurgeon
# ---------------------------------------------------------------------------------------------------------


def _check_acyclic(graph: onnx.GraphProto) -> None:
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    deps = [{producer[x] for x in node.input if x in producer} for node in graph.node]
    indegree = [len(d) for d in deps]
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    ready = [i for i, n in enumerate(indegree) if n == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for j in users.get(i, []):
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if seen != len(graph.node):
        stuck = [graph.node[i].name or graph.node[i].output[0] for i, n in enumerate(indegree) if n > 0]
        raise UserError(
            f"the graph has a cycle through {len(stuck)} nodes ({', '.join(stuck[:5])}"
            f"{', ...' if len(stuck) > 5 else ''}); ONNX graphs must be acyclic, re-export the model"
        )


MAX_CONSTANT_ELEMENTS = 1 << 28  # 1 GiB of float32: far above any weight; constant folding must not allocate more

# ops whose output size a constant shape input (position) decides before anything is computed
_SHAPE_MAKERS = {"ConstantOfShape": 0, "Expand": 1}


def _check_stored_values(graph: onnx.GraphProto) -> None:
    """Every initializer and Constant decodes to its declared dims, every string attribute is UTF-8: a damaged
    model fails here with the name of what is damaged, not deep inside onnx's helpers."""
    tensors = [(f"initializer '{t.name}'", t) for t in graph.initializer]
    initialized = {t.name for t in graph.initializer}
    known = set(onnx.TensorProto.DataType.values())
    for vi in [*graph.input, *graph.output]:
        if vi.name not in initialized and not vi.type.tensor_type.elem_type:
            raise UserError(f"graph input/output '{vi.name}' has no element type; the model is damaged")
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.tensor_type.elem_type not in known:
            raise UserError(
                f"tensor '{vi.name}' has unknown element type {vi.type.tensor_type.elem_type}; the model is damaged"
            )
    for index, node in enumerate(graph.node):
        try:
            names = [node.name, node.op_type, node.domain, *node.input, *node.output]
            for name in [*names, *(a.name for a in node.attribute)]:
                if not isinstance(name, str):  # protobuf hands out bytes it cannot decode
                    raise UnicodeEncodeError("utf-8", "", 0, 1, "undecodable")
                name.encode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            raise UserError(f"a name of node #{index} is not UTF-8 text; the model is damaged") from None
    for node in graph.node:
        where = f"node '{node.name or (node.output[0] if node.output else '?')}' ({node.op_type})"
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                tensors.append((f"{where} attribute '{attr.name}'", attr.t))
            for text in [attr.s, *attr.strings]:
                try:
                    text.decode("utf-8")
                except UnicodeDecodeError:
                    raise UserError(
                        f"{where}: attribute '{attr.name}' is not UTF-8 text; the model is damaged"
                    ) from None
    for where, tensor in tensors:
        if external_data_helper.uses_external_data(tensor):
            continue
        try:
            numpy_helper.to_array(tensor)
        except (ValueError, TypeError, KeyError) as exc:  # dims that disagree with the data, an unknown data_type
            raise UserError(f"{where}: its data does not decode ({short_reason(exc)}); the model is damaged") from None


def _check_constant_budget(graph: onnx.GraphProto) -> None:
    """Refuse tensors that constant folding would have to allocate beyond MAX_CONSTANT_ELEMENTS, before any
    folding: a 150-byte model can ask for a ConstantOfShape of 1e11 elements."""
    constants = {init.name: init for init in graph.initializer}
    constants.update(
        {n.output[0]: a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"}
    )
    for node in graph.node:
        position = _SHAPE_MAKERS.get(node.op_type)
        if position is None or len(node.input) <= position or node.input[position] not in constants:
            continue
        shape = constants[node.input[position]]
        if shape.data_type != onnx.TensorProto.INT64 or len(shape.dims) != 1 or shape.dims[0] > 16:
            continue  # not a plausible shape vector: the converters report it
        dims = [int(d) for d in numpy_helper.to_array(shape).reshape(-1)]
        count = 1
        for d in dims:
            count *= max(d, 1)
        if count > MAX_CONSTANT_ELEMENTS:
            raise UserError(
                f"node '{node.name or node.output[0]}' ({node.op_type}) makes a tensor of shape {dims} "
                f"({count:.3g} elements), more than the {MAX_CONSTANT_ELEMENTS} npuc allocates; the model is "
                "damaged or not an inference model"
            )


def simplify(model: onnx.ModelProto) -> onnx.ModelProto:
    """Fold constants, drop Identity/Dropout, remove dead nodes and sort topologically.

    Shape ops are left to npuc's own converter (graphsurgeon's shape folding ignores Shape's start/end);
    the converters fold them and everything computed from them eagerly.
    """
    import onnx_graphsurgeon as gs

    gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.CRITICAL
    logging.getLogger("onnx_graphsurgeon").setLevel(logging.CRITICAL)
    graph = gs.import_onnx(model)
    outputs = {t.name for t in graph.outputs}
    for node in list(graph.nodes):
        if node.op == "Identity" or (node.op == "Dropout" and len(node.outputs) == 1):
            src, dst = node.inputs[0], node.outputs[0]
            if dst.name in outputs:
                continue
            for user in list(dst.outputs):
                for i, tensor in enumerate(user.inputs):
                    if tensor is dst:
                        user.inputs[i] = src
            node.outputs.clear()
    graph.cleanup(remove_unused_graph_inputs=False)
    for _ in range(3):
        before = len(graph.nodes)
        try:
            graph.fold_constants(fold_shapes=False, error_ok=True).cleanup(remove_unused_graph_inputs=False)
        except Exception:  # graphsurgeon/onnxruntime folding failures are not the user's problem: keep going
            break
        if len(graph.nodes) == before:
            break
    graph.toposort()
    out = gs.export_onnx(graph)
    out.ir_version = model.ir_version
    del out.opset_import[:]
    out.opset_import.extend(model.opset_import)
    return out


# ---------------------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------------------


def opset_of(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return 1


def check_supported(model: onnx.ModelProto) -> None:
    """Raise one error listing every node npuc has no converter for."""
    opset = opset_of(model)
    missing = [
        f"'{node.name or node.output[0]}' {node.op_type}" + (f" [{node.domain}]" if node.domain else "")
        for node in model.graph.node
        if find_converter(node.op_type, node.domain, opset) is None
    ]
    if missing:
        kinds = sorted({m.split(" ", 1)[1] for m in missing})
        raise UnsupportedError(
            f"{len(missing)} unsupported node(s) at opset {opset} ({', '.join(kinds)}): "
            f"{'; '.join(missing[:8])}{'; ...' if len(missing) > 8 else ''}; "
            "replace these ops in the model or run `npuc inspect` to list them"
        )


def convert(model: onnx.ModelProto) -> Graph:
    """Convert a simplified, shape-pinned ONNX model to an IR graph (nodes must be toposorted)."""
    opset = opset_of(model)
    graph = Graph(name=model.graph.name or "model")
    for init in model.graph.initializer:
        graph.add_const(init.name, numpy_helper.to_array(init))
    for vi in _graph_inputs(model):
        tensor_type = vi.type.tensor_type
        dtype = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
        graph.add_tensor(vi.name, [d.dim_value for d in tensor_type.shape.dim], dtype)
        graph.inputs.append(vi.name)
        graph.input_layouts[vi.name] = "nchw"
    for node in model.graph.node:
        entry = find_converter(node.op_type, node.domain, opset)
        assert entry is not None, "check_supported runs first"
        undefined = [name for name in node.input if name and name not in graph.tensors]
        if undefined:
            raise UserError(
                f"node '{node.name or node.output[0]}' ({node.op_type}) reads '{undefined[0]}', which no input, "
                "initializer or earlier node defines; the model is damaged or not topologically sorted"
            )
        start = len(graph.ops)
        entry.fn(ConvertContext(graph, node, opset))
        fold_constant_ops(graph, graph.ops[start:])
    graph.outputs = [vi.name for vi in model.graph.output]
    missing = [name for name in graph.outputs if name not in graph.tensors]
    if missing:
        raise UserError(f"graph output '{missing[0]}' is made by no node; the model is damaged")
    graph.verify()
    return graph


def import_model(
    model: onnx.ModelProto, input_shapes: InputShapes | None = None, notes: list[str] | None = None
) -> Graph:
    """In-memory ONNX model → verified IR graph (the caller's model is left as it was)."""

    def copy() -> onnx.ModelProto:
        model_copy = onnx.ModelProto()
        model_copy.CopyFrom(model)
        return model_copy

    return _import(copy, input_shapes, notes)


# Float initializers of at least this many bytes sit out shape inference and graphsurgeon's clean-up unless
# something there may read their values (see _hollow): onnx's inference serializes and parses the whole model
# twice and graphsurgeon's export copies every initializer, which for a 45 MB model cost 0.2 s and three more
# copies of the weights.
_HOLLOW_BYTES = 4096
_FLOAT_TYPES = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
)
# graphsurgeon's cast elision rewrites the float constants of these ops when Casts surround them
_CAST_ELISION_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Greater", "Less", "Concat"})


def _value_readers(graph: onnx.GraphProto) -> set[str] | None:
    """Initializers whose values shape inference or simplify() may read: inputs of every node that constant
    folding could reach (all inputs constant, transitively) and, when the model has Casts, of the ops cast
    elision rewrites. None (read them all) when a node carries a subgraph."""
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return None
    constant = {t.name for t in graph.initializer} | {""}
    readers: set[str] = set()
    grew = True
    while grew:
        grew = False
        for node in graph.node:
            if all(name in constant for name in node.input) and not set(node.output) <= constant:
                constant.update(node.output)
                readers.update(node.input)
                grew = True
    if any(node.op_type == "Cast" for node in graph.node):
        readers.update(name for n in graph.node if n.op_type in _CAST_ELISION_OPS for name in n.input)
    return readers


def _hollow(model: onnx.ModelProto) -> dict[str, bytes]:
    """Move the raw data of the large float initializers nothing reads out of the model: {name: bytes}."""
    initializers = model.graph.initializer
    readers = _value_readers(model.graph)
    if readers is None or len({t.name for t in initializers}) != len(initializers):
        return {}
    held: dict[str, bytes] = {}
    for tensor in initializers:
        if tensor.data_type in _FLOAT_TYPES and tensor.name not in readers and len(tensor.raw_data) >= _HOLLOW_BYTES:
            held[tensor.name] = tensor.raw_data
            tensor.ClearField("raw_data")
    return held


def _refill(model: onnx.ModelProto, held: dict[str, bytes]) -> None:
    """Put the data _hollow moved out back, dropping each held copy as soon as it is in."""
    for tensor in model.graph.initializer:
        if tensor.name in held:
            assert not tensor.raw_data, "the hollowed initializer kept its place and stayed empty"
            tensor.raw_data = held.pop(tensor.name)


def _import(load: Callable[[], onnx.ModelProto], input_shapes: InputShapes | None, notes: list[str] | None,
            output_names: Sequence[str] = ()) -> Graph:  # fmt: skip
    """load() → verified IR graph (ending at `output_names` when given). The loaded model is owned here: each stage
    drops the previous one's model, so no more than two copies of the weights are alive at a time."""
    model = load()
    applied = pin_input_shapes(model, input_shapes or {})
    if notes is not None:
        notes.extend(applied)
    _check_acyclic(model.graph)
    _check_stored_values(model.graph)
    _check_constant_budget(model.graph)
    held = _hollow(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # onnx raises several types for inconsistent models
        raise UserError(f"shape inference failed: {short_reason(exc)}; check --input-shape against the model") from None
    del model  # the loaded model's arena, weights included
    if output_names:
        cut = cut_outputs(inferred, output_names)
        if notes is not None:
            notes.append(cut)
    try:
        model = _simplified(inferred)
        del inferred
        _refill(model, held)
        del held
        check_supported(model)
        return convert(model)
    except UnicodeDecodeError:  # protobuf hands out undecodable strings lazily, from any string field
        raise UserError("a name or string in the model is not UTF-8 text; the model is damaged") from None


def _simplified(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return simplify(model)
    except (UnboundLocalError, KeyError, IndexError, TypeError, ValueError) as exc:
        # graphsurgeon's import/export of a damaged graph (a tensor of no kind, a dangling reference)
        raise UserError(f"the model's graph does not import ({short_reason(exc)}); the model is damaged") from None


def import_onnx(
    path: str | Path,
    input_shapes: InputShapes | None = None,
    notes: list[str] | None = None,
    output_names: Sequence[str] = (),
) -> Graph:
    """ONNX file → verified IR graph; `output_names`: end it at these tensors (cut_outputs)."""
    graph = _import(lambda: load_model(path), input_shapes, notes, output_names)
    if graph.name == "model":
        graph.name = Path(path).stem
    return graph
