"""Tensor subclasses, hooks, autocast: ``__torch_function__`` tensor subclasses
(``config.traceable_tensor_subclasses``), graph breaks inside ``with`` blocks and loops over lazy iterators, ``.item()`` with
``config.capture_scalar_outputs``, module hooks inside compiled functions, ``export(aten_graph=True)``.
Each case matches eager (values and result types) and compiles into as many graphs as torch.compile
(backend "eager", torch 2.13) where tinydynamo can; differences are stated where they are asserted."""
import warnings

import pytest
import torch
from torch import nn

import tinydynamo
from tests.dynamo_compare import compare
from tinydynamo.testing import CompileCounter, CompileCounterWithBackend


# ---- __torch_function__ subclasses --------------------------------------------------------------------
class Scaled(torch.Tensor):
    """Adds ten times the other operand (an observable override), then torch's default."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.add or func is torch.add:
            args = (args[0], args[1] * 10) + tuple(args[2:])
        return super().__torch_function__(func, types, args, kwargs or {})


class Unwrapping(torch.Tensor):
    """The other common shape: run ``func`` with subclasses off, change the result, rewrap it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.mul:
            out = out + 100
        return out.as_subclass(cls) if isinstance(out, torch.Tensor) else out


class Inherits(torch.Tensor):
    """No override of its own: torch.Tensor's default keeps results of this type."""

    def doubled(self):
        return self * 2


class MyParameter(nn.Parameter):
    """A Parameter-like subclass: its __torch_function__ is switched off (results are plain tensors)."""


def ops(x):
    return x.add(1) * 2 + torch.relu(x) - x.shape[0]


def mixed(x, y):
    return torch.cat([x, y]).sum(0), x[0], -x, 2 * x, torch.nn.functional.gelu(y), x + y


LINEAR = nn.Linear(3, 3)


def more_ops(x):
    v, i = x.max(0)  # a structseq of two subclass tensors
    total = 0
    for row in x:  # Tensor.__iter__ -> unbind, through the override
        total = total + row
    x[0] = 5  # __setitem__
    return LINEAR(x).relu(), v + i, total, x.clone().add_(1), x.unsqueeze(0).mT


def break_between(x):
    y = x * 2
    print("", end="")  # a subclass tensor on the stack and in the locals at a graph break
    return y + x


def _check_types(out, expected):
    outs = out if isinstance(out, tuple) else (out,)
    exps = expected if isinstance(expected, tuple) else (expected,)
    assert [type(o) for o in outs] == [type(e) for e in exps]


