"""Reliability: RNG state inside and around compiled code.

Compiled random ops need not draw eager's bits (torch.compile's inductor does not either), so
these cases record *facts* a user relies on: a draw repeated after restoring the state gives
the same values, manual_seed before a call reproduces a call, the global generator advances.
"""
from __future__ import annotations

import pytest
import torch

from tests.reliability import BACKENDS, CASES, case, check


def _save_draw_restore_draw(x):
    state = torch.get_rng_state()
    a = torch.rand(4) + x
    torch.set_rng_state(state)
    b = torch.rand(4) + x
    return a, b


@case("rng")
def case_save_draw_restore_draw(C, rec):
    g = C(_save_draw_restore_draw)
    for _ in range(2):
        a, b = g(torch.zeros(4))
        rec(torch.equal(a, b))


def _seed_inside(x):
    torch.manual_seed(123)
    return torch.rand(4) + x


@case("rng")
def case_manual_seed_inside(C, rec):
    g = C(_seed_inside)
    a = g(torch.zeros(4))
    torch.rand(3)  # move the global generator
    b = g(torch.zeros(4))
    rec(torch.equal(a, b))
    torch.manual_seed(123)
    rec(torch.equal(a, torch.rand(4)))  # the same stream as eager's manual_seed(123)


def _draw(x):
    return torch.rand(4) * x + torch.randn(4)


@case("rng")
def case_manual_seed_before_call(C, rec):
    g = C(_draw)
    torch.manual_seed(7)
    a = g(torch.ones(4))
    torch.manual_seed(7)
    b = g(torch.ones(4))
    rec(torch.equal(a, b))
    c = g(torch.ones(4))
    rec(torch.equal(a, c))  # the generator advanced: a new draw


@case("rng")
def case_call_advances_global_generator(C, rec):
    g = C(_draw)
    g(torch.ones(4))
    torch.manual_seed(5)
    g(torch.ones(4))
    after = torch.rand(2)
    torch.manual_seed(5)
    rec(torch.equal(after, torch.rand(2)))  # False in eager: the call consumed numbers


@case("rng")
def case_dropout_train_reproducible(C, rec):
    m = torch.nn.Dropout(0.5)
    g = C(m)
    torch.manual_seed(3)
    a = g(torch.ones(16))
    torch.manual_seed(3)
    b = g(torch.ones(16))
    rec(torch.equal(a, b))
    rec(bool(((a == 0) | (a == 2)).all()))
    m.eval()
    rec(g(torch.ones(16)))


@case("rng")
def case_dropout_backward_uses_forward_mask(C, rec):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    m = torch.nn.Sequential(lin, torch.nn.Dropout(0.5), torch.nn.Tanh())
    g = C(m)
    x = torch.randn(4, 8, requires_grad=True)
    for _ in range(2):
        torch.manual_seed(11)
        out = g(x)
        out.sum().backward()
        # the gradient is zero exactly where the forward dropped: one mask for both passes
        kept = out.detach() != 0
        rec(bool(((lin.weight.grad is not None)) and kept.any()))
        rec(torch.equal(x.grad != 0, (x.grad != 0)))
        grad_out = (1 - out.detach() ** 2) * 2 * kept  # d tanh * dropout scale
        rec(torch.allclose(x.grad, grad_out @ lin.weight, atol=1e-5))
        x.grad = None
        lin.weight.grad = None


@case("rng")
def case_explicit_generator(C, rec):
    def f(x, gen):
        return x + torch.rand(4, generator=gen)
    g = C(f)
    a = g(torch.zeros(4), torch.Generator().manual_seed(3))
    b = g(torch.zeros(4), torch.Generator().manual_seed(3))
    c = g(torch.zeros(4), torch.Generator().manual_seed(4))
    rec(torch.equal(a, b))
    rec(torch.equal(a, c))


@case("rng")
def case_random_ops_follow_global_generator(C, rec):
    def f(x):
        return x + torch.randn(4), torch.randint(0, 100, (4,)), torch.rand_like(x), torch.bernoulli(x * 0 + 0.5)
    g = C(f)
    torch.manual_seed(21)
    first = g(torch.zeros(4))
    torch.manual_seed(21)
    second = g(torch.zeros(4))
    rec([torch.equal(p, q) for p, q in zip(first, second)])
    rec(bool(((first[3] == 0) | (first[3] == 1)).all()))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES["rng"]))
def test_rng(name, backend):
    check("rng", name, backend)
