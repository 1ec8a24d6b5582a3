"""Lowerings of the pointwise and pooling ops vision models use (ReLU6, hardswish, hardsigmoid, max and
average pooling, the restride of a pooled value): no aten fallback, values against eager in fp32 and
bf16 (the kinks, ties and NaN included), and gradients against eager through their VJP rules'
backward ops (lowered too for the activations and max pooling)."""
import pytest
import torch
import torch.nn.functional as F

from tininductor.testing import compile_graph

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ACTIVATIONS = {
    "relu6": F.relu6,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 2.0),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
}
TOL = {torch.float32: {}, torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2}}


def with_kinks(*size, dtype=torch.float32, nan=True):
    """Random values around the activations' kinks, and the kinks themselves, exactly, and a NaN."""
    torch.manual_seed(0)
    x = torch.randn(size) * 4
    flat = x.view(-1)
    kinks = torch.tensor([-3.0, 3.0, 0.0, 6.0, -0.5, 2.0] + [float("nan")] * nan)
    flat[: len(kinks)] = kinks
    return x.to(dtype)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_fuses_without_fallback(name, dtype, backend):
    act = ACTIVATIONS[name]

    def f(x, scale, shift):  # what a batch norm in inference is, then the activation
        return act(x * scale + shift)

    x = with_kinks(2, 3, 4, 5, dtype=dtype)
    scale, shift = torch.ones(3, 1, 1, dtype=dtype), torch.zeros(3, 1, 1, dtype=dtype)
    c = compile_graph(f, [x, scale, shift], backend)
    assert c.fallback_reasons == [], c.fallback_reasons
    assert len(c.kernels) == 1, c.source  # the activation is in the affine's kernel
    torch.testing.assert_close(c(x, scale, shift), f(x, scale, shift), equal_nan=True, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradient(name, dtype):
    """The backward graph calls the op's ATen backward formula as a lowering (zero gradient at the
    kinks, as eager), not as a fallback."""
    act = ACTIVATIONS[name]
    # no NaN: eager's own CPU kernels disagree on its gradient (hardswish_backward's vectorized loop
    # gives NaN, its scalar tail the incoming gradient)
    x = with_kinks(3, 17, dtype=dtype, nan=False).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    c = compile_graph(lambda x: act(x) * 2, [x])
    assert len(c.compiled_graphs) == 2  # forward and backward
    assert all(g.fallback_reasons == [] for g in c.compiled_graphs), [g.fallback_reasons for g in c.compiled_graphs]
    grad = torch.randn(3, 17).to(dtype)
    out = c(x)
    out.backward(grad)
    want = act(x_ref) * 2
    want.backward(grad)
    torch.testing.assert_close(out, want, equal_nan=True, **TOL[dtype])
    torch.testing.assert_close(x.grad, x_ref.grad, equal_nan=True, **TOL[dtype])


POOLS = {  # (kernel_size, stride, padding, dilation, ceil_mode)
    "resnet_3x3_s2_p1": (3, 2, 1, 1, False),
    "2x2": (2, None, 0, 1, False),
    "3x3_s1_p1_dilated": (3, 1, 1, 2, False),
    "3x3_s2_ceil": (3, 2, 0, 1, True),  # squeezenet's; a last partial window
    "rect_2x3_s_1x2_p_1x0": ((2, 3), (1, 2), (1, 0), 1, False),
}


def pool_input(*size, dtype=torch.float32):
    """Small integers (many ties: the first maximum in the window's row-by-row order must win),
    a NaN (it wins its windows) and a -inf (a window of -inf and padding picks its first element)."""
    torch.manual_seed(0)
    x = torch.randint(-3, 4, size).float()
    x[0, 0, 1, 1] = float("nan")
    x[0, 1, 0, :3] = -float("inf")
    x[0, 1, 1, :3] = -float("inf")
    return x.to(dtype)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_max_pool2d_values_and_indices(pool, dtype, backend):
    kernel, stride, padding, dilation, ceil_mode = POOLS[pool]

    def f(x):
        return F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode, return_indices=True)

    x = pool_input(2, 3, 9, 8, dtype=dtype)
    c = compile_graph(f, [x], backend)
    assert c.fallback_reasons == [], c.fallback_reasons
    (values, indices), (want_values, want_indices) = c(x), f(x)
    torch.testing.assert_close(values, want_values, equal_nan=True)
    torch.testing.assert_close(indices, want_indices)


def test_max_pool2d_inference_computes_no_indices():
    """Without a backward the indices are unused: no kernel computes them, and the pool fuses with
    the ReLU before it and the add after it."""
    def f(x, y):
        return F.max_pool2d(torch.relu(x), 3, 2, 1) + y

    x, y = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 5, 4)
    c = compile_graph(f, [x, y], "cpp")
    assert c.fallback_reasons == [] and len(c.kernels) == 1, c.source
    assert "static_cast<int64_t>(-1)" not in c.source  # the indices' "nothing taken yet" sentinel
    torch.testing.assert_close(c(x, y), f(x, y))


