"""Graded tests for chapter 11: ideal traffic, a break-free rewrite, shape bucketing."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tinydynamo
from course import load
from course.testing import expect_close, expect_equal, expect_true
from tinydynamo.testing import CompileCounterWithBackend

ch = load("ch11")


def _chain(x, r):
    return F.gelu(x * 1.5 + 0.25, approximate="tanh") + r


def _softmax_and_max(x):
    return F.softmax(x, dim=-1), x.amax(dim=-1)


@pytest.mark.ch11_1
@pytest.mark.parametrize(
    "fn, inputs, expected",
    [
        (_chain, [torch.randn(1000), torch.randn(1000)], 3 * 1000 * 4),
        (_softmax_and_max, [torch.randn(7, 33, dtype=torch.float64)], (2 * 7 * 33 + 7) * 8),
        (_chain, [torch.randn(16, 64, dtype=torch.float16), torch.randn(64, dtype=torch.float16)], (16 * 64 + 64 + 16 * 64) * 2),
    ],
)
def test_ideal_bytes(fn, inputs, expected):
    gm = torch.fx.symbolic_trace(fn)
    expect_equal(ch.ideal_bytes(gm, inputs), expected, f"ideal_bytes of {fn.__name__}", context=gm.code)


@pytest.mark.ch11_1
def test_ideal_bytes_counts_an_output_once_and_inputs_returned_as_free():
    class Twice(torch.nn.Module):  # returns the *same* tensor object twice
        def forward(self, x):
            y = x * 2
            return x, y, y

    gm = torch.fx.symbolic_trace(Twice())
    x = torch.randn(10)
    expect_equal(ch.ideal_bytes(gm, [x]), 2 * 10 * 4, "ideal_bytes when an output is an input / repeated")


@pytest.mark.ch11_2
def test_rewrite_compiles_in_one_graph_and_matches_both_branches():
    def bad_fn(x):
        y = x.sin() + x.cos()
        if y.sum().item() > 0:
            return y * 2
        return y - 2

    probe = torch.tensor([0.5, -3.0])
    expect_close(ch.positive_branch(probe), bad_fn(probe), "positive_branch([0.5, -3.0]) run eagerly")
    counter = CompileCounterWithBackend("eager")
    compiled = tinydynamo.compile(ch.positive_branch, backend=counter, fullgraph=True)
    torch.manual_seed(0)
    signs = set()
    for shift in (3.0, -3.0, 0.5, -0.5):
        x = torch.randn(64) * 0.1 + shift
        signs.add(bool((x.sin() + x.cos()).sum() > 0))
        expect_close(compiled(x), bad_fn(x), f"positive_branch(x) for mean {shift}")
    expect_true(signs == {True, False}, "test inputs should cover both branches")
    expect_equal(counter.frame_count, 1, "graphs captured (a tensor-only rewrite needs exactly one)")


@pytest.mark.ch11_3
@pytest.mark.parametrize("n, expected", [(1, 16), (16, 16), (17, 32), (64, 64), (65, 128), (200, 256)])
def test_bucket_length(n, expected):
    expect_equal(ch.bucket_length(n, [16, 32, 64]), expected, f"bucket_length({n}, [16, 32, 64])")


@pytest.mark.ch11_3
def test_bucketing_bounds_recompiles_and_keeps_outputs():
    def row_norm(x):  # row-wise along dim 1: padding rows must not change the real rows
        return F.layer_norm(x, x.shape[-1:]) * 2 + 1

    counter = CompileCounterWithBackend("eager")
    tinydynamo.reset()
    compiled = tinydynamo.compile(row_norm, backend=counter, dynamic=False)  # static: the storm buckets are for
    wrapped = ch.bucketed(compiled, [8, 16, 32], dim=1)
    torch.manual_seed(0)
    lengths = [3, 5, 8, 9, 12, 16, 17, 20, 31, 32, 4, 15]
    for n in lengths:
        x = torch.randn(2, n, 24)
        expect_close(wrapped(x), row_norm(x), f"bucketed row_norm at length {n}")
    expect_true(counter.frame_count <= 3, f"compiles for {len(lengths)} lengths: yours {counter.frame_count} vs at most 3 (one per bucket)")


@pytest.mark.ch11_1
def test_ideal_bytes_non_tensor_inputs_cost_nothing():
    def scaled(x, scale: float, n: int):
        return x * scale + n

    gm = torch.fx.symbolic_trace(scaled, concrete_args=None)
    x = torch.randn(6, 5, dtype=torch.float64)
    expect_equal(ch.ideal_bytes(gm, [x, 0.5, 3]), 2 * 6 * 5 * 8, "ideal_bytes with a float and an int input")


@pytest.mark.ch11_2
def test_rewrite_decides_on_the_sum_of_mixed_signs():
    """Inputs where y = sin(x) + cos(x) has both signs: the branch depends on y's sum, not on each element."""
    def bad_fn(x):
        y = x.sin() + x.cos()
        return y * 2 if y.sum().item() > 0 else y - 2

    probe = torch.tensor([0.5, -0.5, 3.0, -3.0])
    expect_close(ch.positive_branch(probe), bad_fn(probe), "positive_branch([0.5, -0.5, 3.0, -3.0]) run eagerly")
    tinydynamo.reset()
    compiled = tinydynamo.compile(ch.positive_branch, backend="eager", fullgraph=True)
    for x in (torch.linspace(-3, 3, 50), torch.linspace(-3.5, 1.0, 50), torch.tensor([0.5, -0.5, 3.0, -3.0])):
        expect_close(compiled(x), bad_fn(x), f"positive_branch on {len(x)} values in [{x.min():.1f}, {x.max():.1f}]")
    boundary = torch.tensor([0.0, -math.pi / 2])  # y = [1.0, -1.0] exactly in float32: y's sum is exactly 0
    expect_true(bad_fn(boundary).sum().item() < 0, "the boundary input should take bad_fn's negative branch")
    expect_close(compiled(boundary), bad_fn(boundary), "positive_branch([0, -pi/2]), where y's sum is exactly 0 "
                                                       "(bad_fn's `> 0` is False there)")


