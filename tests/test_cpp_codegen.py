"""The C++ backend end to end: FX graph -> compile_fx (cpu_backend="cpp") -> g++ -> ctypes, vs eager.

Each test compiles few kernels (every kernel is one g++ run), so graphs return many outputs.
"""
import types

import pytest
import torch

from tininductor.testing import compile_graph
from tinydynamo import artifacts

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _cpp_backend(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TINY_CPU_BACKEND", "cpp")
    monkeypatch.setenv("TINY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tiny_cache"))


def check(fn, *args, kernels=None, atol=None, rtol=None):
    """Compile with the C++ backend, compare with eager; the kernels and wrapper come from the
    compile's artefacts (``kernels`` and ``output_code`` records)."""
    with artifacts.collecting("test_cpp_codegen") as arts:
        compiled = compile_graph(fn, args)
    torch.testing.assert_close(compiled(*args), fn(*args), atol=atol, rtol=rtol, equal_nan=True, check_stride=False)
    result = types.SimpleNamespace(kernels=[title for title, _ in arts.get("kernels")],
                                   source="\n".join(str(code) for _, code in arts.get("output_code")))
    if kernels is not None:
        assert len(result.kernels) == kernels, f"{result.kernels}\n{result.source}"
    return result


def rand(*size, dtype=torch.float32):
    if dtype.is_floating_point:
        return torch.randn(size).to(dtype)
    if dtype == torch.bool:
        return torch.rand(size) > 0.5
    return torch.randint(-5, 6, size, dtype=dtype)


def test_chain_is_one_named_cpp_kernel():
    c = check(lambda x, y: ((x + y).sin() * 2).exp(), rand(8, 8), rand(8, 8), kernels=1)
    assert c.kernels == ["cpp_fused_add_sin_mul_exp_0"]
    assert "// source nodes: add, sin, mul, exp" in c.source
    assert 'extern "C" void cpp_fused_add_sin_mul_exp_0(' in c.source
    assert "load_cpp_kernel(" in c.source


@pytest.mark.parametrize("size", [(0,), (1,), (3, 5), (2, 3, 37)])
def test_unary_ops_odd_sizes(size):
    def f(x):
        a = torch.abs(x) + 0.5
        return (torch.neg(x), torch.exp(x), torch.log(a), torch.sqrt(a), torch.rsqrt(a), torch.reciprocal(a),
                torch.sin(x), torch.cos(x), torch.tanh(x), torch.sigmoid(x), torch.erf(x), torch.sign(x),
                torch.relu(x), torch.log1p(a), torch.expm1(x), torch.floor(x), torch.ceil(x))
    check(f, rand(*size), atol=1e-5, rtol=1e-4)


def test_binary_comparisons_broadcast_and_nan():
    def f(x, y):
        return (x + y, x - y, x * y, x / (y.abs() + 1), torch.maximum(x, y), torch.minimum(x, y),
                x == y, x != y, x < y, x <= y, x > y, x >= y, torch.where(x > y, x, y), x ** 2)
    x = rand(4, 1, 5)
    x[0, 0, 0] = float("nan")
    check(f, x, rand(3, 1), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.bool])
def test_pointwise_dtypes(dtype):
    if dtype == torch.bool:
        check(lambda x, y: (x & y, x | ~y, torch.logical_not(x)), rand(5, 3, dtype=dtype), rand(5, 3, dtype=dtype))
    elif dtype.is_floating_point:
        tol = 1e-7 if dtype == torch.float64 else 3e-2
        check(lambda x, y: ((x * y + 1).sin(), (x + y).to(torch.float32)),
              rand(5, 7, dtype=dtype), rand(5, 7, dtype=dtype), atol=tol, rtol=tol)
    else:
        check(lambda x, y: (x + y * 3, x * y, torch.maximum(x, y), x > y, x.float() * 0.5),
              rand(5, 7, dtype=dtype), rand(5, 7, dtype=dtype))


def test_views_and_noncontiguous_inputs():
    def f(x, y):
        return x.t() + 1, x.reshape(-1)[::3] * 2, x[1] + y[:, 2], (x + 1).view(3, 2, 4).permute(2, 0, 1) * y.sum()
    x = rand(8, 6).t()  # transposed input: (6, 8) with strides (1, 6)
    check(f, x.contiguous().view(6, 8)[:, :4].contiguous(), rand(4, 6))
    check(lambda a: (a * 2).sin(), x)


def test_nested_loops_for_wide_pointwise():
    c = check(lambda x, y: x * y + 1, rand(5, 40), rand(40), kernels=1)
    assert "for (int64_t x1 = 0; x1 < 40; ++x1)" in c.source and "/ (" not in c.source


