"""The rewrite registry canonicalization runs, and the graph queries its rewrites share."""

from __future__ import annotations

from collections.abc import Callable

from npuc.compiler.ir import Graph, Op

Rewrite = Callable[[Graph], int]
REWRITES: dict[str, Rewrite] = {}


def rewrite(name: str) -> Callable[[Rewrite], Rewrite]:
    def register(fn: Rewrite) -> Rewrite:
        REWRITES[name] = fn
        return fn

    return register


def sole_user(graph: Graph, name: str) -> Op | None:
    """The single op reading `name`, if exactly one does and it is not a graph output."""
    if name in graph.outputs:
        return None
    users = graph.consumers().get(name, [])
    return users[0] if len(users) == 1 else None
