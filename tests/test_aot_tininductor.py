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


def test_compile_fx_partitions_with_min_cut_by_default():
    """compile_fx saves fewer bytes with the min-cut (its default) than with the default
    partitioner; both train like eager; an unknown name is refused with the choices."""
    import pytest

    from tininductor import config
    from tininductor.testing import patch_config
    from tinydynamo import artifacts

    torch.manual_seed(0)
    model = TinyBlock(16, 4).double()
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    ref = model(x)
    ref.sum().backward()
    grads = [p.grad for p in model.parameters()]
    titles = {}
    for name in ("min_cut", "default"):
        twin = copy.deepcopy(model)
        twin.zero_grad()
        torch._dynamo.reset()
        with patch_config(config, partitioner=name), artifacts.collecting("test_partitioner") as arts:
            out = torch.compile(twin, backend=tininductor.compile_fx)(x)
        out.sum().backward()
        torch.testing.assert_close(out, ref)
        for p, g in zip(twin.parameters(), grads):
            torch.testing.assert_close(p.grad, g)
        (titles[name],) = [t for t, _ in arts.get("forward_graph")]
    saved_bytes = {k: int(t.split(" bytes")[0].rsplit(" ", 1)[1]) for k, t in titles.items()}
    assert "min_cut_partition" in titles["min_cut"] and "default_partition" in titles["default"]
    assert saved_bytes["min_cut"] < saved_bytes["default"]
    torch._dynamo.reset()
    with patch_config(config, partitioner="fastest"), pytest.raises(Exception, match="min_cut"):
        with patch_config(config, fallback_to_eager=False):
            torch.compile(copy.deepcopy(model), backend=tininductor.compile_fx)(x)
    torch._dynamo.reset()
