"""Capture gaps found by the wider real-model sweep, each checked against torch.compile's graph
count on the same small code (``torch._dynamo.testing.CompileCounter``) and against eager's values
and gradients: custom ``torch.autograd.Function``s (bloom's GeLUFunction), ``functools.partial``
objects (gemma's activation), and graph breaks inside ``try`` blocks (transformers' forward wrapper)."""
from __future__ import annotations

import copy
import functools
import warnings

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounter

import tinydynamo

BACKENDS = ["eager", "aot_eager"]


def torch_graphs(fn, *args) -> int:
    torch._dynamo.reset()
    cc = CompileCounter()
    torch.compile(fn, backend=cc)(*args)
    return cc.frame_count


def check_grads(fn, backend, *args, fullgraph=False):
    """Forward value and every input's gradient equal eager's."""
    ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    ref = fn(*ref_args)
    ref.sum().backward()
    out = tinydynamo.compile(fn, backend=backend, fullgraph=fullgraph)(*args)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    for a, r in zip(args, ref_args):
        if r.requires_grad:
            torch.testing.assert_close(a.grad, r.grad)


# ---- custom torch.autograd.Function ------------------------------------------------------------------

class StraightThrough(torch.autograd.Function):
    """round() forward, identity backward: its gradient is not the forward's (which is zero)."""

    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, grad):
        return grad


class ScaledMul(torch.autograd.Function):
    """Two outputs, a float argument, saved tensors and a ctx attribute."""

    @staticmethod
    def forward(ctx, x, k, y):
        ctx.save_for_backward(x, y)
        ctx.k = k
        return x * y * k, x + 1

    @staticmethod
    def backward(ctx, g1, g2):
        x, y = ctx.saved_tensors
        gx = g1 * y * ctx.k * 3 + g2 if ctx.needs_input_grad[0] else None  # 3: not the forward's formula
        gy = g1 * x * ctx.k if ctx.needs_input_grad[2] else None
        return gx, None, gy


class NewStyleExp(torch.autograd.Function):
    """forward without ctx + setup_context, and a once_differentiable backward."""

    @staticmethod
    def forward(x):
        return x.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out * 2


