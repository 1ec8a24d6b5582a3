"""Each package imports one way: a module imports only modules of its own layer or below (the
``LAYERS`` its ``__init__.py`` declares), and no import cycle ties modules together. The module
graph is read from the source (scripts/module_graph.py): imports at the top of a file and inside
functions alike (a deferred import still ties two modules together)."""
import subprocess
import sys

import pytest

import tininductor
import tinydynamo
from scripts.module_graph import ROOT, import_graph, layer_of, strongly_connected, upward_imports

PACKAGES = {"tinydynamo": tinydynamo.LAYERS, "tininductor": tininductor.LAYERS}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_has_a_layer(package):
    for module in import_graph(package):
        layer_of(module, package, PACKAGES[package])  # raises LookupError naming the module


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_a_higher_layer(package):
    upward = [f"{a} -> {b}" for a, b in upward_imports(package, PACKAGES[package])]
    assert upward == [], f"imports that run back up a layer ({package}.LAYERS): {upward}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    cycles = [sorted(m[len(package) + 1:] for m in c) for c in strongly_connected(import_graph(package))]
    assert cycles == [], f"import cycles in {package}: {cycles}"


def test_the_graph_sees_imports_inside_functions(tmp_path, monkeypatch):
    """The checker itself: a deferred import up a layer and a cycle through it are both found."""
    import scripts.module_graph as mg

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "top.py").write_text("from pkg import low\n")
    (pkg / "low.py").write_text("def f():\n    from pkg import top\n    return top\n")
    monkeypatch.setattr(mg, "ROOT", tmp_path)
    assert mg.import_graph("pkg")["pkg.low"] == {"pkg.top"}
    assert mg.upward_imports("pkg", [("top",), ("low",)]) == [("pkg.low", "pkg.top")]
    assert mg.strongly_connected(mg.import_graph("pkg")) == [{"pkg.low", "pkg.top"}]


def test_each_late_bound_tracker_is_registered_by_the_module_named():
    """A tracker of a higher layer is reached by name (variables/base.py): importing any module of the
    package registers every name (the package's __init__ imports them all), by the module REGISTERED_BY says."""
    code = ("import tinydynamo.variables.base as base; "
            "print(sorted(base._construction) == sorted(base.REGISTERED_BY), "
            "all(base.constructor(n).__module__ == 'tinydynamo.variables.' + m for n, m in base.REGISTERED_BY.items()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr
