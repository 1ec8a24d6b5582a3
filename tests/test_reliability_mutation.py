"""Reliability: input mutation and output aliasing as eager does them (compared with eager)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.reliability import BACKENDS, CASES, case, check


def X():
    return torch.arange(4.0)


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


@case("mutation")
def case_buffer_add_in_forward(C, rec):
    m = Counter()
    g = C(m)
    for _ in range(3):
        rec(g(X()))
        rec(m.count)


class ParamBump(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        with torch.no_grad():
            self.w.add_(1)
        return x * self.w


@case("mutation")
def case_parameter_add_under_no_grad(C, rec):
    m = ParamBump()
    g = C(m)
    for _ in range(2):
        out = g(X())
        rec(out)
        rec(m.w)
        out.sum().backward()
        rec(m.w.grad)


@case("mutation")
def case_input_mutated_and_used(C, rec):
    def f(x):
        x.mul_(2)
        y = x + 1
        x.add_(y)
        return y
    g = C(f)
    for _ in range(2):
        x = X()
        rec(g(x))
        rec(x)


@case("mutation")
def case_non_leaf_input_mutated(C, rec):
    def f(x):
        x.mul_(3)
        return x.sum()
    g = C(f)
    for _ in range(2):
        a = X().requires_grad_()
        x = a * 2
        out = g(x)
        rec(out)
        rec(x)
        out.backward()
        rec(a.grad)


@case("mutation")
def case_view_of_input_mutated(C, rec):
    def f(x):
        x[1:3].add_(10)
        x.view(2, 2)[0].mul_(2)
        return x.sum()
    g = C(f)
    for _ in range(2):
        x = X()
        rec(g(x))
        rec(x)


@case("mutation")
def case_input_is_a_view(C, rec):
    def f(v):
        v.add_(1)
        return v * 2
    g = C(f)
    for _ in range(2):
        base = torch.arange(8.0)
        rec(g(base[2:6]))
        rec(base)


@case("mutation")
def case_return_input_mutated_in_place(C, rec):
    g = C(lambda x: x.add_(1))
    x = X()
    out = g(x)
    rec(out is x)
    out.mul_(3)
    rec(x)


@case("mutation")
def case_return_view_of_input(C, rec):
    g = C(lambda x: x.view(2, 2))
    x = X()
    out = g(x)
    rec(out._base is x)
    rec(out.data_ptr() == x.data_ptr())
    out.add_(5)
    rec(x)


@case("mutation")
def case_return_two_aliasing_outputs(C, rec):
    def f(x):
        y = x * 2
        return y, y.view(2, 2), y[1:]
    g = C(f)
    y, v, s = g(X())
    rec(v.data_ptr() == y.data_ptr())
    v.add_(1)
    rec(y)
    rec(s)


@case("mutation")
def case_return_input_unchanged(C, rec):
    g = C(lambda x, y: (x, y + 1))
    x = X()
    a, b = g(x, x)
    rec(a is x)
    rec(b)


@case("mutation")
def case_overlapping_inplace_raises(C, rec):
    def f(x):
        x[1:].add_(x[:-1])
        return x
    g = C(f)
    rec(g(X()))


@case("mutation")
def case_overlapping_copy_raises(C, rec):
    def f(x):
        x.view(2, 2).t().copy_(x.view(2, 2))  # not overlapping: a transpose into itself elsewhere
        return x
    g = C(lambda x: x[:3].copy_(x[1:]))
    rec(g(X()))


@case("mutation")
def case_saved_then_modified_in_place(C, rec):
    g = C(lambda x: x.exp())
    a = X().requires_grad_()
    y = g(a)
    y.add_(1)
    y.sum().backward()
    rec(a.grad)


@case("mutation")
def case_saved_input_modified_after(C, rec):
    g = C(lambda x, w: (x * w).sum())
    w = X().requires_grad_()
    x = X() + 1
    out = g(x, w)
    x.add_(1)
    out.backward()
    rec(w.grad)


@case("mutation")
def case_version_counter_bumped(C, rec):
    def f(x):
        x.add_(1)
        return x.sum()
    g = C(f)
    x = X()
    v0 = x._version
    rec(g(x))
    rec(x._version > v0)


def _bn_calls(C, rec, m):
    g = C(m)
    x = torch.randn(4, 3)
    for mode in ("train", "train", "eval", "train"):
        getattr(m, mode)()
        out = g(x)
        rec(out)
        rec(out.requires_grad)
        rec(m.running_mean)
        rec(m.running_var)
        rec(m.num_batches_tracked)


@case("mutation")
def case_batchnorm_train_eval(C, rec):
    torch.manual_seed(0)
    _bn_calls(C, rec, nn.BatchNorm1d(3))


@case("mutation")
def case_batchnorm_momentum_none(C, rec):
    torch.manual_seed(0)
    _bn_calls(C, rec, nn.BatchNorm1d(3, momentum=None))


@case("mutation")
def case_batchnorm_no_grad(C, rec):
    torch.manual_seed(0)
    m = nn.BatchNorm1d(3)
    g = C(m)
    with torch.no_grad():
        for _ in range(2):
            rec(g(torch.randn(4, 3)))
            rec(m.running_mean)
            rec(m.num_batches_tracked)


@case("mutation")
def case_batchnorm_frozen_params_train_eval(C, rec):
    torch.manual_seed(0)
    m = nn.BatchNorm1d(3)
    m.requires_grad_(False)  # the state updates alone (BatchNorm's gradient is another family)
    _bn_calls(C, rec, m)


@case("mutation")
def case_batchnorm_in_model_train_eval(C, rec):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.ReLU())
    m.requires_grad_(False)
    g = C(m)
    x = torch.randn(4, 3)
    for mode in ("train", "eval", "train", "train"):
        getattr(m, mode)()
        rec(g(x))
        rec(m[1].running_mean)
        rec(m[1].num_batches_tracked)


@case("mutation")
def case_setitem_on_input(C, rec):
    def f(x, v):
        x[0] = v.sum()
        x[2:] = 7.0
        return x * 2
    g = C(f)
    for _ in range(2):
        x = X()
        rec(g(x, torch.ones(2)))
        rec(x)


@case("mutation")
def case_metadata_mutation(C, rec):
    def f(x):
        x.t_()
        return x + 1
    g = C(f)
    x = torch.arange(6.0).view(2, 3)
    rec(g(x))
    rec(x.shape)
    rec(x)


@case("mutation")
def case_leaf_requiring_grad_mutated_raises(C, rec):
    def f(x):
        x.add_(1)
        return x * 2
    g = C(f)
    rec(g(X().requires_grad_()))


@case("mutation")
def case_mutate_then_return_view(C, rec):
    def f(x):
        x.mul_(2)
        return x[1:3], x.sum()
    g = C(f)
    x = X()
    v, s = g(x)
    rec(v)
    rec(s)
    v.fill_(-1)
    rec(x)


@case("mutation")
def case_mutation_across_graph_break(C, rec):
    def f(x, log):
        x.add_(1)
        log.append(float(x.sum()))  # a graph break: tensor to Python float
        x.mul_(2)
        return x - 1
    g = C(f)
    log = []
    for _ in range(2):
        x = X()
        rec(g(x, log))
        rec(x)
    rec(log)


@case("mutation")
def case_mutated_buffer_grad_through_params(C, rec):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))
            self.register_buffer("ema", torch.zeros(4))

        def forward(self, x):
            y = x * self.w
            self.ema.mul_(0.5).add_(y.detach() * 0.5)
            return y.sum()
    m = M()
    g = C(m)
    for _ in range(3):
        out = g(X())
        out.backward()
        rec(out)
        rec(m.ema)
        rec(m.w.grad)


@case("mutation")
def case_mutation_through_view_made_inside(C, rec):
    def f(x):
        y = x.view(2, 2)
        y[0].add_(1)
        v = x[2:]
        x.mul_(2)
        return v
    g = C(f)
    x = X()
    v = g(x)
    rec(v)
    rec(x)
    v.zero_()
    rec(x)


@case("mutation")
def case_out_kwarg_into_input(C, rec):
    def f(x, y):
        torch.add(y, 1, out=x)
        return x * 2
    g = C(f)
    x = X()
    rec(g(x, X()))
    rec(x)


_GLOBAL_BUF = torch.zeros(4)


@case("mutation")
def case_global_tensor_mutated(C, rec):
    _GLOBAL_BUF.zero_()

    def f(x):
        _GLOBAL_BUF.add_(x)
        return _GLOBAL_BUF * 1
    g = C(f)
    for _ in range(2):
        rec(g(X()))
        rec(_GLOBAL_BUF)


@case("mutation")
def case_object_tensor_attribute_mutated(C, rec):
    class State:
        def __init__(self):
            self.acc = torch.zeros(4)
    st = State()

    def f(s, x):
        s.acc.add_(x)
        return s.acc.sum()
    g = C(f)
    for _ in range(2):
        rec(g(st, X()))
        rec(st.acc)


@case("mutation")
def case_return_same_tensor_twice(C, rec):
    g = C(lambda x: (lambda y: (y, y))(x * 2))
    a, b = g(X())
    rec(a is b)
    a.add_(1)
    rec(b)


@case("mutation")
def case_return_detached_input(C, rec):
    g = C(lambda x: (x.detach(), x * 2))
    x = X().requires_grad_()
    d, y = g(x)
    rec(d.requires_grad)
    rec(d.data_ptr() == x.data_ptr())
    rec(y.requires_grad)


@case("mutation")
def case_overlapping_output_views_of_intermediate(C, rec):
    def f(x):
        y = x * 2
        return y[0:3], y[1:4]
    g = C(f)
    a, b = g(X())
    a.add_(100)
    rec(b)


@case("mutation")
def case_non_leaf_inplace_then_backward(C, rec):
    def f(x):
        x.sin_()
        return (x * x).sum()
    g = C(f)
    a = X().requires_grad_()
    x = a * 1
    out = g(x)
    out.backward()
    rec(out)
    rec(a.grad)
    rec(x)


@case("mutation")
def case_mutation_under_no_grad_of_non_leaf(C, rec):
    def f(x):
        with torch.no_grad():
            x.mul_(2)
        return x.sum()
    g = C(f)
    a = X().requires_grad_()
    x = a + 0
    out = g(x)
    out.backward()
    rec(out)
    rec(a.grad)


@case("mutation")
def case_zero_fill_clamp_inputs(C, rec):
    def f(a, b, c):
        a.zero_()
        b.fill_(3)
        c.clamp_(1, 2)
        return a + b + c
    g = C(f)
    a, b, c = X(), X(), X()
    rec(g(a, b, c))
    rec(a)
    rec(b)
    rec(c)


@case("mutation")
def case_mutated_non_leaf_view_output_backward(C, rec):
    def f(x, w):
        x.mul_(w)
        return x[1:3], (x * w).sum()
    g = C(f)
    a = X().requires_grad_()
    w = torch.full((4,), 2.0, requires_grad=True)
    x = a * 1
    v, s = g(x, w)
    (v.sum() * 3 + s).backward()
    rec(v)
    rec(s)
    rec(a.grad)
    rec(w.grad)


@case("mutation")
def case_parameter_mutated_under_outer_no_grad(C, rec):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            self.w.mul_(2)
            return x * self.w
    m = M()
    g = C(m)
    with torch.no_grad():
        for _ in range(2):
            rec(g(X()))
            rec(m.w)
    rec(m.w.requires_grad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES["mutation"]))
def test_mutation(name, backend):
    check("mutation", name, backend)