@pytest.mark.ch11_3
def test_bucket_length_with_unsorted_buckets():
    for n, expected in [(1, 16), (20, 32), (33, 64), (129, 192)]:
        expect_equal(ch.bucket_length(n, [64, 16, 32]), expected, f"bucket_length({n}, [64, 16, 32])")


@pytest.mark.ch11_1
def test_ideal_bytes_of_lists_views_and_slices():
    x = torch.randn(10)
    gm = torch.fx.symbolic_trace(lambda x: [x * 2, x + 1])  # the outputs in a list, not a tuple
    expect_equal(ch.ideal_bytes(gm, [x]), 3 * 10 * 4, "ideal_bytes of lambda x: [x * 2, x + 1] on a (10,) float32")
    big = torch.randn(4, 8)
    gm = torch.fx.symbolic_trace(lambda x: (x * 2)[:, :1])  # the output views 4 of a (4, 8) result's elements
    expect_equal(ch.ideal_bytes(gm, [big]), (32 + 4) * 4,
                 "ideal_bytes of lambda x: (x * 2)[:, :1] on a (4, 8) float32 (an output counts its own elements)")
    sliced = big[:, :2]  # an input that is a slice: 8 elements of a 32-element storage are read
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    expect_equal(ch.ideal_bytes(gm, [sliced]), (8 + 8) * 4,
                 "ideal_bytes of lambda x: x * 2 on a (4, 2) slice of a (4, 8) float32 (an input counts its own elements)")
    gm = torch.fx.symbolic_trace(lambda x: (x * 2).sum())  # a 0-d output (a loss) is written too
    expect_equal(ch.ideal_bytes(gm, [x]), (10 + 1) * 4, "ideal_bytes of lambda x: (x * 2).sum() on a (10,) float32")


@pytest.mark.ch11_2
def test_rewrite_decides_on_the_whole_sum_of_a_matrix_and_keeps_the_dtype():
    """A 2-D input whose rows' sums have both signs, and a float64 input: one decision, in the input's dtype."""
    def bad_fn(x):
        y = x.sin() + x.cos()
        return y * 2 if y.sum().item() > 0 else y - 2

    rows = torch.tensor([[0.5, 0.5, 0.5], [3.0, 3.5, 3.0]])  # row sums of y: positive, negative; total positive
    expect_close(ch.positive_branch(rows), bad_fn(rows),
                 "positive_branch([[0.5, 0.5, 0.5], [3.0, 3.5, 3.0]]) (rows of both signs, total > 0: y * 2 everywhere)")
    x64 = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    yours = ch.positive_branch(x64)
    expect_equal(yours.dtype, torch.float64, "dtype of positive_branch(float64 [0.1, 0.2, 0.3])")
    expect_close(yours, bad_fn(x64), "positive_branch(float64 [0.1, 0.2, 0.3])", rtol=1e-12, atol=1e-12)


@pytest.mark.ch11_3
def test_bucket_length_of_exact_multiples_leaves_the_list_alone():
    for n, expected in [(128, 128), (192, 192), (129, 192)]:
        expect_equal(ch.bucket_length(n, [16, 32, 64]), expected, f"bucket_length({n}, [16, 32, 64])")
    buckets = [64, 16, 32]
    ch.bucket_length(20, buckets)
    expect_equal(buckets, [64, 16, 32], "the caller's buckets after bucket_length(20, [64, 16, 32]) (not reordered)")


@pytest.mark.ch11_3
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64])
def test_bucketed_along_dim_0_keeps_the_dtype(dtype):
    seen = []

    def double(x):
        seen.append((tuple(x.shape), x.dtype))
        return x * 2

    wrapped = ch.bucketed(double, [4, 8], dim=0)
    x = torch.arange(15, dtype=dtype).reshape(5, 3)
    yours = wrapped(x)
    what = f"bucketed(x * 2, [4, 8], dim=0) on a (5, 3) {dtype}"
    expect_equal(seen, [((8, 3), dtype)], f"{what}: (shape, dtype) fn was called with")
    expect_equal(yours.dtype, dtype, f"{what}: dtype of the result")
    expect_equal(yours.tolist(), (x * 2).tolist(), f"{what}: the result")
