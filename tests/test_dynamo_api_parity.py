"""torch._dynamo's API in tinydynamo: optimize (a decorator, not a context manager, as in
torch 2.x), allow_in_graph, disallow_in_graph, disable on functions and modules, graph_break, run,
export, TINY_DISABLE, optimizing an optimized function, tinydynamo.compiler names."""
import os
import subprocess
import sys

import pytest
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def my_op(x):
    return x.sin() + 1


def test_optimize_is_not_a_context_manager_like_torch():
    with pytest.raises(RuntimeError, match="context manager"):
        with tinydynamo.optimize("eager"):
            pass
    with pytest.raises(RuntimeError, match="context manager"):
        with torch._dynamo.optimize("eager"):
            pass


def test_allow_in_graph_makes_one_node():
    def f(x):
        return my_op(x) * 2

    tinydynamo.reset()
    tinydynamo.allow_in_graph(my_op)
    try:
        cnt = CompileCounter()
        x = torch.randn(3)
        torch.testing.assert_close(tinydynamo.optimize(cnt, nopython=True)(f)(x), f(x))
        targets = [n.target for n in cnt.graphs[0].graph.nodes if n.op == "call_function"]
        assert targets[0] is my_op and len(targets) == 2
    finally:
        from tinydynamo import api

        api.ALLOWED_IN_GRAPH.pop(id(my_op))


def test_disallow_in_graph_breaks_at_each_call():
    def f(x):
        return torch.cos(x) + 1

    tinydynamo.reset()
    tinydynamo.disallow_in_graph(torch.cos)
    try:
        cnt = CompileCounter()
        x = torch.randn(3)
        torch.testing.assert_close(tinydynamo.optimize(cnt)(f)(x), f(x))
        assert cnt.frame_count == 1 and all(n.target is not torch.cos for n in cnt.graphs[0].graph.nodes)
        with pytest.raises(tinydynamo.Unsupported, match="disallow_in_graph"):
            tinydynamo.reset()
            tinydynamo.optimize(CompileCounter(), nopython=True)(f)(x)
    finally:
        tinydynamo.allow_in_graph(torch.cos)
        from tinydynamo import api

        api.ALLOWED_IN_GRAPH.pop(id(torch.cos))


def test_graph_break_and_is_compiling():
    def f(x):
        y = x * 2
        tinydynamo.graph_break()
        return y + tinydynamo.is_compiling() + tinydynamo.compiler.is_compiling() + torch.compiler.is_compiling()

    tinydynamo.reset()
    cnt = CompileCounter()
    x = torch.randn(3)
    torch.testing.assert_close(tinydynamo.optimize(cnt)(f)(x), x * 2 + 3)  # traced: is_compiling() is True
    torch.testing.assert_close(f(x), x * 2)
    assert cnt.frame_count == 2


@tinydynamo.disable
def helper(x):
    return x + 1


def f_calls_helper(x):
    return helper(x * 2) * 3


def test_disable_function_and_module():
    lin = torch.nn.Linear(3, 3)
    tinydynamo.disable(lin)

    tinydynamo.reset()
    cnt = CompileCounter()
    x = torch.randn(2, 3)
    torch.testing.assert_close(tinydynamo.compile(lin, backend=cnt)(x), lin(x))
    assert cnt.frame_count == 0
    torch.testing.assert_close(tinydynamo.optimize(cnt)(f_calls_helper)(x), f_calls_helper(x))
    assert cnt.frame_count == 2  # helper ran eagerly between two graphs
    torch.testing.assert_close(tinydynamo.compiler.disable(f_calls_helper)(x), f_calls_helper(x))


def test_run_uses_only_cached_code():
    def f(x):
        return x * 2

    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt)(f)
    compiled(torch.randn(3))
    runner = tinydynamo.run(compiled)
    torch.testing.assert_close(runner(torch.ones(3)), torch.full((3,), 2.0))
    torch.testing.assert_close(runner(torch.ones(7)), torch.full((7,), 2.0))  # a miss: eager, no compile
    assert cnt.frame_count == 1


def test_export_one_graph_with_guards():
    def f(x, y):
        return (x @ y).relu() + 1

    x, y = torch.randn(2, 3), torch.randn(3, 2)
    result = tinydynamo.export(f)(x, y)
    torch.testing.assert_close(result.graph_module(x, y)[0], f(x, y))
    assert any(g.kind == "TENSOR_MATCH" for g in result.guards)

    def g(x):
        print("", end="")
        return x

    with pytest.raises(tinydynamo.Unsupported):
        tinydynamo.export(g)(x)


def test_optimizing_an_optimized_function_compiles_once():
    def f(x):
        return x + 1

    tinydynamo.reset()
    cnt = CompileCounter()
    twice = tinydynamo.optimize(cnt)(tinydynamo.optimize(CompileCounter())(f))
    torch.testing.assert_close(twice(torch.ones(2)), torch.full((2,), 2.0))
    assert cnt.frame_count == 1


def test_config_disable_and_env():
    def f(x):
        return x + 1

    tinydynamo.reset()
    cnt = CompileCounter()
    with tinydynamo.config.patch(disable=True):
        torch.testing.assert_close(tinydynamo.optimize(cnt)(f)(torch.ones(2)), torch.full((2,), 2.0))
    assert cnt.frame_count == 0
    code = "import tinydynamo; print(tinydynamo.config.disable)"
    env = dict(os.environ, TINY_DISABLE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
