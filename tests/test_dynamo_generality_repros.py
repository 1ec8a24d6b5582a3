"""Families of Python that PyTorch's own dynamo tests (test_repros, test_generator) exercise: each
matches eager, and compiles into as many graphs (and ops) as torch.compile does.

PYTEST_DONT_REWRITE: the `assert` statements below must compile as Python compiles them."""
import itertools

import pytest
import torch

import tinydynamo
from tests.dynamo_compare import compare
from tinydynamo.testing import CompileCounter


# ---- `assert <tensor>, "message"`: a run-time check in the graph, not a graph break -------------------
def assert_tensor_with_msg(x):
    b = x.sin()
    assert x[0] == 3, "first element must be 3"
    return x.cos() + b


def assert_tensor_without_msg(x):
    b = x.sin()
    assert x[0] == 3
    return x.cos() + b


@pytest.mark.parametrize("fn", [assert_tensor_with_msg, assert_tensor_without_msg])
def test_assert_on_a_tensor_is_checked_in_the_graph(fn):
    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt, nopython=True)(fn)
    x = torch.tensor([3.0, 4.0, 5.0])
    torch.testing.assert_close(g(x), fn(x))
    assert (cnt.frame_count, cnt.op_count) == (1, 6)  # sin, getitem, eq, _assert_async, cos, add: as torch
    with pytest.raises(RuntimeError, match="first element must be 3" if fn is assert_tensor_with_msg else "assertion"):
        g(torch.tensor([5.0, 6.0, 7.0]))  # the same graph (no recompile): the check runs in it


def assert_tensor_computed_msg(x):
    assert x[0] == 3, f"got {x[0]}"  # a message built at run time: a graph break, as torch.compile
    return x.cos()


def test_assert_with_a_computed_message_breaks_the_graph():
    assert compare(assert_tensor_computed_msg, torch.tensor([3.0, 4.0])) == (2, 2)


@pytest.mark.parametrize("backend", ["aot_eager", "tininductor"])
def test_assert_on_a_tensor_survives_autograd_and_codegen(backend):
    """The check has no result: the AOT partitioner keeps it in the forward, tininductor calls it."""
    tinydynamo.reset()
    g = tinydynamo.compile(assert_tensor_with_msg, backend=backend)
    x = torch.tensor([3.0, 4.0, 5.0], requires_grad=True)
    torch.testing.assert_close(g(x), assert_tensor_with_msg(x))
    with pytest.raises(RuntimeError, match="first element must be 3"):
        g(torch.tensor([5.0, 6.0, 7.0], requires_grad=True))


# ---- Python's own exceptions, raised by traced code as eager raises them -------------------------------
def iterate_a_number(x, n):
    try:
        for i in n:
            x = x + i
    except TypeError as e:
        return x - 1, str(e)
    return x, ""


def test_iterating_over_a_number_raises_typeerror_in_traced_code():
    x = torch.randn(3)
    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt, nopython=True)(iterate_a_number)
    got, want = g(x, 3), iterate_a_number(x, 3)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] == "'int' object is not iterable" and cnt.frame_count == 1


def double():
    x = yield
    yield x * 2


def send_past_the_end(t):
    gen = double()
    next(gen)
    a = gen.send(t)
    b = gen.send(t)  # StopIteration
    return a + b


def test_an_uncaught_exception_escaping_a_generator_is_eagers_or_unsupported_under_fullgraph():
    t = torch.randn(2)
    tinydynamo.reset()
    with pytest.raises(StopIteration):
        tinydynamo.optimize("eager")(send_past_the_end)(t)
    tinydynamo.reset()
    with pytest.raises(tinydynamo.exc.Unsupported, match="Observed exception: StopIteration"):
        tinydynamo.optimize("eager", nopython=True)(send_past_the_end)(t)


# ---- list subclasses with Python methods: a list's items, the subclass's methods ---------------------------
class Pipeline(list):
    def __call__(self, x):
        for step in self:
            x = step(x)
        return x

    def length_times_10(self):
        return len(self) * 10

    def append_twice(self, x):
        self.extend([x, x])


class NoClear(Pipeline):
    def clear(self):  # overrides list.clear: the override runs
        pass


def build_a_pipeline(a, b):
    p = Pipeline([torch.relu])
    p.append(torch.sigmoid)
    p.extend([torch.tanh])
    p.pop(0)
    n = p.length_times_10()
    return p(a) + b + n + len(type(p).__name__) + isinstance(p, list)


def test_a_list_subclass_made_in_the_frame():
    assert compare(build_a_pipeline, torch.randn(4), torch.randn(4)) == (1, 1)


def grow_and_return(a, b):
    l1 = Pipeline([a + 1])
    l2 = Pipeline([b + 2])
    l1.extend(l2)
    return l1


def test_a_list_subclass_returned_keeps_its_type_and_items():
    a, b = torch.randn(3), torch.randn(3)
    tinydynamo.reset()
    cnt = CompileCounter()
    out = tinydynamo.optimize(cnt, nopython=True)(grow_and_return)(a, b)
    assert type(out) is Pipeline and out.length_times_10() == 20 and cnt.frame_count == 1
    torch.testing.assert_close(list(out), [a + 1, b + 2])


