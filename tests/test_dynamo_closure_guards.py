"""A closure passed to a compiled function is guarded by its code and the cells it reads, not by its
identity: another closure of the same ``def`` over equal constants reuses the compiled entry (as
TorchDynamo's CLOSURE_MATCH), a different cell value recompiles, and using the function as a value
(``f is g``) guards its identity after all, so the result is never stale."""
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def adder(val):
    def inner(x):
        return torch.sin(x + val)

    return inner


def apply(x, other_fn):
    return other_fn(x + 1) - 1


def test_closures_of_one_def_share_an_entry():
    cnt = CompileCounter()
    opt = tinydynamo.compile(apply, backend=cnt, fullgraph=True)
    x = torch.randn(8)
    for f in (adder(5), adder(5), adder(torch.randn(8)), adder(torch.randn(8))):
        torch.testing.assert_close(opt(x, f), apply(x, f))
    assert cnt.frame_count == 2  # one for the int cell, one for the tensor cell
    f = adder(6)  # another constant in the cell: its guard fails
    torch.testing.assert_close(opt(x, f), apply(x, f))
    assert cnt.frame_count == 3


def is_same(f, g, x):
    return x + 1 if f is g else x - 1


def test_identity_of_a_closure_is_guarded_when_used():
    a, b = adder(1), adder(1)
    x = torch.randn(3)
    opt = tinydynamo.compile(is_same, backend="eager", fullgraph=True)
    for f, g in ((a, a), (a, b), (b, b), (b, a)):
        torch.testing.assert_close(opt(f, g, x), is_same(f, g, x))


def named(f, x):
    return x * len(f.__name__)


def test_a_closure_renamed_by_a_decorator_is_not_read_as_a_constant():
    a, b = adder(1), adder(1)
    b.__name__ = "a_much_longer_name"
    opt = tinydynamo.compile(named, backend="eager", fullgraph=True)
    x = torch.ones(2)
    torch.testing.assert_close(opt(a, x), named(a, x))
    torch.testing.assert_close(opt(b, x), named(b, x))


def test_a_marked_closure_of_the_same_def_is_not_inlined_as_the_plain_one():
    a, b = adder(1), adder(1)
    b.marker = True  # anything in __dict__ (a decorator's mark, __wrapped__) may change how it is traced
    cnt = CompileCounter()
    opt = tinydynamo.compile(apply, backend=cnt, fullgraph=True)
    x = torch.randn(3)
    opt(x, a)
    torch.testing.assert_close(opt(x, b), apply(x, b))
    assert cnt.frame_count == 2
