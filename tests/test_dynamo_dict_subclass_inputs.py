"""A dict-subclass instance from outside the frame (an argument, a global: a transformers ``ModelOutput``,
an ``OrderedDict`` subclass, handed to a resume function after a graph break) is read through dict's own C
methods (``values()``, ``list(obj)``, ``len(obj)``, ``k in obj``...) in one graph: a snapshot of its items,
its keys guarded in order (other keys recompile), each value read through ``dict.__getitem__``. Writing
through dict's methods stays a graph break, and a Python override of a method is inlined as before.
Each case is compared with eager."""
import collections

import pytest
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


class OrderedOut(collections.OrderedDict):
    pass


class PlainOut(dict):
    pass


class ModelOutputLike(collections.OrderedDict):
    """Like transformers' ModelOutput: ``out["name"]`` and ``out[0]`` in Python, over ``self.items()``."""

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return list(self.values())[k]


def reads(out):
    acc = list(out.values())[0] * 2
    for k in out:
        acc = acc + out[k].sum()
    for k, v in out.items():
        acc = acc + v.mean() * len(k)
    if "b" in out and "z" not in out and out.get("z") is None and bool(out):
        acc = acc + out.get("b").max()
    return acc + len(out), "-".join(out.keys()) + ":" + "-".join(list(out))


def one_graph(fn, *args):
    """``fn(*args)`` compiled: equal to eager, in one graph with no break."""
    tinydynamo.reset()
    expected = fn(*args)
    explained = tinydynamo.explain(fn)(*args)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    tinydynamo.reset()
    got = tinydynamo.optimize("eager", nopython=True)(fn)(*args)
    if isinstance(expected, tuple):  # a tensor, then constants
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:]
    else:
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("cls", [OrderedOut, PlainOut, ModelOutputLike])
def test_dict_reads_in_one_graph(cls):
    one_graph(reads, cls(a=torch.randn(3), b=torch.randn(2)))


def test_model_output_getitem_override_by_name_and_position():
    def first(out):
        vals = list(out.values())
        return vals[0] * 2 + out["b"].sum() + out[1].mean() + len(out)

    one_graph(first, ModelOutputLike(a=torch.randn(3), b=torch.randn(2)))


def test_empty_and_non_empty_truth():
    def f(out, x):
        return x + 1 if out else x - 1

    one_graph(f, OrderedOut(a=1), torch.randn(2))
    one_graph(f, PlainOut(), torch.randn(2))


def test_other_keys_recompile():
    def f(out):
        return sum(v.sum() for v in out.values()) + len(out)

    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt, nopython=True)(f)
    for out in (OrderedOut(a=torch.ones(2), b=torch.ones(3)),
                OrderedOut(a=torch.randn(2), b=torch.randn(3)),  # same keys: the same graph
                OrderedOut(b=torch.ones(3), a=torch.ones(2), c=torch.ones(1))):  # other keys: another
        torch.testing.assert_close(compiled(out), f(out))
    assert cnt.frame_count == 2


def test_a_python_override_of_values_is_inlined():
    class Scaled(collections.OrderedDict):
        def values(self):
            return [self[k] * 3 for k in self]

    def f(out):
        return list(out.values())[0] + out.get("a")

    one_graph(f, Scaled(a=torch.randn(3)))


def test_a_returned_view_is_the_real_objects_view():
    def f(out, x):
        return out.values(), x + len(out)

    tinydynamo.reset()
    out, x = OrderedOut(a=torch.randn(2)), torch.randn(2)
    view, y = tinydynamo.optimize("eager", nopython=True)(f)(out, x)
    assert type(view) is type(out.values())
    out["b"] = torch.ones(1)  # a view is live: it sees an entry added later
    assert len(view) == 2
    torch.testing.assert_close(y, x + 1)


class Store(collections.OrderedDict):
    def put(self, k, v):
        super().__setitem__(k, v)


def test_writes_through_dicts_methods_still_break_and_are_correct():
    def via_super(out, x):
        out.put("c", x * 2)
        return list(out.values())[-1] + len(out)

    def via_subscript(out, x):
        out["c"] = x * 3
        return list(out.values())[-1] + len(out)

    for fn in (via_super, via_subscript):
        x = torch.randn(2)
        expected_obj, got_obj = Store(a=torch.ones(2)), Store(a=torch.ones(2))
        expected = fn(expected_obj, x)
        tinydynamo.reset()
        got = tinydynamo.optimize("eager")(fn)(got_obj, x)
        torch.testing.assert_close(got, expected)
        assert list(got_obj) == ["a", "c"]
        torch.testing.assert_close(got_obj["c"], expected_obj["c"])


def test_an_output_of_an_eager_call_read_after_a_graph_break():
    """The real shape: a model's output object made by code that ran eagerly, read in the resume function."""

    def f(x):
        out = ModelOutputLike(hidden=x + 1, logits=x * 2)  # made by a call that breaks the graph
        tinydynamo.graph_break()
        return list(out.values())[0] + out["logits"] + len(out)

    tinydynamo.reset()
    explained = tinydynamo.explain(f)(torch.randn(3))
    reasons = [r.reason for r in explained.break_reasons]
    assert len(reasons) == 2 and "creating a ModelOutputLike" in reasons[0], reasons  # the call, graph_break()
    assert explained.graph_count == 2 and not explained.eager_frames  # x + 1, x * 2; then the reads
    tinydynamo.reset()
    x = torch.randn(3)
    torch.testing.assert_close(tinydynamo.optimize("eager")(f)(x), f(x))


def test_a_real_transformers_model_output():
    from tests.model_zoo import import_transformers

    if import_transformers() is None:
        pytest.skip("transformers is not installed")
    from transformers.modeling_outputs import BaseModelOutput

    def f(out):
        return list(out.values())[0] * 2 + out["last_hidden_state"].sum() + out[0].mean()

    one_graph(f, BaseModelOutput(last_hidden_state=torch.randn(2, 3)))


def test_missing_and_own_iter_keep_pythons_semantics():
    """``obj[k]`` of a class with ``__missing__`` (a defaultdict stores the default) and ``list(obj)`` of a
    class with its own ``__iter__`` are not read from the snapshot: still right, compiled or not."""

    class Defaulting(collections.defaultdict):
        pass

    class Reversed(dict):
        def __iter__(self):
            return iter(reversed(list(dict.keys(self))))

    def f(out, x):
        return x * out["a"] + out["new"] + len(out), list(out)

    for make in (lambda: Defaulting(int, a=2), lambda: Reversed(a=2, new=3)):
        x = torch.randn(2)
        expected_obj, got_obj = make(), make()
        expected = f(expected_obj, x)
        tinydynamo.reset()
        got = tinydynamo.optimize("eager")(f)(got_obj, x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1] and dict(got_obj) == dict(expected_obj)


def test_a_method_patched_on_the_class_recompiles():
    class Patched(collections.OrderedDict):
        pass

    def f(out):
        return list(out.values())[0] + 1

    tinydynamo.reset()
    compiled = tinydynamo.optimize("eager", nopython=True)(f)
    out = Patched(a=torch.zeros(2))
    torch.testing.assert_close(compiled(out), torch.ones(2))
    Patched.values = lambda self: [torch.full((2,), 5.0)]
    torch.testing.assert_close(compiled(out), torch.full((2,), 6.0))