def mutate_inputs(a, b):
    a.extend(b)
    a.append_twice(b[2] + 1)
    a.clear()  # NoClear: nothing
    a.append(b[3] + 2)
    return b, len(a)


def test_list_subclass_arguments_are_mutated_as_in_eager_through_aliases():
    x, y = torch.randn(3), torch.randn(3)
    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt, nopython=True)(mutate_inputs)
    got = NoClear([x, y])
    want = NoClear([x, y])
    out, n = g(got, got)
    out_eager, n_eager = mutate_inputs(want, want)
    assert out is got and type(got) is NoClear and n == n_eager == 7 and len(got) == len(want) == 7
    assert got[0] is x and got[3] is y and got[5] is got[4]
    torch.testing.assert_close(list(got), list(want))
    assert cnt.frame_count == 1
    # other lengths: a recompile (a length guard); b[2] out of range raises eager's IndexError
    with pytest.raises(IndexError):
        tinydynamo.optimize("eager")(mutate_inputs)(NoClear([x]), NoClear([y]))


class Counted(list):
    def __len__(self):  # changes the list protocol: not modelled as a list (the frame runs another way)
        return 42


def len_of(x, l):
    return x + len(l)


def test_a_list_subclass_that_changes_the_protocol_is_not_modelled_as_a_list():
    x = torch.randn(2)
    tinydynamo.reset()
    torch.testing.assert_close(tinydynamo.optimize("eager")(len_of)(x, Counted([1])), x + 42)


def foreach_pow(**kwargs):
    return torch._foreach_pow(**kwargs)


def test_a_keyword_argument_named_self_reaches_the_compiled_function():
    t = [torch.rand(2, 2)]
    tinydynamo.reset()
    got = tinydynamo.optimize("eager", nopython=True)(foreach_pow)(self=t, exponent=2.0)
    torch.testing.assert_close(got, foreach_pow(self=t, exponent=2.0))


def _add_two(x):
    return x + 2


def test_disable_non_recursive_skips_only_the_frame_itself():
    """``torch._dynamo.disable(f, recursive=False)``: f runs natively, the function it calls is compiled."""
    log = []

    @torch._dynamo.disable(recursive=False)
    def f(x):
        log.append("f ran")  # a side effect tinydynamo would otherwise replay: f itself is not traced
        return _add_two(x)

    tinydynamo.reset()
    cnt = CompileCounter()
    x = torch.randn(3)
    torch.testing.assert_close(tinydynamo.optimize(cnt)(f)(x), x + 2)
    assert (cnt.frame_count, cnt.op_count, log) == (1, 1, ["f ran"])

    @torch._dynamo.disable
    def g(x):
        return _add_two(x)

    tinydynamo.reset()
    cnt = CompileCounter()
    torch.testing.assert_close(tinydynamo.optimize(cnt)(g)(x), x + 2)
    assert cnt.frame_count == 0  # recursive (the default): nothing below is compiled either


# ---- a loop over a dict that sets values of keys it has (legal in Python: the loop reads them live) ------
def rescale_in_place(x, d):
    for k, v in d.items():
        d[k] = v * 2
        if k == "a":
            d["b"] = d["b"] + 100  # read by the loop when it gets to "b"
    total = x
    for v in d.values():
        total = total + v
    for k in d:
        d[k] = d[k] - 1
    return total


def grow_while_iterating(x, d):
    for k in d:
        d[k + "!"] = x  # a new key: Python raises RuntimeError
    return x


def test_a_loop_over_a_dict_that_sets_its_values():
    x = torch.randn(3)
    d_eager = {"a": torch.ones(3), "b": torch.zeros(3)}
    d_tiny = {k: v.clone() for k, v in d_eager.items()}
    tinydynamo.reset()
    cnt = CompileCounter()
    got = tinydynamo.optimize(cnt, nopython=True)(rescale_in_place)(x, d_tiny)
    torch.testing.assert_close(got, rescale_in_place(x, d_eager))
    torch.testing.assert_close(d_tiny, d_eager)
    assert cnt.frame_count == 1
    tinydynamo.reset()
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        tinydynamo.optimize("eager")(grow_while_iterating)(x, {"a": x})


# ---- a parameter-free module built in the frame and returned: a new one per call, as in eager -----------
class GELUActivation(torch.nn.Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.act = torch.nn.functional.gelu
        self.approximate = approximate

    def forward(self, x):
        return self.act(x, approximate=self.approximate)


def make_activation(x):
    act = GELUActivation("tanh")
    return act, act(x) + 1


def test_a_module_built_in_the_frame_is_returned_as_a_new_module_each_call():
    x = torch.randn(4)
    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt, nopython=True)(make_activation)
    (m1, y1), (m2, _) = g(x), g(x)
    torch.testing.assert_close(y1, make_activation(x)[1])
    assert type(m1) is GELUActivation and m1 is not m2 and m1.approximate == "tanh"
    assert m1.act is torch.nn.functional.gelu and hasattr(m1, "_buffers") and cnt.frame_count == 1