class SortWithIndices(torch.autograd.Function):
    """The indices output is marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        values, idx = x.sort()
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(idx)
        return values, idx

    @staticmethod
    def backward(ctx, g, _):
        (idx,) = ctx.saved_tensors
        return torch.zeros_like(g).scatter(-1, idx, g)


class Identity(torch.autograd.Function):
    """Returns its input itself (a custom op's output must be a new tensor: copied)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad * 5


class NumpyForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.from_numpy(np.sin(x.numpy()))

    @staticmethod
    def backward(ctx, grad):
        return grad


class RandomMask(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        mask = torch.rand_like(x) > 0.5
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask


@pytest.mark.parametrize("backend", BACKENDS)
def test_straight_through_estimator_keeps_its_backward(backend):
    def f(x):
        return StraightThrough.apply(x * 3).sin()

    x = torch.randn(6, requires_grad=True)
    check_grads(f, backend, x, fullgraph=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_function_in_one_graph_like_torch(backend):
    def f(x, y):
        a = StraightThrough.apply(x * 2)
        b, c = ScaledMul.apply(a.sin(), 2.0, y)
        return b + c + NewStyleExp.apply(y)

    x, y = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    check_grads(f, backend, x, y, fullgraph=True)
    explain = tinydynamo.explain(f)(x, y)
    assert (explain.graph_count, explain.graph_break_count) == (torch_graphs(f, x, y), 0) == (1, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_function_needs_input_grad_and_constants(backend):
    def f(x, y):
        return ScaledMul.apply(x, 0.5, y)[0] * 2

    x, y = torch.randn(4, requires_grad=True), torch.randn(4)  # y needs no grad
    check_grads(f, backend, x, y, fullgraph=True)
    z = torch.randn(4)
    torch.testing.assert_close(tinydynamo.compile(f, backend=backend)(x, z), f(x, z))


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_function_non_differentiable_output_and_alias(backend):
    def f(x):
        values, idx = SortWithIndices.apply(x)
        return values * 2 + Identity.apply(x) + idx.float()

    x = torch.randn(3, 5, requires_grad=True)
    check_grads(f, backend, x, fullgraph=True)
    values, idx = tinydynamo.compile(lambda x: SortWithIndices.apply(x), backend=backend)(x)
    assert values.requires_grad and not idx.requires_grad  # as eager


def test_autograd_function_without_grad():
    def f(x):
        return StraightThrough.apply(x) + 1

    x = torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(tinydynamo.compile(f, backend="aot_eager", fullgraph=True)(x), f(x))


@pytest.mark.parametrize("fn_cls", [NumpyForward, RandomMask])
def test_autograd_function_that_cannot_be_captured_breaks(fn_cls):
    """A forward fake tensors cannot run, or one whose replay in backward would draw other random
    numbers, stays a graph break: the Function runs eagerly, with its own backward."""
    def f(x):
        return fn_cls.apply(x * 2) * 3

    x = torch.randn(6, requires_grad=True)
    explain = tinydynamo.explain(f)(x)
    assert explain.graph_break_count == 1 and fn_cls.__name__ in str(explain.break_reasons[0])
    torch.manual_seed(0)
    ref = f(x)
    ref.sum().backward()
    expected, x.grad = x.grad, None
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tinydynamo.compile(f, backend="aot_eager")(x)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    torch.testing.assert_close(x.grad, expected)


# ---- functools.partial -------------------------------------------------------------------------------

def _act(x, approximate="none", scale=1.0):
    return torch.nn.functional.gelu(x, approximate=approximate) * scale


ACT = functools.partial(_act, approximate="tanh", scale=2.0)


def test_partial_global_is_called_through_and_guarded():
    def f(x):
        return ACT(x + 1) - 1

    x = torch.randn(8)
    explain = tinydynamo.explain(f)(x)
    assert (explain.graph_count, explain.graph_break_count) == (torch_graphs(f, x), 0) == (1, 0)
    compiled = tinydynamo.compile(f, backend="eager")
    torch.testing.assert_close(compiled(x), f(x))
    global ACT
    saved = ACT
    try:
        ACT = functools.partial(_act, approximate="none", scale=3.0)  # other contents: recompiled
        torch.testing.assert_close(compiled(x), f(x))
        ACT = functools.partial(torch.mul, 4.0)  # another function
        torch.testing.assert_close(compiled(x), f(x))
    finally:
        ACT = saved


def test_partial_module_attribute_and_made_in_frame():
    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.act = functools.partial(_act, scale=0.5)

        def forward(self, x):
            double = functools.partial(torch.mul, other=2.0)
            return double(self.act(self.fc(x)))

    model, x = Mlp(), torch.randn(3, 4, requires_grad=True)
    explain = tinydynamo.explain(model)(x)
    assert (explain.graph_count, explain.graph_break_count) == (torch_graphs(model, x), 0) == (1, 0)
    check_grads(model, "aot_eager", x, fullgraph=True)


# ---- graph breaks inside try blocks --------------------------------------------------------------

FINALLY_RUNS = []


def keep_defaults(func):
    """Like transformers' ``merge_with_config_defaults``: a try/finally around the wrapped call."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            out = func(*args, **kwargs)
        finally:
            FINALLY_RUNS.append(1)
        return out
    return wrapper


@keep_defaults
def breaks_inside(x):
    x = x.sin()
    print("", end="")  # graph break
    return x.cos()


def calls_breaking_helper(x):
    x = x.sin()
    try:
        y = breaks_inside(x)
    except ImportError:
        y = x
    return y * 2


def test_break_under_try_finally_compiles_the_called_function():
    """The wrapper frame cannot resume inside its try block: it runs natively (its finally too),
    and the function it calls gets its own graphs, as TorchDynamo's frame hook gives them."""
    x = torch.randn(5)
    explain = tinydynamo.explain(breaks_inside)(x)
    assert explain.graph_count == torch_graphs(breaks_inside, x) == 2
    FINALLY_RUNS.clear()
    counter = CompileCounter()
    out = tinydynamo.compile(breaks_inside, backend=counter)(x)
    torch.testing.assert_close(out, x.sin().cos())
    assert counter.frame_count == 2 and FINALLY_RUNS == [1]


def test_break_under_try_except_compiles_the_called_function():
    x = torch.randn(5)
    explain = tinydynamo.explain(calls_breaking_helper)(x)
    assert explain.graph_count == torch_graphs(calls_breaking_helper, x) == 2
    check_grads(calls_breaking_helper, "aot_eager", torch.randn(5, requires_grad=True))


def raises_import_error(x):
    print("", end="")
    raise ImportError("no such backend")


def test_exception_from_the_compiled_callee_reaches_the_handler():
    def f(x):
        x = x + 1
        try:
            y = raises_import_error(x)
        except ImportError:
            y = x * 3
        return y

    x = torch.randn(4)
    torch.testing.assert_close(tinydynamo.compile(f, backend="eager")(x), f(x))
    torch.testing.assert_close(tinydynamo.compile(f, backend="eager")(x), f(x))  # cached: runs the same


class Wrapped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    @keep_defaults
    def forward(self, x, *, scale=2.0):
        h = self.fc(x).relu()
        print("", end="")
        return self.fc(h) * scale


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_forward_under_try_finally_wrapper(backend):
    model, x = Wrapped(), torch.randn(3, 4, requires_grad=True)
    explain = tinydynamo.explain(model)(x)
    assert explain.graph_count == torch_graphs(model, x) == 2
    check_grads(model, backend, x)
    compiled = tinydynamo.compile(model, backend=backend)
    torch.testing.assert_close(compiled(x, scale=3.0), model(x, scale=3.0))


# ---- list.copy (torchvision's Swin: shift_size = shift_size.copy()) -------------------------------

SHIFT = [1, 2]


def test_list_copy_is_a_new_list():
    def f(x):
        shift = SHIFT.copy()
        shift[0] = 0  # changes the copy only
        return torch.roll(x, shift, (0, 1))

    x = torch.randn(4, 5)
    explain = tinydynamo.explain(f)(x)
    assert (explain.graph_count, explain.graph_break_count) == (torch_graphs(f, x), 0) == (1, 0)
    torch.testing.assert_close(tinydynamo.compile(f, backend="eager")(x), f(x))
    assert SHIFT == [1, 2]


@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_gradients_under_aot(dim):
    """wav2vec2's positional convolution: weight_norm's ``_weight_norm_interface`` decomposes."""
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 4, 3, padding=1), dim=dim)
    twin = copy.deepcopy(conv)
    x = torch.randn(2, 4, 6)
    (conv(x) ** 2).sum().backward()
    compiled = tinydynamo.compile(twin, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    torch.testing.assert_close(out, conv(x))
    (out ** 2).sum().backward()
    for (name, p), q in zip(conv.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


# ---- lru_cache and assume_constant_result (transformers' is_torch_distributed_available) ----------

@functools.lru_cache
def cached_scale(n):
    return n * 2


@functools.lru_cache
@torch._dynamo.assume_constant_result
def probe_installed():
    import importlib.metadata

    return importlib.metadata.version("torch") != ""  # a library call: folded, not traced


def test_lru_cache_function_and_assume_constant_result_are_traced_through():
    def f(x):
        if probe_installed():
            return x * cached_scale(3)
        return x

    x = torch.randn(4)
    explain = tinydynamo.explain(f)(x)
    assert (explain.graph_count, explain.graph_break_count) == (torch_graphs(f, x), 0) == (1, 0)
    torch.testing.assert_close(tinydynamo.compile(f, backend="eager")(x), x * 6)


# ---- TorchScript functions (deberta_v2 in transformers < 5.2) ---------------------------------------

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)

    @torch.jit.script
    def scripted_scale(x: torch.Tensor, n: int) -> torch.Tensor:
        return x * torch.sqrt(torch.tensor(float(n), dtype=x.dtype))


def uses_scripted(x):
    return scripted_scale(x.sin(), 4).cos()


@pytest.mark.parametrize("backend", BACKENDS)
def test_script_function_is_traced_through_its_python_function(backend):
    """A ``torch.jit.script`` function is inlined from ``_torchdynamo_inline`` (it was captured as a
    call of the ScriptFunction class, which raises)."""
    x = torch.randn(5, requires_grad=True)
    explain = tinydynamo.explain(uses_scripted)(x)
    assert (explain.graph_count, explain.graph_break_count) == (torch_graphs(uses_scripted, x), 0) == (1, 0)
    check_grads(uses_scripted, backend, x, fullgraph=True)
