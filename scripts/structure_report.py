"""Structure numbers of the two packages: function lengths, import cycles, op sites.

    python scripts/structure_report.py            # the table
    python scripts/structure_report.py --json     # the same numbers as JSON

* **functions over 60 lines** and the longest one (by ``ast``: a function's first to last line);
* per package: **imports inside functions**, the **largest import cycle** (imports inside functions
  included: they still tie the modules together) and the **imports up a layer** (each package's
  ``LAYERS``), from scripts/module_graph.py; the **ruff findings**;
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
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tininductor  # noqa: E402
import tinydynamo  # noqa: E402
from scripts.module_graph import import_graph, imports_in_functions, strongly_connected, upward_imports  # noqa: E402

PACKAGES = {"tinydynamo": tinydynamo.LAYERS, "tininductor": tininductor.LAYERS}
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


def op_sites() -> dict:
    """Per pointwise op name of ``virtualized.py``'s table: the files among OP_SITE_FILES naming it."""
    from tininductor import virtualized
    from tininductor.codegen import cpp

    texts = {f: (ROOT / f).read_text() for f in OP_SITE_FILES}
    names = sorted(set(virtualized.UNARY_OPS) | set(virtualized.BINARY_OPS))
    sites = {n: [f for f, t in texts.items() if re.search(rf"\b{re.escape(n)}\b", t)] for n in names}
    drift = sorted(set(getattr(cpp, "CPP_OPS", {})) - set(virtualized.ALL_OPS))
    return {"sites": sites, "cpp_ops_not_in_table": drift}


def ruff_findings() -> int | None:
    """How many findings ``ruff check .`` reports (None: ruff is not installed)."""
    try:
        done = subprocess.run([sys.executable, "-m", "ruff", "check", ".", "--output-format", "concise"],
                              cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    if "No module named ruff" in done.stderr:
        return None
    return sum(1 for line in done.stdout.splitlines() if re.match(r"^\S+\.py:\d+:\d+: ", line))


def report() -> dict:
    lengths = sorted(function_lengths("tinydynamo") + function_lengths("tininductor"), reverse=True)
    packages = {}
    for package, layers in PACKAGES.items():
        cycles = strongly_connected(import_graph(package))
        packages[package] = {
            "imports_in_functions": imports_in_functions(package),
            "import_cycles": [sorted(c) for c in cycles],
            "largest_cycle": max((len(c) for c in cycles), default=0),
            "upward_imports": [f"{a} -> {b}" for a, b in upward_imports(package, layers)],
        }
    ops = op_sites()
    per_op = [len(v) for v in ops["sites"].values()]
    return {
        "functions_over_60_lines": sum(1 for n, _ in lengths if n > 60),
        "longest_function": {"lines": lengths[0][0], "name": lengths[0][1]},
        "over_60": [f"{n} {name}" for n, name in lengths if n > 60],
        "packages": packages,
        "ruff_findings": ruff_findings(),
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
    for package, numbers in r["packages"].items():
        print(f"{package}: imports inside functions {numbers['imports_in_functions']}, largest import cycle "
              f"{numbers['largest_cycle']} modules, imports up a layer {len(numbers['upward_imports'])}")
        for line in numbers["upward_imports"]:
            print(f"  {line}")
    print(f"ruff findings: {r['ruff_findings']}")
    print(f"files naming each pointwise op: max {r['op_sites_max']}, mean {r['op_sites_mean']} "
          f"(of {len(OP_SITE_FILES)})")
    print(f"C++ op strings with no entry in the op table: {r['cpp_ops_not_in_table']}")


if __name__ == "__main__":
    main()
