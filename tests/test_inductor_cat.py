"""``cat`` written by its producers: a where-chain over a few inputs (fused with producers and
consumers), or each input stored into its slice of the output (many inputs). Values against eager
on the C++ backend and the Triton interpreter; no ATen ``cat`` call left in the wrapper."""
import pytest
import torch

from tininductor.testing import compile_graph
from tininductor.virtualized import PlainTextHandler, V, ops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
BACKENDS = ["cpp", "triton"]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)



def check(fn, args, backend, **options):
    c = compile_graph(fn, args, backend, **options)
    torch.testing.assert_close(c(*args), fn(*args))
    source = "\n".join(g.source for g in c.compiled_graphs)
    assert "aten.cat" not in source, source
    assert not any("cat" in r for r in c.fallback_reasons), c.fallback_reasons
    return c


def rotate_half(x):
    """HF Llama's rotary embedding: ``x * cos + cat((-x2, x1)) * sin``."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * 0.5 + torch.cat((-x2, x1), dim=-1) * 0.25


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_cat_is_one_kernel_with_its_producers_and_consumers(backend):
    c = check(rotate_half, [torch.randn(2, 3, 4, 8)], backend)
    assert len(c.kernels) == 1, c.kernels


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cat_dims(backend, dim):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    shapes[0][dim] = 1
    shapes[2][dim] = 5
    args = [torch.randn(s) for s in shapes]
    check(lambda a, b, c: torch.cat([a.exp(), b, c * 2], dim) + 1, args, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                                    (torch.int64, torch.int32), (torch.bool, torch.bool)])
def test_cat_dtypes(backend, dtypes):
    args = [torch.randn(3, 4).mul(4).to(dtypes[0]), torch.randn(3, 2).mul(4).to(dtypes[1])]
    check(lambda a, b: torch.cat([a, b], 1), args, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cat_with_size_zero_inputs(backend):
    args = [torch.randn(2, 0), torch.randn(2, 3), torch.randn(0), torch.randn(2, 2)]
    check(lambda a, b, c, d: torch.cat([a, b.cos(), c, d], 1), args, backend)
    check(lambda a, b: torch.cat([a, b], 0), [torch.randn(0, 3), torch.randn(0, 3)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_inputs_store_into_slices(backend):
    """Above ``max_pointwise_cat_inputs``: one store per input into the output, each fused with
    that input's producer (its ``sin``)."""
    def many(a, b, c, d, e):
        return torch.cat([a.sin(), b.sin(), c, d.sin(), e], 1)

    args = [torch.randn(3, n, 2) for n in (1, 2, 3, 4, 5)]
    c = check(many, args, backend, max_pointwise_cat_inputs=2, max_pointwise_cat_inputs_masked=2)
    assert len(c.kernels) == 5, c.kernels
    assert "aten.empty" in c.source


@pytest.mark.parametrize("backend", BACKENDS)
def test_cat_of_an_extern_result_and_gradients(backend):
    """An mm result joins a cat; training: the gradient of each input is its slice."""
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, 5, requires_grad=True)
    x = torch.randn(3, 2, requires_grad=True)

    def f(a, b, x):
        return torch.cat([a @ b, x.tanh()], 1).pow(2)

    c = compile_graph(f, [a, b, x], backend)
    out = c(a, b, x)
    want = f(*[t.detach().clone().requires_grad_() for t in (a, b, x)])
    torch.testing.assert_close(out, want)
    grads = torch.autograd.grad(out.sum(), [a, b, x])
    ref_args = [t.detach().clone().requires_grad_() for t in (a, b, x)]
    ref = torch.autograd.grad(f(*ref_args).sum(), ref_args)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r)


def test_triton_reads_each_input_only_in_its_slice():
    """On Triton every input's load is masked to the slice it fills (``ops.masked``): an element of
    the output reads one input, not all of them (the memory traffic of a where-chain)."""
    def f(a, b, c):
        return torch.cat([a, b.exp(), c], 1).relu()

    args = [torch.randn(2, n, 3) for n in (2, 3, 4)]
    c = check(f, args, "triton")
    loads = [line for line in c.source.splitlines() if "tl.load(" in line]
    assert len(loads) == 3 and all("xmask & tmp" in line for line in loads), loads


@pytest.mark.parametrize("backend", BACKENDS)
def test_limit_of_a_pointwise_cat_depends_on_masked_loads(backend):
    """A DenseNet-like cat of 12 feature maps read by a batch norm: on Triton (masked loads) one
    kernel with its consumer; on C++ (a where-chain would load every input at every element) each
    input is stored into its slice first."""
    def f(scale, *feats):
        return (torch.cat(feats, 1) * scale).relu()

    args = [torch.randn(1, 12, 1, 1)] + [torch.randn(2, 1, 3, 3) for _ in range(12)]
    c = check(f, args, backend)
    assert len(c.kernels) == (1 if backend == "triton" else 13), c.kernels


def test_masked_without_a_handler_of_its_own_is_a_where():
    with V.set_ops_handler(PlainTextHandler()):
        text = ops.masked("m", lambda: ops.load("buf0", 0), "other")
    assert text == "where(m, load(buf0, 0), other)"
