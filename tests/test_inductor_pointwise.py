"""Pointwise lowering + Triton codegen vs eager: broadcasting, views/strides, dtypes, odd sizes."""
import re

import pytest
import torch

from tininductor.testing import DEVICE, check

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def rand(*size, dtype=torch.float32):
    if dtype.is_floating_point:
        return torch.randn(size, device=DEVICE).to(dtype)
    if dtype == torch.bool:
        return torch.rand(size, device=DEVICE) > 0.5
    return torch.randint(-5, 6, size, device=DEVICE, dtype=dtype)


def test_chain_is_one_kernel():
    c = check(lambda x, y: ((x + y).sin() * 2).exp(), rand(8, 8), rand(8, 8), kernels=1)
    assert re.match(r"(triton_poi|cpp)_fused_add_sin_mul_exp", c.kernels[0]), c.kernels
    assert "source nodes: add, sin, mul, exp" in c.source


@pytest.mark.parametrize("size", [(0,), (1,), (7,), (3, 5), (2, 3, 4)])
def test_unary_ops_odd_sizes(size):
    def f(x):
        a = torch.abs(x) + 0.5
        return (torch.neg(x), torch.exp(x), torch.log(a), torch.sqrt(a), torch.rsqrt(a), torch.reciprocal(a),
                torch.sin(x), torch.cos(x), torch.tanh(x), torch.sigmoid(x), torch.erf(x), torch.sign(x),
                torch.relu(x), torch.log1p(a), torch.expm1(x), torch.floor(x), torch.ceil(x))
    check(f, rand(*size), atol=1e-5, rtol=1e-4)


def test_binary_and_comparisons_broadcast():
    def f(x, y):
        return (x + y, x - y, x * y, x / (y.abs() + 1), torch.maximum(x, y), torch.minimum(x, y),
                x == y, x != y, x < y, x <= y, x > y, x >= y, torch.where(x > y, x, y), x ** 2, (x.abs() + 1) ** 1.5)
    check(f, rand(4, 1, 5), rand(3, 1), atol=1e-5, rtol=1e-4)


def test_scalars_and_alpha():
    check(lambda x: torch.add(x, x, alpha=3) - 2.5 * x + torch.sub(1.0, x), rand(6, 3))


def test_nan_propagates_through_maximum():
    x = torch.tensor([float("nan"), 1.0, -2.0], device=DEVICE)
    check(lambda a, b: (torch.maximum(a, b), torch.relu(a)), x, torch.zeros(3, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool])
def test_dtypes(dtype):
    if dtype == torch.bool:
        check(lambda x, y: (x & y, x | ~y, torch.logical_and(x, y), torch.logical_not(x)), rand(5, 3, dtype=dtype), rand(5, 3, dtype=dtype))
    elif dtype.is_floating_point:
        check(lambda x, y: ((x * y + 1).sin(), x / y.abs().clamp(min=0.5), (x + y).to(torch.float32)),
              rand(5, 7, dtype=dtype), rand(5, 7, dtype=dtype), atol=6e-2, rtol=6e-2)  # the interpreter truncates bf16
    else:
        check(lambda x, y: (x + y * 3, x * y, torch.maximum(x, y), x / 2, (x > y), x.abs(), x.float() * 0.5, -x),
              rand(5, 7, dtype=dtype), rand(5, 7, dtype=dtype))


def test_type_promotion_mixed():
    check(lambda a, b, c: (a + b, a * c, b + c, (a > 0) + c), rand(4, 4, dtype=torch.float16), rand(4, 4),
          rand(4, 4, dtype=torch.int64), atol=1e-3, rtol=1e-3)


def test_views_and_strides():
    def f(x, y):
        a = x.t() + 1                       # permute
        b = x.reshape(-1)[::3] * 2          # view + strided slice
        c = x[1] + y[:, 2]                  # select
        d = x.unsqueeze(0).expand(2, -1, -1).sin()
        e = (x + 1).view(3, 2, 4).permute(2, 0, 1).contiguous()  # view of an unrealized node
        f_ = x[1:3, ::2].squeeze() - 1
        return a, b, c, d, e, f_
    check(f, rand(6, 4), rand(4, 6))