@pytest.mark.parametrize("pool_fn", [lambda t: F.max_pool2d(t, 3, 2, 1), lambda t: F.avg_pool2d(t, 3, 2, 1)],
                         ids=["max", "avg"])
def test_pool_stores_a_costly_producer_first(pool_fn):
    """A window reads each element up to kh * kw times: a batch norm (five reads) feeding a 3x3 pool
    is stored by a kernel of its own instead of being recomputed nine times per output, while the
    ReLU of the test above stays inlined (StorageBox.mark_reuse, as for a producer with 9 users)."""
    mean, var, w, b = torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3)

    def f(x):
        return pool_fn(torch.relu(F.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5)))

    x = torch.randn(2, 3, 9, 8)
    with torch.no_grad():
        c = compile_graph(f, [x], "cpp")
        torch.testing.assert_close(c(x), f(x))
    assert c.fallback_reasons == [] and len(c.kernels) == 2, c.kernels


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_max_pool2d_gradient(pool):
    """Training: the forward computes the indices the backward op reads, and the backward op is a
    lowering too (each input gathers the gradients of the windows whose maximum it is); ties send
    the gradient to eager's element."""
    kernel, stride, padding, dilation, ceil_mode = POOLS[pool]

    def f(x):
        return F.max_pool2d(x * 2, kernel, stride, padding, dilation, ceil_mode)

    x = pool_input(2, 3, 9, 8)
    x[0, 0, 1, 1] = 0.0  # no NaN in gradients
    x.requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    c = compile_graph(f, [x])
    assert len(c.compiled_graphs) == 2  # forward and backward
    assert all(g.fallback_reasons == [] for g in c.compiled_graphs), [g.fallback_reasons for g in c.compiled_graphs]
    grad = torch.randn_like(f(x_ref))
    c(x).backward(grad)
    f(x_ref).backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_max_pool2d_channels_last_under_layout_optimization():
    """ResNet's stem: conv, batch norm, ReLU, max pool, conv. The pool reads and writes channels-last."""
    stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(8, 4, 3)).eval()
    x = torch.randn(2, 3, 9, 8)
    with torch.no_grad():
        c = compile_graph(stem, [x], "cpp", force_layout_optimization=True)
        torch.testing.assert_close(c(x), stem(x), rtol=1e-4, atol=1e-5)
    assert c.fallback_reasons == []
    assert "(40, 1, 8, 2)" not in c.source  # no 2-channel tensor; (N, 8, 5, 4) channels-last below
    assert "(160, 1, 32, 8)" in c.source, c.source


AVG_POOLS = {  # (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    "densenet_2x2": (2, None, 0, False, True, None),
    "3x3_s2_p1": (3, 2, 1, False, True, None),
    "3x3_s2_p1_ceil": (3, 2, 1, True, True, None),
    "3x3_s2_p1_exclude_pad": (3, 2, 1, False, False, None),
    "3x3_s2_p1_ceil_exclude_pad": (3, 2, 1, True, False, None),
    "divisor_override": (3, 1, 1, False, True, 5),
    "rect_2x3_s_1x2_p_1x0": ((2, 3), (1, 2), (1, 0), False, True, None),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pool", sorted(AVG_POOLS))
def test_avg_pool2d(pool, dtype, backend):
    def f(x):
        return F.avg_pool2d(x, *AVG_POOLS[pool])

    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 8).to(dtype)
    c = compile_graph(f, [x], backend)
    assert c.fallback_reasons == [], c.fallback_reasons
    torch.testing.assert_close(c(x), f(x))


def test_avg_pool2d_gradient():
    def f(x):
        return F.avg_pool2d(x * 2, 3, 2, 1, True, False)

    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    c = compile_graph(f, [x])
    grad = torch.randn_like(f(x_ref))
    torch.testing.assert_close(c(x), f(x_ref))
    c(x).backward(grad)
    f(x_ref).backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_restride_of_a_pooled_value_is_a_view():
    """ATen's global average pool restrides its ``(N, C, 1, 1)`` output with ``as_strided`` to its
    input's memory format (ConvNeXt's and Swin's heads): a view of the pooled buffer, no ATen call."""
    def f(x):
        pooled = (x * 2).mean([2, 3], keepdim=True)
        return torch.as_strided(pooled, (2, 4, 1, 1), (4, 1, 4, 4)).flatten(1) + 1

    x = torch.randn(2, 4, 5, 6)
    c = compile_graph(f, [x], "cpp")
    assert c.fallback_reasons == [], c.fallback_reasons
    torch.testing.assert_close(c(x), f(x))


def test_as_strided_of_an_input_stays_the_aten_op():
    """An input may be a view into a larger storage: ``as_strided`` of it runs as the ATen op."""
    def f(x):
        return torch.as_strided(x, (2, 2), (1, 3), 1) * 2

    base = torch.randn(20)
    x = base[4:16].view(3, 4)
    c = compile_graph(f, [x], "cpp")
    assert c.fallback_reasons and "as_strided" in c.fallback_reasons[0]
    torch.testing.assert_close(c(x), f(x))
