"""Branches decided by what a random draw can be (``tinydynamo.variables.tensor.element_range``).

``torch.rand`` gives values in [0, 1] whatever the seed, so ``if torch.rand([]) < p`` is decided at
trace time when ``p`` puts every draw on one side (HF's LayerDrop with ``layerdrop = 0``): one graph,
no guard, the draw still made (the random stream stays eager's). A bound the draw can reach either
way, a NaN, or a tensor of more than one element keeps the data-dependent branch: a graph break, and
eager's own answer (or error). Each case is compared with eager, random stream included.
"""
import pytest
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def layer_drop(x, p):
    if torch.rand([]) < p:  # HF's LayerDrop: skip the layer
        return x
    return torch.relu(x * 2) + 1


def compare(fn, *args):
    """Compiled and eager from the same seed: equal results, and the same draws consumed."""
    counter = CompileCounter()
    compiled = tinydynamo.compile(fn, backend=counter)
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        expected, after_eager = fn(*args), torch.rand(4)
        torch.manual_seed(seed)
        got, after_compiled = compiled(*args), torch.rand(4)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(after_compiled, after_eager)
    return counter


@pytest.mark.parametrize("p", [0.0, -1.0])
def test_a_draw_that_can_never_be_below_p_is_one_graph(p):
    counter = compare(layer_drop, torch.randn(8), p)
    assert counter.frame_count == 1
    assert tinydynamo.explain(layer_drop)(torch.randn(8), p).graph_break_count == 0
    graph = counter.graphs[0]
    assert any(n.target is torch.rand for n in graph.graph.nodes)  # the draw is made, as in eager


@pytest.mark.parametrize("p", [0.5, 1.0, float("nan")])
def test_a_draw_either_side_of_p_is_a_data_dependent_branch(p):
    # 1.0 too: [0, 1] is closed (a draw just below 1 rounds to 1 in bf16), so ``< 1.0`` is not known
    compare(layer_drop, torch.randn(8), p)
    assert tinydynamo.explain(layer_drop)(torch.randn(8), p).graph_break_count == 1


def always_true_forms(x):
    r = torch.rand([])
    if r <= 1.0 and r >= 0 and torch.rand_like(x[0]) < 2 and 0 <= r and not (1.5 < r):
        return x + 1
    return x - 1


def test_every_comparison_form_is_decided_when_the_range_decides_it():
    compare(always_true_forms, torch.randn(3))
    assert tinydynamo.explain(always_true_forms)(torch.randn(3)).graph_break_count == 0


def test_more_than_one_element_still_raises_as_eager():
    def ambiguous(x):
        if torch.rand(2) < 2.0:  # True for both, but bool() of two elements is an error in eager
            return x + 1
        return x

    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        ambiguous(torch.randn(2))
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        tinydynamo.compile(ambiguous, backend=CompileCounter())(torch.randn(2))


def test_a_value_computed_from_the_draw_is_not_decided():
    def shifted(x):
        if torch.rand([]) - 0.5 < 0.0:  # the range is not followed through arithmetic: a branch
            return x + 1
        return x - 1

    compare(shifted, torch.randn(3))
    assert tinydynamo.explain(shifted)(torch.randn(3)).graph_break_count == 1


def overwritten(x):
    r = torch.rand([])
    r.copy_(x.sum())  # no longer a draw: the range is void
    if r <= 1.0:
        return x + 1
    return x - 1


def overwritten_through_a_view(x):
    r = torch.rand(1)
    r.view(1, 1).fill_(5.0)
    if r < 2.0:  # every draw is below 2, but r was written through its view
        return x + 1
    return x - 1


def overwritten_comparison(x):
    below = torch.rand([]) < 0.0  # decided False...
    below.fill_(True)  # ...until written
    if below:
        return x + 1
    return x - 1


@pytest.mark.parametrize("fn", [overwritten, overwritten_through_a_view, overwritten_comparison])
def test_a_tensor_written_in_place_loses_its_range(fn):
    compare(fn, torch.randn(3) * 10)
    assert tinydynamo.explain(fn)(torch.randn(3)).graph_break_count >= 1
