"""Reliability: autograd conventions (return types, gradients through in-place and views)."""
from __future__ import annotations

import pytest
import torch

from tests.reliability import BACKENDS, CASES, case, check

X = torch.tensor([[3.0, 1.0, 2.0], [0.5, 4.0, -1.0]])


def _kind(r):
    return type(r).__module__ + "." + type(r).__qualname__


@case("autograd")
def case_max_dim_return_type(C, rec):
    r = C(lambda x: x.max(dim=1))(X)
    rec(_kind(r))
    rec(r.values)
    rec(r.indices)


@case("autograd")
def case_sort_topk_return_types(C, rec):
    g = C(lambda x: (torch.sort(x, dim=1), x.topk(2), torch.min(x, 0), x.kthvalue(2, 1)))
    for r in g(X):
        rec(_kind(r))
        rec(list(r))


@case("autograd")
def case_return_type_grad(C, rec):
    x = X.clone().requires_grad_()
    r = C(lambda x: torch.max(x * 2, 1))(x)
    rec(_kind(r))
    r.values.sum().backward()
    rec(x.grad)


@case("autograd")
def case_output_requires_grad(C, rec):
    w = torch.ones(3, requires_grad=True)
    g = C(lambda x, w: x * w)
    out = g(X, w)
    rec(out.requires_grad)
    with torch.no_grad():
        out2 = g(X, w)
    rec(out2.requires_grad)


@case("autograd")
def case_backward_twice_raises(C, rec):
    x = torch.arange(3.0, requires_grad=True)
    out = C(lambda x: (x.sin() * x).sum())(x)
    out.backward()
    rec(x.grad)
    out.backward()  # eager: "Trying to backward through the graph a second time"
    rec(x.grad)


@case("autograd")
def case_retain_graph(C, rec):
    x = torch.arange(3.0, requires_grad=True)
    out = C(lambda x: (x.exp() * x).sum())(x)
    out.backward(retain_graph=True)
    out.backward()
    rec(x.grad)


@case("autograd")
def case_grad_fn_presence(C, rec):
    w = torch.ones(3, requires_grad=True)
    g = C(lambda x, w: (x * w, x * 2, (x * w).detach()))
    a, b, c = g(X[0], w)
    rec([t.requires_grad for t in (a, b, c)])
    rec([t.grad_fn is None for t in (a, b, c)])


@case("autograd")
def case_wrong_arguments_raise(C, rec):
    g = C(lambda x, y: x + y)
    rec(g(X, X))
    g(X)  # eager: TypeError (missing argument)


@case("autograd")
def case_autograd_grad_of_output(C, rec):
    x = torch.arange(3.0, requires_grad=True)
    y = C(lambda x: x.pow(3).sum())(x)
    (gx,) = torch.autograd.grad(y, x)
    rec(gx)
    rec(gx.requires_grad)


# ---- version counters: a tensor eager's autograd saved, changed in place before backward ----
# eager's backward raises "one of the variables needed for gradient computation has been modified
# by an inplace operation"; a compiled backward must raise too, never use the new value silently


@case("autograd")
def case_saved_input_changed_after_forward(C, rec):
    w = torch.ones(3, requires_grad=True)
    x = torch.arange(3.0)
    out = C(lambda w, x: (w * x).sum())(w, x)
    x.add_(1)
    out.backward()
    rec(w.grad)


@case("autograd")
def case_saved_output_changed_after_forward(C, rec):
    x = torch.arange(3.0, requires_grad=True)
    y = C(lambda x: x.exp())(x)
    y.mul_(2)
    y.sum().backward()
    rec(x.grad)


@case("autograd")
def case_saved_parameter_changed_after_forward(C, rec):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    out = C(lin)(x)
    with torch.no_grad():
        lin.weight.add_(1)
    out.sum().backward()
    rec(x.grad)


@case("autograd")
def case_input_mutated_in_graph_then_changed(C, rec):
    def f(w, x):
        x.mul_(2)
        return (w * x).sum()
    w = torch.ones(3, requires_grad=True)
    x = torch.arange(3.0)
    out = C(f)(w, x)
    x.add_(1)
    out.backward()
    rec(w.grad)


@case("autograd")
def case_saved_view_output_changed(C, rec):
    x = torch.arange(6.0, requires_grad=True)
    y = C(lambda x: (x * 2).view(2, 3).sigmoid())(x)
    y[0].zero_()
    y.sum().backward()
    rec(x.grad)


@case("autograd")
def case_saved_intermediate_across_graph_break(C, rec):
    def f(x):
        y = x.sin()
        torch._dynamo.graph_break() if hasattr(torch, "_dynamo") else None
        return y, y.exp()
    x = torch.arange(3.0, requires_grad=True)
    y, z = C(f)(x)
    z.mul_(3)
    z.sum().backward()
    rec(x.grad)


@case("autograd")
def case_saved_input_changed_twice_same_version_count(C, rec):
    w = torch.ones(3, requires_grad=True)
    x = torch.arange(3.0)
    g = C(lambda w, x: (w * x).sum())
    out = g(w, x)
    out2 = g(w, x.clone())
    x.add_(1)
    out2.backward()
    rec(w.grad)
    out.backward()
    rec(w.grad)


@case("autograd")
def case_input_saved_then_mutated_in_graph(C, rec):
    def f(w, x):
        out = (w * x).sum()  # saves x as it is...
        x.mul_(2)  # ...then changes it: eager's backward raises
        return out
    w = torch.ones(3, requires_grad=True)
    x = torch.arange(3.0)
    out = C(f)(w, x)
    rec(x)
    out.backward()
    rec(w.grad)


@case("autograd")
def case_input_mutated_in_graph_then_saved_backward_ok(C, rec):
    def f(w, x):
        x.mul_(2)
        return (w * x).sum()
    w = torch.ones(3, requires_grad=True)
    x = torch.arange(3.0)
    out = C(f)(w, x)
    out.backward()  # nothing changed x since it was saved: no error
    rec(w.grad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES["autograd"]))
def test_autograd(name, backend):
    check("autograd", name, backend)