@pytest.mark.parametrize("cls", [Scaled, Unwrapping, Inherits], ids=lambda c: c.__name__)
@pytest.mark.parametrize("fn", [ops, mixed, more_ops, break_between], ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_function_subclass_is_traced_through_its_override(cls, fn, backend):
    x = torch.randn(3, 3).as_subclass(cls)
    y = torch.randn(3, 3).as_subclass(cls)
    args = (x, y)[:fn.__code__.co_argcount]
    expected = fn(*[a.clone() for a in args])
    with tinydynamo.config.patch(traceable_tensor_subclasses={Scaled, Unwrapping}):
        tinydynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        compiled = tinydynamo.optimize(cnt, nopython=fn is not break_between)(fn)
        for _ in range(2):
            out = compiled(*[a.clone() for a in args])
            _check_types(out, expected)  # the subclass type survives, as eagerly
            torch.testing.assert_close(out, expected)
    assert cnt.frame_count == (2 if fn is break_between else 1)


def test_torch_function_subclass_graph_counts_equal_torch_compile():
    x = torch.randn(3, 3).as_subclass(Scaled)
    with tinydynamo.config.patch(traceable_tensor_subclasses={Scaled}):
        assert compare(ops, x) == (1, 1)
        assert compare(mixed, x, x * 2) == (1, 1)
        assert compare(break_between, x) == (2, 2)


def test_override_effects_are_in_the_graph_and_gradients_flow():
    x = torch.randn(3, requires_grad=True)
    expected = ops(x.as_subclass(Scaled))
    expected.sum().backward()
    expected_grad = x.grad.clone()
    x.grad = None
    gm = []

    def backend(g, example_inputs):
        gm.append(g)
        assert all(type(e) is torch.Tensor for e in example_inputs)  # the graph works on plain tensors
        return g.forward

    tinydynamo.reset()
    with tinydynamo.config.patch(traceable_tensor_subclasses={Scaled}):
        out = tinydynamo.optimize(backend)(ops)(x.as_subclass(Scaled))
    assert type(out) is Scaled
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    torch.testing.assert_close(x.grad, expected_grad)
    assert ".add(10)" in gm[0].code and ".mul(10)" in gm[0].code  # the override's `args[1] * 10`, traced


def test_untraced_override_falls_back_with_a_named_reason():
    x = torch.randn(3).as_subclass(Scaled)
    tinydynamo.reset()
    cnt = CompileCounter()
    with tinydynamo.config.patch(traceable_tensor_subclasses=set()):
        with pytest.raises(tinydynamo.Unsupported, match="traceable_tensor_subclasses"):
            tinydynamo.optimize(cnt, nopython=True)(ops)(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = tinydynamo.optimize(cnt)(ops)(x)  # runs eagerly: the override is applied, never ignored
    assert type(out) is Scaled and cnt.frame_count == 0
    torch.testing.assert_close(out, ops(x))


def test_subclass_methods_and_instance_attributes():
    def f(x):
        return x.doubled() + x.scale

    x = torch.randn(3).as_subclass(Inherits)
    x.scale = 3.0
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt, nopython=True)(f)
    out = compiled(x)
    assert type(out) is Inherits
    torch.testing.assert_close(out, f(x))
    x.scale = 4.0  # guarded: a new value recompiles
    torch.testing.assert_close(compiled(x), f(x))
    assert cnt.frame_count == 2


def test_returning_the_input_returns_the_same_object_and_type_guard():
    def f(x):
        return x, x.sum()

    x = torch.randn(3).as_subclass(Inherits)
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt)(f)
    a, b = compiled(x)
    assert a is x and type(b) is Inherits
    a, b = compiled(torch.randn(3))  # a plain tensor: the TYPE_MATCH guard fails, recompiles
    assert type(b) is torch.Tensor and cnt.frame_count == 2


def test_parameter_like_subclasses_are_plain_tensors():
    def f(p, y):
        return p * y + 1, torch.sigmoid(p)

    for p in (nn.Parameter(torch.randn(3)), MyParameter(torch.randn(3))):
        assert compare(f, p, torch.randn(3)) == (1, 1)
        tinydynamo.reset()
        out = tinydynamo.optimize(CompileCounter())(f)(p, torch.randn(3))
        _check_types(out, f(p, torch.randn(3)))  # plain Tensor results, as eagerly


# ---- export(aten_graph=True) ----------------------------------------------------------------------------
def test_export_aten_graph_is_decomposed_and_equal_to_eager():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU())

    def f(x, y):
        return (m(x) @ y).softmax(-1) + 1

    x, y = torch.randn(2, 3), torch.randn(4, 2)
    for result in (tinydynamo.export(f, x, y, aten_graph=True), tinydynamo.export(f, aten_graph=True)(x, y)):
        gm = result.graph_module
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert targets and all(isinstance(t, torch._ops.OpOverload) for t in targets)  # ATen ops only
        assert torch.ops.aten.addmm.default in targets and torch.ops.aten._softmax.default in targets
        assert gm.meta["input_sources"][:2] == ["L['x']", "L['y']"]  # then the lifted parameters
        inputs = [x, y, m[0].weight, m[0].bias]
        torch.testing.assert_close(gm(*inputs)[0], f(x, y))
        assert any(g.kind == "TENSOR_MATCH" for g in result.guards)
    from torch._decomp import core_aten_decompositions

    gm = tinydynamo.export(f, aten_graph=True, decomposition_table=core_aten_decompositions())(x, y).graph_module
    assert torch.ops.aten.t.default not in [n.target for n in gm.graph.nodes]  # decomposed to permute
    torch.testing.assert_close(gm(x, y, m[0].weight, m[0].bias)[0], f(x, y))


# ---- module hooks inside a compiled function ---------------------------------------------------------
HOOKED = nn.Linear(3, 3)
HOOKED.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
HOOKED.register_forward_hook(lambda mod, args, out: out + 1)


def calls_hooked_global(x):
    return HOOKED(x).relu()


def calls_hooked_argument(mod, x):
    return mod(x).relu() + mod(x * 2)


