"""The import graph of a package, read from its source: who imports whom, in which layer.

Every ``import`` statement counts, at the top of a file or inside a function (a deferred import still
ties the two modules together), except those under ``if TYPE_CHECKING:`` (never run). A package's
layers are declared in its ``__init__.py`` (``LAYERS``: top, the entry points, to bottom, the leaves);
a module may import modules of its own layer or below, never above. Used by tests/test_layering.py
and scripts/structure_report.py.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                out.update(id(n) for n in ast.walk(stmt))
    return out


def imports(path: pathlib.Path) -> list[tuple[ast.stmt, bool, list[str]]]:
    """``(node, inside a function, targets)`` for each import statement of ``path`` (the absolute names
    it may load: ``from a import b, c`` gives ``a.b``, ``a.c`` and ``a``)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_blocks(tree)
    name = module_name(path)
    is_pkg = path.name == "__init__.py"
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if id(child) in skip:
                continue
            if isinstance(child, ast.Import):
                out.append((child, in_function, [a.name for a in child.names]))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = name.split(".")
                    anchor = anchor[: len(anchor) - child.level + (1 if is_pkg else 0)]
                    base = ".".join(anchor + ([base] if base else []))
                out.append((child, in_function, [f"{base}.{a.name}" for a in child.names] + [base]))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return out


def _resolve(target: str, modules) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def import_graph(package: str, *, in_functions: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (``from tinydynamo import config`` is an edge to
    ``tinydynamo.config``, not to the package's ``__init__``)."""
    modules = {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node, in_function, targets in imports(path):
            if in_function and not in_functions:
                continue
            if isinstance(node, ast.ImportFrom):
                *names, base = targets
                found = {t for t in names if t in modules}
                if len(found) < len(names):  # a name that is no module comes from the base module
                    found.add(_resolve(base, modules))
            else:
                found = {_resolve(t, modules) for t in targets}
            graph[name].update(t for t in found if t is not None and t != name)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted((c for c in out if len(c) > 1), key=len, reverse=True)


def layer_of(module: str, package: str, layers) -> int | None:
    """The rank of ``module`` in ``layers`` (0: top), by the longest name listed that is the module or a
    package above it (``variables`` holds ``variables.builder``). None: the package's ``__init__``."""
    rel = module[len(package) + 1:] if module != package else ""
    if not rel:
        return None
    best = None
    for rank, names in enumerate(layers):
        for n in names:
            if (rel == n or rel.startswith(n + ".")) and (best is None or len(n) > len(best[1])):
                best = (rank, n)
    if best is None:
        raise LookupError(f"{module} is in no layer of {package}.LAYERS: add it to the layer it belongs to")
    return best[0]


def upward_imports(package: str, layers) -> list[tuple[str, str]]:
    """Imports from a module to a module of a higher layer."""
    graph = import_graph(package)
    out = []
    for a, targets in graph.items():
        la = layer_of(a, package, layers)
        for b in targets:
            lb = layer_of(b, package, layers)
            if la is not None and lb is not None and lb < la:
                out.append((a, b))
    return sorted(out)


def imports_in_functions(package: str) -> int:
    """How many import statements of ``package`` sit inside a function."""
    count = 0
    for path in (ROOT / package).rglob("*.py"):
        count += sum(1 for _, inside, _ in imports(path) if inside)
    return count
