"""The package's imports run one way: no module reaches back, directly or through others, to one that imports
it, and the layers stack as cli -> api -> backends -> passes -> frontends -> compiler (the core): a module
imports its own layer or a lower one, never a higher one. Function-level imports count (a lazy import is still
a dependency), and so do imports only for type checking (an annotation that needs the other module is a
dependency too). Registries that import by module name (compiler/targets,
compiler/artifacts, passes/quantization/quantize SCHEME_MODULES, passes/export/qdq EXACT_WRITER_MODULES) are
how a lower layer reaches the backends: those modules register themselves, the lower layer never names their
contents."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {"tests", "bench", ".venv", "build", "out"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if SKIP & set(rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(["npuc", *parts])] = path
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name not in modules:
            if "." not in name:
                return None
            name = name.rsplit(".", 1)[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package[: len(package) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import sub` runs pkg/__init__ as well: an edge to the package and to the submodule
                targets = [resolve(f"{base}.{a.name}") or resolve(base) for a in node.names] + [resolve(base)]
            else:
                continue
            graph[module] |= {t for t in targets if t and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# Top to bottom; each module belongs to the first layer one of whose prefixes it equals or starts with. The
# package root (`npuc`: `__version__`, and the API's names on first use), `python -m npuc` and the test-model
# generators (models/) sit on top with the CLI.
LAYERS = (
    ("cli", ("npuc", "npuc.__main__", "npuc.cli", "npuc.models")),
    ("api", ("npuc.api",)),
    ("backends", ("npuc.backends",)),
    ("passes", ("npuc.passes",)),
    ("frontends", ("npuc.frontends",)),
    ("compiler", ("npuc.compiler", "npuc.templates")),
)


def layer_of(module: str) -> int:
    """The index in LAYERS (0 is the top) of the most specific prefix that names `module`."""
    best, rank = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    if rank is None:
        raise AssertionError(f"{module} is in no layer; add its package to LAYERS")
    return rank


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module by one in a lower layer."""
    found = []
    for module, targets in sorted(graph.items()):
        low = layer_of(module)
        for target in sorted(targets):
            high = layer_of(target)
            if high < low:
                found.append(f"{module} ({LAYERS[low][0]}) imports {target} ({LAYERS[high][0]})")
    return found


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_importing_from_a_package_counts_its_init() -> None:
    """`from pkg import sub` inside a module that pkg/__init__ imports is a cycle through the package."""
    graph = import_graph()
    graph["npuc.backends.cv18xx.kernels.conv"].add("npuc.backends.cv18xx.kernels")
    assert any("npuc.backends.cv18xx.kernels" in component for component in cycles(graph))


def test_the_check_sees_a_cycle() -> None:
    graph = import_graph()
    assert "npuc.backends.cv18xx.codegen" in graph["npuc.backends.cv18xx.kernels.conv"]  # it reads real edges
    graph["npuc.backends.cv18xx.codegen"].add("npuc.backends.cv18xx.kernels.conv")
    pair = {"npuc.backends.cv18xx.codegen", "npuc.backends.cv18xx.kernels.conv"}
    assert any(pair <= set(component) for component in cycles(graph))


def test_layers_import_downwards() -> None:
    assert upward_imports(import_graph()) == []


def test_the_check_sees_an_upward_import() -> None:
    graph = import_graph()
    assert upward_imports(graph) == []
    graph["npuc.compiler.ir"].add("npuc.passes.rewrite.canonicalize")
    assert upward_imports(graph) == ["npuc.compiler.ir (compiler) imports npuc.passes.rewrite.canonicalize (passes)"]