@pytest.mark.parametrize("f", [lambda x, y: x * y, lambda x, y: (x * y).sin()], ids=["mul", "sin"])
@pytest.mark.parametrize("backend", ["aot_eager", "tininductor"])
def test_saved_tensor_hooks_run_at_run_time_only(backend, f):
    """Compiling (tracing, the backward graph, codegen) saves nothing through the user's pack hooks,
    and a call packs each saved tensor once, as eager does (a hook that offloads or compresses saved
    tensors must not see one twice)."""
    calls = {"pack": 0, "unpack": 0}

    def pack(t):
        calls["pack"] += 1
        return t

    def unpack(t):
        calls["unpack"] += 1
        return t

    x, y = torch.ones(4, requires_grad=True), torch.ones(4)
    tinydynamo.reset()
    g = tinydynamo.compile(f, backend=backend)
    counts = []
    for fn in (f, g, g):  # eager; the first call compiles, the second runs the cached code: the same hook calls
        calls.update(pack=0, unpack=0)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = fn(x, y)
            assert calls["unpack"] == 0
            out.sum().backward()
        counts.append(dict(calls))
    assert counts[0] == counts[1] == counts[2] and counts[0]["pack"] == counts[0]["unpack"] >= 1


def new_leaf(x):
    leaf = torch.ones(2, requires_grad=True)
    return leaf, leaf * 2 + x.sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "tininductor"])
def test_a_new_leaf_that_requires_grad_gets_its_gradient(backend):
    x = torch.arange(4.0).reshape(2, 2)
    leaf, out = new_leaf(x)
    out.sum().backward()
    tinydynamo.reset()
    leaf_c, out_c = tinydynamo.compile(new_leaf, backend=backend)(x)
    out_c.sum().backward()
    torch.testing.assert_close(leaf_c.grad, leaf.grad)
    torch.testing.assert_close(out_c, out.detach())


def branch_on_item(x):
    x = x + 1
    y = x.item()
    if y > 2:
        return x * 2
    return x * 3


def test_a_branch_on_a_captured_item_breaks_the_graph_and_resumes_on_either_side():
    tinydynamo.reset()
    cnt = CompileCounter()
    with tinydynamo.config.patch(capture_scalar_outputs=True):
        g = tinydynamo.optimize(cnt)(branch_on_item)
        for v in (3.0, 0.5, 3.0, -1.0):
            x = torch.tensor([v])
            torch.testing.assert_close(g(x), branch_on_item(x))
    assert cnt.frame_count == 3  # x + 1 and the item (one graph), then each side once


# ---- itertools.tee: generators sharing one iterator, each buffering what the others read ahead -----------
def tee_pairs(x):
    a, b = itertools.tee(iter([x, x + 1, x + 2]))
    first = next(a)
    rest_b = list(b)  # b reads all three (a's buffer keeps two)
    return first, rest_b, list(a)


def test_itertools_tee_in_the_frame():
    assert compare(tee_pairs, torch.randn(3)) == (1, 1)


def deep_tee(t):
    a, b = itertools.tee(iter(range(2000)))
    total = sum(a)
    return t + total + next(b)


def test_itertools_tee_with_a_long_buffer():
    tinydynamo.reset()
    cnt = CompileCounter()
    t = torch.randn(2)
    torch.testing.assert_close(tinydynamo.optimize(cnt, nopython=True)(deep_tee)(t), deep_tee(t))
    assert cnt.frame_count == 1


# ---- a zip over a generator, alive after the graph: rebuilt as zip of its iterators where they are -------
def _three(t):
    yield t + 1
    yield t + 2
    yield t + 3


def zip_returned(t):
    z = zip(range(3), _three(t))
    first = next(z)
    return z, first[1] * 2


def zip_and_its_generator(t):
    g = _three(t)
    return zip([10, 20, 30], g), g


def test_a_zip_over_a_generator_leaves_the_frame_where_it_was():
    t = torch.randn(2)
    tinydynamo.reset()
    cnt = CompileCounter()
    z, y = tinydynamo.optimize(cnt, nopython=True)(zip_returned)(t)
    z_e, y_e = zip_returned(t)
    torch.testing.assert_close(y, y_e)
    torch.testing.assert_close(list(z), list(z_e))
    z, g = tinydynamo.optimize(cnt, nopython=True)(zip_and_its_generator)(t)
    z_e, g_e = zip_and_its_generator(t)
    torch.testing.assert_close((next(g), list(z)), (next(g_e), list(z_e)))  # one generator, shared as in eager
    assert cnt.frame_count == 2


def same_iterators_twice(t):
    g = _three(t)
    it = iter([t, t * 2])
    return g, g, it, it


def test_an_iterator_held_twice_leaves_the_frame_as_one_object():
    t = torch.randn(2)
    tinydynamo.reset()
    g1, g2, i1, i2 = tinydynamo.optimize("eager", nopython=True)(same_iterators_twice)(t)
    assert g1 is g2 and i1 is i2
    torch.testing.assert_close([next(g1), next(g2), next(i1), next(i2)], [t + 1, t + 2, t, t * 2])
