"""Integer model inputs on CV18xx (token ids, attention masks), settled on the float graph before quantizing.

The TPU reads int8 and bf16 only, so an integer input is one of:
- the indices of embedding lookups (Gather on a constant table): it stays integer and the cvimodel takes it
  as int32, which the runtime's CPU `embedding` routine reads;
- cast to float wherever it is used (after reshapes and broadcasts): the cvimodel takes it as float32 and
  the casts go;
- returned unchanged as a model output (transformer exports echo their ids and mask): that output is left
  out — the caller has it already.
Each change is a note of the build; any other use is an error naming the input.
"""

from __future__ import annotations

from npuc.compiler import ops
from npuc.compiler.errors import UserError
from npuc.compiler.ir import Graph, Op

MOVES = ("reshape", "expand", "transpose", "slice")  # ops that move values without computing on them
INTEGER_DTYPES = ("int64", "int32", "int16", "uint16", "uint32", "uint8")


def _uses(graph: Graph, consumers: dict[str, list[Op]], name: str) -> tuple[list[Op], list[Op], list[str], list[Op]]:
    """(gathers indexing with it, casts to float, graph outputs echoing it, other ops) from `name`, through
    value-moving ops."""
    gathers, casts, echoes, others = [], [], [], []
    pending, seen = [name], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in graph.outputs:
            echoes.append(current)
        for op in consumers.get(current, []):
            if op.kind == "gather" and op.inputs[1:] == [current] and graph.const(op.inputs[0]) is not None:
                gathers.append(op)
            elif op.kind == "cast" and graph.tensors[op.outputs[0]].dtype.startswith("float"):
                casts.append(op)
            elif op.kind in MOVES and op.inputs[0] == current:
                pending.append(op.outputs[0])
            else:
                others.append(op)
    return gathers, casts, echoes, others


def settle_integer_inputs(graph: Graph) -> list[str]:
    """Rewrite `graph` as the module docstring says; returns the notes for the build summary."""
    notes = []
    consumers = graph.consumers()
    for name in graph.inputs:
        if graph.tensors[name].dtype not in INTEGER_DTYPES:
            continue
        gathers, casts, echoes, others = _uses(graph, consumers, name)
        if others or (gathers and casts):
            what = others[0] if others else casts[0]
            raise UserError(
                f"integer input '{name}' feeds op '{what.name}' ({what.kind}); on cv18xx an integer input can only "
                "index embedding tables (Gather) or be cast to float: cast it in the model before that op"
            )
        for output in echoes:
            graph.outputs.remove(output)
        if echoes:
            notes.append(f"output(s) {', '.join(echoes)} return input '{name}' unchanged; the cvimodel leaves them out")
        if casts:
            _as_float(graph, name, casts)
            notes.append(f"input '{name}' ({graph.tensors[name].dtype} in the model) is only used cast to float: the "
                         "cvimodel takes it as float32")  # fmt: skip
            graph.tensors[name].dtype = "float32"
        elif gathers:
            notes.append(f"input '{name}' indexes embedding tables: the cvimodel takes it as int32 (the runtime's CPU "
                         "embedding routine reads it)")  # fmt: skip
    graph.prune()
    return notes


def _as_float(graph: Graph, name: str, casts: list[Op]) -> None:
    """The input and every tensor moved from it become float32; the casts become plain reshapes."""
    producers = graph.producers()
    for cast in casts:
        cast.kind, cast.attrs = "reshape", ops.Reshape(graph.shape(cast.outputs[0]))
        current = cast.inputs[0]
        while current != name:  # the moves between the input and the cast carry floats now
            graph.tensors[current].dtype = "float32"
            current = producers[current].inputs[0]
