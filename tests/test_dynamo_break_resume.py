"""Graph breaks resume on both sides: a data-dependent branch, inside loops, after an
earlier break, inside an inlined call, in frames with closures; paths that join again compile no
more frames than torch.compile does. Each matches eager; graph counts are compared with torch.compile."""
import pytest
import torch
import torch._dynamo.testing

import tinydynamo
from tests.dynamo_compare import compare
from tinydynamo.testing import CompileCounter


def branch(x):
    y = x * 2
    if y.sum() > 0:
        y = y + 1
    else:
        y = y - 1
    return y * 3


def after_an_earlier_break(x):
    print("", end="")
    x = x + 1
    if x.sum() > 0:
        x = x * 2
    return x


def item_then_use(x):
    n = x.sum().item()
    return x * n


def helper_with_break(y):
    y = y + 1
    print("", end="")
    return y * 2


def break_inside_inlined_call(x):
    return helper_with_break(x * 3) - 1


def three_ifs(x):
    if x.sum() > 0:
        x = x + 1
    else:
        x = x - 1
    if x.mean() > 0.1:
        x = x * 2
    else:
        x = x / 2
    if x.max() > 1:
        x = x + 3
    return x * 5


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true_side", "false_side"])
def test_branch_resumes_on_either_side(sign):
    assert compare(branch, sign * torch.rand(4, 5) + sign) == (2, 2)


@pytest.mark.parametrize("fn,tiny,torch_graphs", [
    (after_an_earlier_break, 2, 2), (item_then_use, 2, 2), (break_inside_inlined_call, 4, 4),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_breaks(fn, tiny, torch_graphs):
    assert compare(fn, torch.rand(4, 5) + 0.5) == (tiny, torch_graphs)


def test_branch_inside_a_loop_resumes_every_iteration():
    def f(x):
        for _ in range(3):
            if x.sum() > 0:
                x = x - 1
            else:
                x = x + 1
        return x

    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt)(f)
    for start in (0.2, -0.2, 5.0, -5.0):
        x = torch.full((3,), start)
        torch.testing.assert_close(g(x), f(x))
    assert 4 <= cnt.frame_count <= 12  # one graph per (iteration, side) reached: torch.compile runs this frame eagerly


def test_a_long_loop_with_a_break_stops_resuming_after_max_loop_resumes():
    """Each iteration's break resumes in a new function; after ``config.max_loop_resumes`` of them
    the rest of the loop runs natively, with the function it calls compiled as its own frame."""
    def inner(x):
        return torch.sin(x) + 1

    def f(x):
        total = x
        for _ in range(50):
            total = total + inner(x)
            tinydynamo.graph_break()
        return total

    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt)(f)
    x = torch.randn(4)
    torch.testing.assert_close(g(x), f(x))
    first = cnt.frame_count
    assert first <= tinydynamo.config.max_loop_resumes + 3  # the resumes, the tail, inner's own frame
    torch.testing.assert_close(g(x), f(x))
    assert cnt.frame_count == first  # the second call compiles nothing


def test_joining_paths_compile_as_many_frames_as_torch():
    torch.manual_seed(0)
    inputs = [torch.randn(8) + s for s in (-2, -1, -0.3, 0, 0.3, 1, 2, 3)] * 2
    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt)(three_ifs)
    for x in inputs:
        torch.testing.assert_close(g(x), three_ifs(x))
    torch._dynamo.reset()
    tcnt = torch._dynamo.testing.CompileCounter()
    h = torch.compile(three_ifs, backend=tcnt)
    for x in inputs:
        h(x)
    assert cnt.frame_count == tcnt.frame_count == 7


def scale_by_item(x):
    n = x.sum().item()
    m = x.max().item()
    return x * n - (x > m) * 1.0


def test_item_stays_in_the_graph_with_capture_scalar_outputs():
    x = torch.rand(4, 5)
    with tinydynamo.config.patch(capture_scalar_outputs=True), \
            torch._dynamo.config.patch(capture_scalar_outputs=True):
        assert compare(scale_by_item, x) == (1, 1)
    assert compare(scale_by_item, x) == (3, 3)  # off: a break at each .item()


def test_captured_int_item_is_an_unbacked_size():
    """An integer ``.item()`` is a symbol known only at run time: it may be a size, one graph serves
    every value, and ``torch._check`` promises stay in the graph (a broken one raises as in eager)."""
    def f(x):
        n = (x.sum() > 0).long().item()
        return torch.zeros(n + 1)

    def g(x, i):
        k = i.item()
        torch._check(k >= 0)
        torch._check(k < x.shape[0])
        return x[k] + x[:k].sum()

    tinydynamo.reset()
    cnt = CompileCounter()
    with tinydynamo.config.patch(capture_scalar_outputs=True):
        cf, cg = tinydynamo.optimize(cnt, nopython=True)(f), tinydynamo.optimize(cnt, nopython=True)(g)
        for x in (torch.ones(3), -torch.ones(3)):
            torch.testing.assert_close(cf(x), f(x))
        x = torch.randn(4, 2)
        for i in (0, 3):
            torch.testing.assert_close(cg(x, torch.tensor(i)), g(x, torch.tensor(i)))
        assert cnt.frame_count == 2
        with pytest.raises(RuntimeError, match="Expected cond to be True"):
            cg(x, torch.tensor(4))


def test_branch_on_a_captured_item_is_a_clean_break():
    def f(x):
        n = x.argmax().item()
        if n > 1:
            return x * 2
        return x - 1

    tinydynamo.reset()
    with tinydynamo.config.patch(capture_scalar_outputs=True), pytest.raises(tinydynamo.Unsupported,
                                                                            match="data-dependent"):
        tinydynamo.optimize(CompileCounter(), nopython=True)(f)(torch.arange(3.0))
    with tinydynamo.config.patch(capture_scalar_outputs=True):
        tinydynamo.reset()
        g = tinydynamo.optimize(CompileCounter())(f)
        for x in (torch.arange(3.0), -torch.arange(3.0)):
            torch.testing.assert_close(g(x), f(x))
