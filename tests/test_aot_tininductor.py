"""The AOT layer under tininductor: torch.compile(model, backend=tininductor.compile_fx) trains like eager."""
from __future__ import annotations

import copy
import warnings

import torch

import tininductor
import tininductor.testing  # noqa: F401  (TRITON_INTERPRET=1 on CPU before any triton.jit)
from course.models import TinyBlock


def test_tiny_block_trains_through_tininductor():
    torch.manual_seed(0)
    model = TinyBlock(16, 2).double()
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(twin, backend=tininductor.compile_fx)
    for step in range(2):
        x = torch.randn(2, 4, 16, dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback to eager would warn: fail instead
            out = compiled(x)
            out.square().mean().backward()
        ref = model(x)
        ref.square().mean().backward()
        torch.testing.assert_close(out, ref)
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=f"grad of {name} at step {step}")
            p.grad = q.grad = None
    torch._dynamo.reset()