def test_noncontiguous_inputs():
    x = rand(8, 6).t()                      # transposed input
    y = rand(12, 5)[::2, 1:]                # sliced input with storage offset
    check(lambda a, b: (a * 2 + 1, b.exp() - b), x, y)


def test_creation_ops():
    check(lambda x: (x + torch.arange(7, device=x.device), torch.zeros_like(x) + 3, torch.ones(2, 7, device=x.device) * x,
                     torch.full((7,), 2.5, device=x.device) + x), rand(7))


def test_graph_output_is_input_and_view_of_input():
    check(lambda x: (x, x.t(), x[1:]), rand(3, 4))


def test_multiple_users_realize_or_inline():
    def f(x):
        y = (x.exp() + x.sin() + x.cos() + x.tanh() + x.sigmoid()) * x.erf()  # big: realized when reused
        return y + 1, y * 2, y.sum(-1)
    check(f, rand(4, 8), atol=1e-5, rtol=1e-4)


def test_torch_compile_frontend():
    import tininductor

    torch._dynamo.reset()
    f = torch.compile(lambda x, y: torch.relu(x @ y + 1).sum(-1), backend=tininductor.compile_fx, dynamic=False)
    x, y = rand(4, 8), rand(8, 3)
    torch.testing.assert_close(f(x, y), torch.relu(x @ y + 1).sum(-1))


def test_embedding_and_gather_indirect_loads():
    w = rand(10, 4)
    idx = torch.tensor([[1, 9, 2], [0, 3, 3]], device=DEVICE)
    c = check(lambda w, i: (torch.nn.functional.embedding(i, w) * 2, torch.gather(w, 1, i.abs().clamp(max=3).t())), w, idx)
    assert "fallback" not in c.source


def test_advanced_indexing():
    x = rand(5, 6, 7)
    i = torch.tensor([[0, 4], [2, 2]], device=DEVICE)
    j = torch.tensor([1, 5], device=DEVICE)
    c = check(lambda x, i, j: (x[i] + 1, x[:, j], x[i, :, j], x[:, i, j[:1]] * 2), x, i, j)
    assert "fallback" not in c.source


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_casts_to_16_bit_floats_round_to_nearest_even_inside_a_kernel(dtype):
    """``.to(bf16)`` inside a fused kernel rounds there, to nearest even as eager does, and so does
    each bf16 op of a chain: equal to eager bit for bit (the Triton interpreter truncated
    float32 -> bfloat16; triton_helpers makes it round like a GPU)."""
    def round_trip(x):
        return (x * 3.1).to(dtype).float() + 1

    def chain(x):
        return (x * 3 + 0.5) * x - 1

    x = rand(16, 33) * 4
    c = check(round_trip, x, atol=0, rtol=0, kernels=1)
    assert ".to(tl.bfloat16)" in c.source or ".to(tl.float16)" in c.source or "tiny_float_to_" in c.source
    if DEVICE == "cpu":
        check(chain, x.to(dtype), atol=0, rtol=0, kernels=1)
    else:  # on a GPU Triton's compiler drops the float32 -> 16-bit -> float32 round trip between
        # two fused ops (TorchInductor's default too, without emulate_precision_casts): each dropped
        # rounding may move the result by an ulp of that intermediate (more than an ulp of the
        # result where `- 1` cancels), and by no more
        h = x.to(dtype)
        compiled = check(chain, h, atol=float("inf"), rtol=0, kernels=1)  # shape, dtype, one kernel
        actual, expected, t = compiled(h).float(), chain(h).float(), h.float()
        bound = torch.finfo(dtype).eps * ((t * 3).abs() * t.abs() + (t * 3 + 0.5).abs() * t.abs() + expected.abs() + 1)
        assert ((actual - expected).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int32, torch.int64])
@pytest.mark.parametrize("size", [(0,), (1,), (7, 3)])
def test_bitwise_and_or_fuse_into_one_kernel(dtype, size):
    """``&`` and ``|`` (attention masks are built with them) lower to the op table's ops: no fallbacks."""
    x, y = rand(*size, dtype=dtype), rand(*size, dtype=dtype)
    check(lambda x, y: ((x & y) | (x & y[:1]), torch.bitwise_or(x, y)), x, y, kernels=1 if size != (0,) else None)
