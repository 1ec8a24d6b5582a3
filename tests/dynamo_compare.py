"""Compare tinydynamo with eager AND with torch.compile on the same code (the coverage tests of traced Python).

``compare(fn, args)`` runs ``fn`` eagerly, under tinydynamo with a CompileCounter, and under
``torch.compile`` with torch's CompileCounter (backend "eager"), each twice (the second call must
hit the cache), and returns ``(tiny_graphs, torch_graphs)``. Outputs (and gradients, with
``grad=True``) must equal eager's.
"""
from __future__ import annotations

import warnings

import torch
import torch._dynamo
import torch._dynamo.testing

import tinydynamo
from tinydynamo.testing import CompileCounter


def _grads(out, args):
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    for a in leaves:
        a.grad = None
    loss = out.sum() if isinstance(out, torch.Tensor) else sum(o.sum() for o in out)
    loss.backward()
    return [a.grad.clone() for a in leaves]


def _fresh(a):
    if isinstance(a, torch.Tensor):
        return a.detach().clone().requires_grad_(a.requires_grad)
    return a


#: the torch.compile graph counts recorded in the tests' tables were measured with this release
REFERENCE_TORCH = "2.13"


class Counts(tuple):
    """``(tiny graphs, torch.compile graphs)``. Equal to a recorded ``(tiny, torch)`` pair when tiny's
    count matches exactly and torch's does too, where torch's can be compared: on the release the
    table was recorded with (torch.compile's own choices move between releases: 2.11 makes one graph
    of a class-attribute counter where 2.13 makes two), and where torch.compile was right (None
    when its result differed from eager: torch's bug, reported with a warning, not ours)."""

    def __eq__(self, other):
        tiny, torch_graphs = self
        if tiny != other[0]:
            return False
        if torch_graphs is None or not torch.__version__.startswith(REFERENCE_TORCH):
            return True
        return torch_graphs == other[1]

    __hash__ = tuple.__hash__


def compare(fn, *args, grad: bool = False, calls: int = 2, make_args=None, **tol):
    """(tinydynamo graphs, torch.compile graphs) for ``fn(*args)``, after checking both equal eager."""
    make_args = make_args or (lambda: tuple(_fresh(a) for a in args))
    eager_args = make_args()
    expected = fn(*eager_args)
    expected_grads = _grads(expected, eager_args) if grad else None
    results = []
    for name in ("tiny", "torch"):
        if name == "tiny":
            tinydynamo.reset()
            cnt = CompileCounter()
            compiled = tinydynamo.optimize(cnt)(fn)
        else:
            torch._dynamo.reset()
            cnt = torch._dynamo.testing.CompileCounter()
            compiled = torch.compile(fn, backend=cnt)
        try:
            for _ in range(calls):
                call_args = make_args()
                out = compiled(*call_args)
                torch.testing.assert_close(out, expected, **tol, msg=lambda m: f"{name}: {m}")
                if grad:
                    torch.testing.assert_close(_grads(out, call_args), expected_grads, **tol)
        except AssertionError as e:
            if name == "tiny":
                raise
            warnings.warn(f"torch.compile {torch.__version__} differs from eager here: {e}")
            results.append(None)
            continue
        results.append(cnt.frame_count)
    return Counts(results)