def test_hooks_of_modules_called_inside_a_compiled_function_are_inlined():
    x = torch.randn(2, 3, requires_grad=True)
    assert compare(calls_hooked_global, x, grad=True) == (1, 1)
    assert compare(calls_hooked_argument, HOOKED, x, grad=True) == (1, 1)


def test_hook_dicts_are_guarded_inside_a_compiled_function():
    m = nn.Linear(3, 3)
    m.register_forward_hook(lambda mod, args, out: out * 3)

    def f(x):
        return m(x) - 1

    x = torch.randn(2, 3)
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt)(f)
    torch.testing.assert_close(compiled(x), f(x))
    torch.testing.assert_close(compiled(x), f(x))
    assert cnt.frame_count == 1
    handle = m.register_forward_pre_hook(lambda mod, args: (args[0] + 5,))  # a new hook: recompiles
    torch.testing.assert_close(compiled(x), f(x))
    assert cnt.frame_count == 2
    handle.remove()
    torch.testing.assert_close(compiled(x), f(x))
    assert cnt.frame_count == 2  # back to the first entry
    assert "+ 5" not in cnt.graphs[0].code and "add" in cnt.graphs[1].code


# ---- .item() with config.capture_scalar_outputs ----------------------------------------------------
def item_plus_one(x):
    n = x.sum().item()
    return x * (n + 1)


def item_arithmetic(x):
    n = x.max().item()
    return x / (2 * n) - n ** 2


def two_items(x):
    n, m = x.sum().item(), x.mean().item()
    return x * (n - m) + (n * m)


def item_unary(x):
    n = x.sum().item()
    return x * -n + abs(n) + int(x.argmax().item()) * x


def item_tolist(x):
    a, b = x[:2].tolist()
    return x * a + b


def item_into_torch_function(x):
    n = x.sum().item()
    return torch.full((3,), n) + x


SCALAR_CASES = [  # (fn, tiny/torch graphs with capture_scalar_outputs, without)
    (item_plus_one, (1, 1), (2, 2)), (item_arithmetic, (1, 1), (2, 2)), (two_items, (1, 1), (3, 3)),
    (item_unary, (1, 1), (3, 3)), (item_tolist, (2, 2), (2, 2)),
    (item_into_torch_function, (2, 1), (2, 2)),  # tiny: a number as a torch function argument is a clean break
]


@pytest.mark.parametrize("fn,captured,broken", SCALAR_CASES, ids=[c[0].__name__ for c in SCALAR_CASES])
def test_item_arithmetic_stays_in_the_graph(fn, captured, broken):
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tinydynamo.config.patch(capture_scalar_outputs=True), \
                torch._dynamo.config.patch(capture_scalar_outputs=True):
            assert compare(fn, x) == captured
        assert compare(fn, x) == broken


def test_item_arithmetic_nodes_are_numbers_in_the_graph():
    tinydynamo.reset()
    cnt = CompileCounter()
    with tinydynamo.config.patch(capture_scalar_outputs=True):
        tinydynamo.optimize(cnt, nopython=True)(item_plus_one)(torch.randn(3))
    code = cnt.graphs[0].code
    assert "item = sum_1.item()" in code and "add = item + 1" in code and "l_x * add" in code


# ---- graph breaks inside `with` blocks ------------------------------------------------------------
def autocast_block(x):
    y = x * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = y @ y.T
    return y.float() + 1


def autocast_break(x):
    y = x * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = y @ y.T
        print("", end="")
        y = y @ y
    return y.float() + 1


def autocast_off_break(x):
    y = x * 2
    with torch.autocast("cpu", enabled=False):
        y = y + 1
        print("", end="")
        y = y * 3
    return y - 1


def enable_grad_break_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        with torch.enable_grad():
            y = y * x
            print("", end="")
            y = y + 1
    return y


class Counting:
    depth = 0

    def __enter__(self):
        Counting.depth += 1
        return self

    def __exit__(self, *exc):
        Counting.depth -= 1


def user_context_manager_break(x):
    y = x * 2
    with Counting():
        y = y + Counting.depth
        print("", end="")
        y = y * 3
    return y - Counting.depth


WITH_CASES = [  # (fn, tiny, torch graphs)
    (autocast_block, 1, 1), (autocast_break, 2, 2), (autocast_off_break, 2, 2),
    (enable_grad_break_in_no_grad, 2, 2),
    (user_context_manager_break, 0, 0),  # neither resumes inside a user __enter__/__exit__: both run it eagerly
]


