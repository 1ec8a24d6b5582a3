"""Dict keys and set elements that are not constants: tensors, parameters, modules and plain objects
hash by identity in Python, and so they do in the trace (a tensor by its fake value, which an in-place
op hands back unchanged). Keys from outside the frame are read by position; two of them told apart at
trace time are guarded to stay distinct, so an aliased call recompiles instead of merging them.
A key tinydynamo cannot hash (a class with its own ``__hash__``) is a graph break, never a guess."""
import collections

import pytest
import torch

import tinydynamo
from tinydynamo.exc import Unsupported
from tinydynamo.testing import CompileCounter


def run(fn, *args, frames=1):
    tinydynamo.reset()
    cnt = CompileCounter()
    out = tinydynamo.optimize(cnt, nopython=True)(fn)(*args)
    assert cnt.frame_count == frames
    return out


PARAM = torch.nn.Parameter(torch.ones(2, 2))


def tensor_keys_in_the_frame(x):
    d = collections.defaultdict(list)
    d["a"] = x + 1
    d[PARAM] = 3
    d.update([("b", x * 2), ["c", x - 1]])
    d.update(zip("de", [x + 3, x + 4]))
    y = x.add_(1)  # the same tensor: the same key
    d[y] = 5
    return d[PARAM] * d["a"] + d["e"] + d[x], list(d.keys())[-1] is x, len(d), d["missing"], PARAM in d


def test_tensor_keys_in_a_frame_dict():
    x = torch.randn(2, 2)
    ref = tensor_keys_in_the_frame(x.clone())
    res = run(tensor_keys_in_the_frame, x.clone())
    assert torch.allclose(ref[0], res[0]) and ref[1:] == res[1:]


def test_input_defaultdict_with_a_parameter_key_is_changed_in_place():
    dd_ref, dd = collections.defaultdict(list), collections.defaultdict(list)

    def fn(d, x):
        d["a"] = x + 1
        d[PARAM] = 123
        return d["b"], d[PARAM]

    x = torch.randn(2, 2)
    fn(dd_ref, x), fn(dd, x)  # both dicts now hold PARAM as a key
    ref, res = fn(dd_ref, x), run(fn, dd, x)
    assert ref == res and list(dd) == list(dd_ref) and list(dd)[1] is PARAM
    assert torch.equal(dd["a"], dd_ref["a"]) and dd[PARAM] == 123


def test_distinct_tensor_keys_are_guarded_to_stay_distinct():
    def fn(a, b, x):
        d = {a: 1, b: 2}
        return x * d[a] + len(d)

    compiled = tinydynamo.optimize("eager")(fn)
    x, y, z = torch.randn(3), torch.randn(3), torch.randn(3)
    assert torch.equal(compiled(x, y, z), fn(x, y, z))
    assert torch.equal(compiled(x, x, z), fn(x, x, z))  # aliased: {x: 2}, not {x: 1, x: 2}


def test_sets_of_tensors():
    def fn(x, y):
        s = {x, y, x}
        s.add(y)
        t = set([x]) | {y}
        return len(s), x in s, 1 in s, len(t), s.isdisjoint({x + 1})

    x, y = torch.randn(2), torch.randn(2)
    assert run(fn, x, y) == fn(x, y)


def test_a_set_from_outside_is_guarded_and_changed_in_place():
    s = {1, 2}

    def fn(x):
        s.add(len(s) + 10)
        return x * len(s)

    compiled = tinydynamo.compile(fn, backend="eager", fullgraph=True)
    x = torch.ones(2)
    assert torch.equal(compiled(x), x * 3) and s == {1, 2, 12}
    s.discard(12)
    s.add(5)  # changed outside: the guard sees it
    assert torch.equal(compiled(x), x * 4) and s == {1, 2, 5, 13}


def test_fromkeys_of_the_dict_classes():
    def fn(x, y):
        d = dict.fromkeys(["a", "b"])
        d1 = dict.fromkeys(d, x + 1)
        d2 = collections.defaultdict.fromkeys(iter(d1), x - 2)
        d3 = collections.OrderedDict.fromkeys(("a", "b"), y)
        return d1["a"] * d2["b"] + d3["b"], type(d2), type(d3), d2.default_factory is None

    x, y = torch.randn(3), torch.randn(3)
    ref, res = fn(x, y), run(fn, x, y)
    assert torch.allclose(ref[0], res[0]) and ref[1:] == res[1:]


def test_hasattr_on_builtin_containers_and_in_on_a_list():
    def fn(x):
        d = {"a": x}
        out = x.cos() if hasattr(d, "to") else x.sin()
        mylist = [1, 2, 3, x]
        assert 3 in mylist  # found before the tensor is compared
        return out + sum(mylist), hasattr(d, "items"), hasattr(x.shape, "_fields")

    x = torch.randn(3)
    ref, res = fn(x), run(fn, x)
    assert torch.allclose(ref[0], res[0]) and ref[1:] == res[1:]


class OwnHash:
    def __init__(self, v):
        self.v = v

    def __hash__(self):
        return hash(self.v)

    def __eq__(self, other):
        return isinstance(other, OwnHash) and other.v == self.v


def test_a_key_with_its_own_hash_breaks_the_graph():
    def fn(x, k):
        d = {k: x + 1}
        return d[OwnHash(1)] * 2

    x = torch.randn(3)
    assert torch.equal(tinydynamo.optimize("eager")(fn)(x, OwnHash(1)), fn(x, OwnHash(1)))
    tinydynamo.reset()
    with pytest.raises(Unsupported):
        tinydynamo.optimize("eager", nopython=True)(fn)(x, OwnHash(1))


def test_a_frame_whose_ops_are_all_dead_is_still_compiled():
    def fn(x):
        d = {3: x}
        d[4] = x + 1  # traced, then unused
        return len(d)

    assert run(fn, torch.randn(3)) == 2
