"""tinydynamo captures Python functions into one FX graph: outputs equal eager; frames and ops counted."""
import math
import operator

import pytest
import torch
import torch.nn.functional as F

import tinydynamo
from tests.dynamo_utils import check_same
from tinydynamo.testing import CompileCounter

r = torch.randn
SCALE = 2.5


def two(shape=(4, 5)):
    return [(r(*shape), r(*shape)), (r(*shape), r(*shape))]


def test_arithmetic_and_torch_functions():
    def f(x, y):
        a = torch.sin(x) + y * 2 - x / 3
        b = F.relu(a) @ y.T
        return torch.cat([a, -x], dim=0).sum(0), b ** 2, x > y

    cnt = check_same(f, *two())
    assert cnt.op_count == 13


def test_tensor_methods_and_metadata():
    def f(x):
        n = x.shape[0] * x.size(1) + x.dim() + x.ndim + x.numel()
        y = x.view(x.size(0), -1).transpose(0, 1).contiguous()
        if x.dtype == torch.float32 and x.device.type == "cpu" and not x.requires_grad:
            y = y + n
        return y.reshape(-1)[: x.shape[1]], x.mean(dim=-1, keepdim=True), x.T

    check_same(f, (r(3, 4),), (r(3, 4),))


def test_constant_control_flow_folds_and_loops_unroll():
    def f(x, n: int):
        total = x
        for i in range(n):
            if i % 2 == 0:
                total = total + i
            else:
                total = total * 0.5
        k = 0
        while k < 3:
            total = total - 1
            k += 1
        return total

    cnt = check_same(f, (r(4), 4), (r(4), 4))
    assert cnt.op_count == 4 + 3


def test_user_functions_inlined_with_defaults_kwargs_varargs():
    def helper(a, b=2.0, *rest, scale=1.0, **extra):
        out = a * b * scale
        for t in rest:
            out = out + t
        return out + extra.get("bias", 0.0)

    def f(x, y):
        return helper(x), helper(x, 3.0, y, y, scale=SCALE, bias=1.0), helper(*[x, 0.5], **{"scale": 2.0})

    check_same(f, *two())


def test_closures_nested_functions_and_lambdas():
    w = 3.0

    def make(k):
        def inner(t):
            return t * k + w
        return inner

    g = make(4.0)

    def f(x):
        offset = 1.0

        def local(t):
            return t + offset

        sq = lambda t: t * t  # noqa: E731
        return local(g(x)), sq(x), [sq(t) for t in (x, x + 1)][1]

    check_same(f, (r(3),), (r(3),))


def test_python_containers_and_builtins():
    def f(x, y):
        xs = [x, y]
        xs.append(x + y)
        d = {"a": x, "b": y}
        d["c"] = xs[-1]
        out = []
        for i, (k, v) in enumerate(sorted(d.items())):
            out.append(v * (i + 1))
        n = len(out) + min(3, 4) + max([1, 7]) + abs(-2) + sum([1, 2])
        first, *rest = out
        assert isinstance(x, torch.Tensor) and not isinstance(n, float)
        return first * n, tuple(rest), {k: v + 1 for k, v in zip("pq", rest)}, getattr(x, "shape")

    check_same(f, *two())


def test_math_and_operator_on_constants():
    def f(x):
        s = math.sqrt(16) + math.pi * 0 + operator.mul(2, 3)
        return operator.add(x, s), torch.full_like(x, math.log(math.e))

    cnt = check_same(f, (r(2),), (r(2),))
    assert cnt.op_count == 2


def test_method_calls_on_objects_and_slicing():
    class Cfg:
        def __init__(self):
            self.alpha = 0.5

        def scale(self, t):
            return t * self.alpha

    cfg = Cfg()

    def f(x, c):
        return c.scale(x)[1:, ::2], x[..., None].squeeze(-1), x[[0, 1]]

    check_same(f, (r(4, 6), cfg), (r(4, 6), cfg))


def test_inplace_and_setitem_on_local_tensor():
    def f(x):
        y = x.clone()
        y[0] = 7.0
        y.add_(1)
        y += 1
        return y

    check_same(f, (r(3, 2),), (r(3, 2),))


def test_compiled_function_called_from_traced_code_is_inlined():
    inner = tinydynamo.optimize("eager")(lambda t: t.cos() + 1)

    def f(x):
        return inner(x) * 2

    cnt = check_same(f, (r(3),), (r(3),))
    assert cnt.op_count == 3


def test_returns_constants_and_inputs_without_ops_skip_the_backend():
    def f(x, n):
        return x, n + 1

    tinydynamo.reset()
    cnt = CompileCounter()
    g = tinydynamo.optimize(cnt)(f)
    x = r(2)
    out = g(x, 3)
    assert out[0] is x and out[1] == 4
    assert cnt.frame_count == 0  # nothing to compile: the backend is not called, like TorchDynamo


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtypes(dtype):
    def f(x):
        return (x.to(torch.float32) * 2).to(x.dtype) + torch.ones(3, dtype=x.dtype)

    check_same(f, (r(3, dtype=dtype),), (r(3, dtype=dtype),))


def unused_draws(x):
    torch.rand(3)  # its numbers are unused, but eager draws them: the next draw depends on it
    torch.nn.functional.dropout(x, 0.5, training=True)
    x.sin()  # pure and unused: dropped
    return x + torch.rand(3)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_unused_random_draws_stay_in_the_graph(backend):
    x = torch.zeros(3)
    torch.manual_seed(0)
    expected = unused_draws(x)
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt, nopython=True)(unused_draws)
    torch.manual_seed(0)
    got = compiled(x)
    torch.testing.assert_close(got, expected)
    assert cnt.op_count == 4  # rand, dropout, rand, add (not sin)
    if backend == "aot_eager":  # the same through a backend that retraces the graph
        tinydynamo.reset()
        torch.manual_seed(0)
        torch.testing.assert_close(tinydynamo.optimize(backend, nopython=True)(unused_draws)(x), expected)