@pytest.mark.parametrize("fn,tiny,torch_graphs", WITH_CASES, ids=[c[0].__name__ for c in WITH_CASES])
def test_graph_break_inside_with_blocks(fn, tiny, torch_graphs):
    x = torch.randn(3, 3, requires_grad=True)
    assert compare(fn, x, grad=True) == (tiny, torch_graphs)
    assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled() and Counting.depth == 0


def test_autocast_nodes_are_torch_compiles_and_every_backend_matches_eager():
    x = torch.randn(3, 3, requires_grad=True)
    expected = autocast_break(x)
    expected.sum().backward()
    expected_grad, x.grad = x.grad.clone(), None
    for backend in ("eager", "aot_eager", "tininductor"):
        tinydynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        out = tinydynamo.optimize(cnt)(autocast_break)(x)
        out.sum().backward()
        torch.testing.assert_close(out, expected)  # bfloat16 matmuls inside, as eagerly (not float32)
        torch.testing.assert_close(x.grad, expected_grad)
        x.grad = None
        assert cnt.frame_count == 2 and not torch.is_autocast_enabled("cpu")
        codes = [g.code for g in cnt.graphs]
        assert all("_enter_autocast('cpu', torch.bfloat16, True" in c and "_exit_autocast" in c for c in codes)


def test_tracing_never_leaves_autocast_on():
    def fails(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return (x @ x).reshape(7)  # the user's error, inside the block

    tinydynamo.reset()
    with pytest.raises(RuntimeError):
        tinydynamo.optimize(CompileCounter())(fails)(torch.randn(3, 3))
    assert not torch.is_autocast_enabled("cpu")


# ---- graph breaks inside loops over lazy iterators -----------------------------------------------
def zip_loop(x):
    out = x * 1
    for a, b in zip([x, x + 1, x + 2], [1, 2, 3]):
        out = out + a * b
        print("", end="")
    return out


def enumerate_loop(x):
    out = x * 1
    for i, a in enumerate([x, x * 2]):
        out = out + a * i
        print("", end="")
    return out


def reversed_loop(x):
    out = x * 1
    for a in reversed([x, x + 1]):
        out = out + a
        print("", end="")
    return out


def iter_loop(x):
    out = x * 1
    for a in iter([x, x + 1]):
        out = out + a
        print("", end="")
    return out


def generator_loop(x):
    def gen():
        for i in range(3):
            yield x * i

    out = x * 1
    for a in gen():
        out = out + a
        print("", end="")
    return out


def map_loop(x):
    out = x * 1
    for a in map(torch.relu, [x, x + 1]):
        out = out + a
        print("", end="")
    return out


LOOP_CASES = [  # (fn, tiny, torch graphs): torch 2.13 runs a frame with a break inside a loop eagerly
    (zip_loop, 3, 0), (enumerate_loop, 2, 0), (reversed_loop, 2, 0), (iter_loop, 2, 0),
    (generator_loop, 3, 0),
    (map_loop, 0, 0),  # the rest of a lazy map is not known at the break: the frame runs eagerly
]


@pytest.mark.parametrize("fn,tiny,torch_graphs", LOOP_CASES, ids=[c[0].__name__ for c in LOOP_CASES])
def test_graph_break_inside_loops_over_iterators(fn, tiny, torch_graphs):
    assert compare(fn, torch.randn(3, requires_grad=True), grad=True) == (tiny, torch_graphs)


def _autocast_inner(y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = y @ y
        print("", end="")
        y = y @ y
    return y


def autocast_break_in_inlined_call(x):
    z = _autocast_inner(x * 2)
    return z.float() + 1, torch.is_autocast_enabled("cpu")


def autocast_and_no_grad_nested_break(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            y = x @ x
            print("", end="")
            y = y @ x
        z = x @ x
    return y.float(), z.float(), y.requires_grad, z.requires_grad


@pytest.mark.parametrize("fn,graphs", [(autocast_break_in_inlined_call, 4), (autocast_and_no_grad_nested_break, 2)],
                         ids=["inlined_call", "nested_with_no_grad"])
def test_autocast_breaks_in_inlined_calls_and_nested_blocks(fn, graphs):
    assert compare(fn, torch.randn(3, 3, requires_grad=True)) == (graphs, graphs)
    assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()
