"""Iterator objects written in Python (``__iter__`` returns ``self``, ``__next__`` raises StopIteration)
are looped over in the graph: each item comes from an inlined ``__next__`` when the loop asks for it,
so what the loop body changes on the iterator is seen by the next ``__next__``, as in eager; and
``next()`` on an exhausted iterator raises StopIteration that traced code can catch."""
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


class Countdown:
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n <= 0:
            raise StopIteration
        self.n -= 1
        return self.n


def loop_made_in_frame(x):
    for i in Countdown(3):
        x = x + i
    return x


def loop_changing_the_iterator(x, c):
    for i in c:
        x = x * 2 + i
        if i == 4:
            c.n -= 2  # __next__ sees it: 3 and 2 are skipped
    return x


def test_iterator_object_made_in_the_frame():
    cnt = CompileCounter()
    x = torch.zeros(2)
    torch.testing.assert_close(tinydynamo.compile(loop_made_in_frame, backend=cnt, fullgraph=True)(x),
                               loop_made_in_frame(x))
    assert cnt.frame_count == 1


def test_loop_body_changes_the_iterator_object_it_walks():
    x = torch.randn(2)
    ours, theirs = Countdown(7), Countdown(7)
    out = tinydynamo.compile(loop_changing_the_iterator, backend="eager", fullgraph=True)(x, ours)
    torch.testing.assert_close(out, loop_changing_the_iterator(x, theirs))
    assert ours.n == theirs.n == 0


class Wrapped:
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.inner)  # StopIteration of the inner iterator ends the outer loop


def next_of_inner_iterator(x, items):
    w = Wrapped(items)
    w.inner = iter(items)
    for t in w:
        x = x + t
    return x


def test_next_on_an_exhausted_iterator_raises_stop_iteration():
    items = [torch.ones(2), torch.full((2,), 2.0)]
    x = torch.zeros(2)
    out = tinydynamo.compile(next_of_inner_iterator, backend="eager", fullgraph=True)(x, items)
    torch.testing.assert_close(out, next_of_inner_iterator(x, items))
