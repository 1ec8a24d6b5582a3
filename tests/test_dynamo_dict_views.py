"""``d.keys()`` / ``d.values()`` / ``d.items()`` are live views of the dict, as in Python: an entry added
after the view was taken is seen through it, ``len`` follows the dict, the view's type is the view
type (not ``list``), and returning one rebuilds a view of the returned dict. (``sum(xs, start=s)``
sits here too: a builtin keyword that was dropped; and ``d.copy()`` is a new dict of the same kind.)
Each runs in one graph and matches eager."""
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def views_follow_the_dict(x):
    d = {3: x}
    keys, values, items = d.keys(), d.values(), d.items()
    d[4] = x + 1
    out = x * len(values)
    for _, v in items:
        out = out + v
    return out, 4 in keys, 5 in keys, {3: 2, 4: "a"}.keys() == keys, isinstance(keys, list), sorted(keys)


def returned_views(x):
    d = {"a": x + 1}
    return d.keys(), d.values(), d.items()


def sum_with_start_keyword(a, b, c):
    return sum([b, c], start=a)


def run(fn, *args):
    tinydynamo.reset()
    cnt = CompileCounter()
    out = tinydynamo.optimize(cnt, nopython=True)(fn)(*args)
    assert cnt.frame_count == 1
    return out


def test_views_are_live_and_typed():
    x = torch.randn(3)
    torch.testing.assert_close(run(views_follow_the_dict, x), views_follow_the_dict(x))


def test_returned_views_are_views():
    x = torch.randn(3)
    keys, values, items = run(returned_views, x)
    assert type(keys) is type({}.keys()) and list(keys) == ["a"]
    assert type(values) is type({}.values()) and torch.equal(list(values)[0], x + 1)
    assert type(items) is type({}.items())


def test_sum_start_keyword():
    a, b, c = torch.randn(3), torch.randn(3), torch.randn(3)
    torch.testing.assert_close(run(sum_with_start_keyword, a, b, c), sum_with_start_keyword(a, b, c))


def copies_are_independent(x):
    import collections

    d1 = dict([("a", x), ("b", x + 1)])
    d2 = d1.copy()
    d2["a"] = x - 5
    d3 = collections.defaultdict(list, {"k": [x]})
    d4 = d3.copy()
    d4["m"].append(x * 2)
    return d1["a"] * d2["a"] + d2["b"], len(d3), len(d4), type(d4) is collections.defaultdict


def test_dict_copy_is_a_new_dict_of_the_same_kind():
    x = torch.randn(3)
    torch.testing.assert_close(run(copies_are_independent, x), copies_are_independent(x))
