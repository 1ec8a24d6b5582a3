"""Compare tinydynamo with eager AND with torch.compile on the same code (issue 15's coverage tests).

``compare(fn, args)`` runs ``fn`` eagerly, under tinydynamo with a CompileCounter, and under
``torch.compile`` with torch's CompileCounter (backend "eager"), each twice (the second call must
hit the cache), and returns ``(tiny_graphs, torch_graphs)``. Outputs (and gradients, with
``grad=True``) must equal eager's.
"""
from __future__ import annotations

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
        for _ in range(calls):
            call_args = make_args()
            out = compiled(*call_args)
            torch.testing.assert_close(out, expected, **tol, msg=lambda m: f"{name}: {m}")
            if grad:
                torch.testing.assert_close(_grads(out, call_args), expected_grads, **tol)
        results.append(cnt.frame_count)
    return tuple(results)
