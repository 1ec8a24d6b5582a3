"""Each package imports one way: a module imports only modules of its own layer or below (the
``LAYERS`` its ``__init__.py`` declares), and no import cycle ties modules together. The module
graph is read from the source (scripts/module_graph.py): imports at the top of a file and inside
functions alike (a deferred import still ties two modules together)."""
import pytest

import tininductor
import tinydynamo
from scripts.module_graph import import_graph, layer_of, strongly_connected, upward_imports

PACKAGES = {"tinydynamo": tinydynamo.LAYERS, "tininductor": tininductor.LAYERS}

#: Import cycles not broken yet, each named by its modules: the test fails on any other cycle, and
#: when one of these changes (shrinks or goes away: then update this list).
KNOWN_CYCLES = {
    # the variable trackers of one layer call each other both ways (a list's method makes a builtin
    # call; a builtin call makes lists, tensors, constants; the builder, reached through VariableTracker.build,
    # is outside it), and the polyfills / trace_rules that trackers consult make trackers in turn
    "tinydynamo": [["polyfills", "trace_rules", "variables.autocast", "variables.autograd_function",
                    "variables.builtin", "variables.constant", "variables.ctx_manager", "variables.dicts",
                    "variables.functions", "variables.iter", "variables.lists", "variables.misc_ctx",
                    "variables.module_hooks", "variables.nn_module", "variables.objects", "variables.polyfilled",
                    "variables.sym_node", "variables.tensor", "variables.torch", "variables.torch_function",
                    "variables.user_defined"]],
    "tininductor": [],
}


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
    assert sorted(cycles) == sorted(KNOWN_CYCLES[package]), f"import cycles in {package}: {cycles}"


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
