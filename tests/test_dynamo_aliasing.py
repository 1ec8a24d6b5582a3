"""An in-place mutation is seen through every name of the mutated tensor (compared with eager).

In eager, ``alias = z; z += y`` changes the one tensor both names refer to. A compiled frame must
keep every mutating op in the graph (even when its own result is unused) and run it where eager
does, so that each alias (another local, a list or dict entry, an object's attribute, a view) and
each mutated input holds eager's value afterwards.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import tinydynamo

BACKENDS = ("eager", "aot_eager", "tininductor")


def _iadd(z, y):
    z += y


def _isub(z, y):
    z -= y


def _imul(z, y):
    z *= y


def _idiv(z, y):
    z /= y


def _add_(z, y):
    z.add_(y)


def _mul_(z, y):
    z.mul_(y)


def _copy_(z, y):
    z.copy_(y)


def _setitem(z, y):
    z[0] = y[0]


def _setitem_slice(z, y):
    z[1:] = y[1:]


def _out(z, y):
    torch.add(z, y, out=z)


def _relu_inplace(z, y):
    torch.nn.functional.relu(z, inplace=True)


def _torch_fn_(z, y):
    torch.sin_(z)


MUTATIONS = {"iadd": _iadd, "isub": _isub, "imul": _imul, "idiv": _idiv, "add_": _add_, "mul_": _mul_,
             "copy_": _copy_, "setitem": _setitem, "setitem_slice": _setitem_slice, "out": _out,
             "relu_inplace": _relu_inplace, "sin_": _torch_fn_}


class Box:
    pass


def _alias_local(z):
    alias = z
    return lambda: alias


def _alias_list(z):
    xs = [z]
    return lambda: xs[0]


def _alias_dict(z):
    d = {"k": z}
    return lambda: d["k"]


def _alias_attr(z):
    b = Box()
    b.t = z
    return lambda: b.t


def _alias_view_index(z):
    v = z[0]
    return lambda: v


def _alias_view(z):
    v = z.view(2, 2)
    return lambda: v


def _alias_slice(z):
    v = z[1:]
    return lambda: v


ALIASES = {"local": _alias_local, "list": _alias_list, "dict": _alias_dict, "attr": _alias_attr,
           "view_index": _alias_view_index, "view": _alias_view, "slice": _alias_slice}


#: the front end's share runs in every CI pass; the back ends' full matrix with --runslow (the
#: fast slice keeps them for a plain name and for views, the aliases functionalization handles)
FAST_ALIASES = ("local", "view", "view_index")
MATRIX = [pytest.param(m, a, b, id=f"{m}-{a}-{b}",
                       marks=() if b == "eager" or a in FAST_ALIASES else pytest.mark.slow)
          for m in MUTATIONS for a in ALIASES for b in BACKENDS]


def _compile(fn, backend):
    tinydynamo.reset()
    return tinydynamo.optimize(backend)(fn)


def _run(fn, backend, make_args):
    args = make_args()
    if backend is None:
        out = fn(*args)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = _compile(fn, backend)(*args)
    return out, args


def _check(fn, backend, make_args):
    expected, eager_args = _run(fn, None, make_args)
    actual, args = _run(fn, backend, make_args)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e)
    for e, a in zip(eager_args, args):  # the inputs after the call
        torch.testing.assert_close(a, e)


def _args():
    return torch.arange(1.0, 5.0), torch.tensor([0.5, -2.0, 3.0, 4.0])


@pytest.mark.parametrize("mutation,alias,backend", MATRIX)
def test_mutation_of_intermediate_seen_through_alias(mutation, alias, backend):
    """The alias is read after the mutation, and returned itself (it and ``z`` are one tensor, or
    a view of it)."""
    mutate, make_alias = MUTATIONS[mutation], ALIASES[alias]

    def f(x, y):
        z = x * 1
        read = make_alias(z)
        mutate(z, y)
        return read(), read() * 2

    _check(f, backend, _args)


@pytest.mark.parametrize("mutation,alias,backend", MATRIX)
def test_mutation_of_input_seen_through_alias(mutation, alias, backend):
    """The mutated tensor is an input: the alias sees it, and so does the caller afterwards."""
    mutate, make_alias = MUTATIONS[mutation], ALIASES[alias]

    def f(x, y):
        read = make_alias(x)
        mutate(x, y)
        return read() + 0, y * 1

    _check(f, backend, _args)


@pytest.mark.parametrize("mutation,alias,backend", MATRIX)
def test_mutation_through_alias_seen_by_original(mutation, alias, backend):
    """The other direction: mutating the alias (a view: its base) changes ``z``."""
    mutate, make_alias = MUTATIONS[mutation], ALIASES[alias]

    def f(x, y):
        z = x * 1
        w = make_alias(z)()
        mutate(w, y.reshape(-1)[: w.numel()].reshape(w.shape))
        return z, w + 0

    try:
        _run(f, None, _args)
    except (IndexError, RuntimeError):
        pytest.skip("eager rejects this mutation of this alias (a 0-d view has no [0])")
    _check(f, backend, _args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_augmented_assignment_result_unused(backend):
    """``z += y`` whose only reader is another name bound before it."""

    def f(x, y):
        z = x * 1
        alias = z
        z += y
        return (alias,)

    _check(f, backend, _args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_augmented_assignment_of_captured_number(backend):
    """``z += n`` with ``n`` a captured ``.item()`` number (its own graph-node path) is kept too."""

    def f(x, y):
        z = x * 1
        alias = z
        z += y.sum().item()
        return (alias,)

    with tinydynamo.config.patch(capture_scalar_outputs=True):
        _check(f, backend, _args)