def test_reductions_over_dims():
    def f(x):
        return (x.sum(-1), x.sum(0), x.sum(), x.mean(-1, keepdim=True), x.amax(-1), x.amin(0),
                x.var(-1), x.prod(-1))
    for shape in [(5, 7), (1, 1), (3, 130)]:
        check(f, rand(*shape), atol=1e-4, rtol=1e-4)


def test_rounding_as_eager_no_fused_multiply_add():
    """Eager rounds ``x*x`` before subtracting; an FMA would not, so ``x*x - mean(x*x)`` over one
    element would be a rounding error instead of 0, and the variance ``0/0 = nan`` would be inf."""
    def f(x):
        sq = x * x
        return sq.var(-1), sq - sq.sum(-1, keepdim=True)
    check(f, rand(64, 1) * 3, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_casts_to_16_bit_floats_round_inside_a_fused_kernel(dtype):
    """``.to(bf16)`` rounds where it is, even when the value never leaves the kernel (values are
    computed in float), and so does each bf16 op of a chain: results equal eager's bit for bit
    (an RMSNorm's ``(x.float() * rsqrt(var)).to(bf16) * w`` and an fp32 round trip through bf16)."""
    def round_trip(x):
        return (x * 3.1).to(dtype).float() + 1

    def rms_norm(x, w):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype) * w

    def chain(x):
        return (x * 3 + 0.5) * x - 1

    x = rand(16, 33) * 4
    c = check(round_trip, x, atol=0, rtol=0, kernels=1)
    assert "to_float(tiny_float_to_" in c.source
    check(rms_norm, x.to(dtype), rand(33, dtype=dtype), atol=0, rtol=0)
    check(chain, x.to(dtype), atol=0, rtol=0, kernels=1)


def test_internal_buffer_reread_by_a_later_loop_is_stored():
    """``y`` (kept in registers: read only inside this kernel) is re-read by the loop after its
    reduction over two dims, whose index variables get new names (r3, r4 for r0, r1): it must be
    stored, not left undefined (was: ``NameError: buf0`` in masked.std's backward)."""
    def f(a, b, c, d, e):
        y = a * b + c * d + e   # five reads: realized, not inlined into both users
        return y + y.sum([1, 2], keepdim=True)

    check(f, *[rand(4, 3, 5) for _ in range(5)], kernels=1)


def test_reductions_empty_and_noncontiguous():
    check(lambda x: (x.sum(-1), x.sum(0)), rand(0, 3))
    check(lambda x: (x.sum(-1), x.amax(-1)), rand(9, 17).t())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64])
def test_reduction_dtypes(dtype):
    tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else None
    check(lambda x: (x.sum(-1), x.amax(-1)), rand(6, 33, dtype=dtype), atol=tol, rtol=tol)


def test_softmax_log_softmax_layer_norm_one_kernel_each():
    x = rand(6, 45)
    c = check(lambda x: torch.softmax(x, -1), x, kernels=1)
    assert c.source.count("for (int64_t rindex") == 3   # max | sum of exp | normalise
    check(lambda x: torch.log_softmax(x, -1), x, kernels=1, atol=1e-5, rtol=1e-5)
    w, b = rand(45), rand(45)
    check(lambda x, w, b: torch.nn.functional.layer_norm(x, (45,), w, b), x, w, b, kernels=1, atol=1e-5, rtol=1e-5)


def test_big_kernels_are_openmp_parallel():
    rows = check(lambda x: torch.softmax(x, -1), rand(256, 200), kernels=1)
    assert "#pragma omp parallel for" in rows.source          # rows in parallel
    full = check(lambda x: x.sum(), rand(70001), kernels=1, atol=1e-3, rtol=1e-5)
    assert "#pragma omp parallel for simd reduction(+:" in full.source  # one row: the reduction loop splits
    wide = check(lambda x: x.sin() * 2, rand(300, 300), kernels=1)
    assert "#pragma omp parallel for" in wide.source and "#pragma omp simd" in wide.source


def test_indirect_indexing_embedding_gather_advanced():
    w, idx = rand(10, 4), torch.tensor([[1, 9, 2], [0, 3, -1]])
    c = check(lambda w, i: (torch.nn.functional.embedding(i.abs(), w) * 2, w[i], torch.gather(w, 1, i.abs().clamp(max=3).t())), w, idx)
    assert "fallback" not in c.source and "tiny_check_index(" in c.source   # negative indices wrap, out of range raises
