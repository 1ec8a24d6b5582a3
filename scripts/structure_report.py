"""Structure numbers of the two packages (issue 14): function lengths, import cycles, op sites.

    python scripts/structure_report.py            # the table
    python scripts/structure_report.py --json     # the same numbers as JSON

* **functions over 60 lines** and the longest one (by ``ast``: a function's first to last line);
* **import cycles** of tinydynamo: strongly connected components of the module import graph
  (imports inside functions included: they still tie the modules together), and the imports
  that "run back up" from a lower layer to a higher one (:data:`LAYERS`), outside ``variables/``;
* **sites per op**: for every pointwise op of tininductor's op table, how many of the files that
  could name it (prims, virtualized, lowering, the two codegens, vjp_rules) do; and the op names
  a backend spells that the op table lacks (drift).
"""
from __future__ import annotations

import argparse
import ast
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: tinydynamo's layers, top (entry points) to bottom (leaves); an import from a module to one of a
#: higher layer "runs back up". ``variables/`` may call back into the translator (inlining a call).
LAYERS = [
    ("api", "compiler", "explanation", "instructor_view", "testing", "tracer", "viz"),
    ("eval_frame",),
    ("convert_frame",),
    ("symbolic_convert", "polyfills", "trace_rules"),
    ("output_graph", "codegen", "side_effects"),
    ("variables",),
    # resume.py assembles code objects from bytecode alone (a leaf, like torch's resume_execution.py)
    ("guards", "source", "bytecode", "resume", "utils", "config", "exc", "logs", "artifacts", "_lazy", "backends",
     "decompile", "symbolic_shapes", "registry"),
]
OP_SITE_FILES = ["tininductor/prims.py", "tininductor/virtualized.py", "tininductor/lowering.py",
                 "tininductor/codegen/triton.py", "tininductor/codegen/cpp.py", "tininductor/vjp_rules.py"]


def function_lengths(package: str) -> list[tuple[int, str]]:
    """``(lines, "file:function")`` for every function and method of ``package``."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.name}"))
    return sorted(out, reverse=True)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from . import x`` resolved; any depth)."""
    modules = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm (iterative enough for a package of a few dozen modules)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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

    for v in graph:
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def layer(module: str) -> int | None:
    """The layer of a ``tinydynamo.*`` module (None for the package itself and unknown modules)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for rank, names in enumerate(LAYERS):
        if parts[1] in names:
            return rank
    return None


def imports_back_up(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Import edges from a lower layer to a higher one, outside ``variables/``."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if ".variables" not in a and layer(a) is not None and layer(b) is not None
                  and layer(b) < layer(a))


def op_sites() -> dict:
    """Per pointwise op name of ``virtualized.py``'s table: the files among OP_SITE_FILES naming it."""
    from tininductor import virtualized
    from tininductor.codegen import cpp

    texts = {f: (ROOT / f).read_text() for f in OP_SITE_FILES}
    names = sorted(set(virtualized.UNARY_OPS) | set(virtualized.BINARY_OPS))
    sites = {n: [f for f, t in texts.items() if re.search(rf"\b{re.escape(n)}\b", t)] for n in names}
    drift = sorted(set(getattr(cpp, "CPP_OPS", {})) - set(virtualized.ALL_OPS))
    return {"sites": sites, "cpp_ops_not_in_table": drift}


def report() -> dict:
    lengths = sorted(function_lengths("tinydynamo") + function_lengths("tininductor"), reverse=True)
    graph = import_graph("tinydynamo")
    cycles = strongly_connected(graph)
    back_edges = imports_back_up(graph)
    ops = op_sites()
    per_op = [len(v) for v in ops["sites"].values()]
    return {
        "functions_over_60_lines": sum(1 for n, _ in lengths if n > 60),
        "longest_function": {"lines": lengths[0][0], "name": lengths[0][1]},
        "over_60": [f"{n} {name}" for n, name in lengths if n > 60],
        "tinydynamo_import_cycles": sorted((sorted(c) for c in cycles), key=len, reverse=True),
        "largest_cycle": max((len(c) for c in cycles), default=0),
        "imports_back_up_outside_variables": [f"{a} -> {b}" for a, b in back_edges],
        "op_sites_max": max(per_op), "op_sites_mean": round(sum(per_op) / len(per_op), 2),
        "cpp_ops_not_in_table": ops["cpp_ops_not_in_table"],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args(argv)
    r = report()
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(f"functions over 60 lines: {r['functions_over_60_lines']}")
    for line in r["over_60"]:
        print(f"  {line}")
    print(f"longest function: {r['longest_function']['lines']} lines ({r['longest_function']['name']})")
    print(f"tinydynamo import cycles: {len(r['tinydynamo_import_cycles'])}, largest {r['largest_cycle']} modules")
    print(f"imports that run back up, outside variables/: {len(r['imports_back_up_outside_variables'])}")
    for line in r["imports_back_up_outside_variables"]:
        print(f"  {line}")
    print(f"files naming each pointwise op: max {r['op_sites_max']}, mean {r['op_sites_mean']} "
          f"(of {len(OP_SITE_FILES)})")
    print(f"C++ op strings with no entry in the op table: {r['cpp_ops_not_in_table']}")


if __name__ == "__main__":
    main()
