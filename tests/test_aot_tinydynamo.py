"""Training through tinydynamo: tinydynamo.compile(model, backend="aot_eager") matches eager."""
from __future__ import annotations

import copy

import pytest
import torch

import tinydynamo
from course.models import GPT, TinyBlock
from tinydynamo import artifacts


def _train(model, batches, backend=None, lr=0.1):
    run = tinydynamo.compile(model, backend=backend) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for batch in batches:
        opt.zero_grad()
        out = run(*batch)
        loss = out[1] if isinstance(out, tuple) else out.square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("which", ["TinyBlock", "GPT"])
def test_training_through_tinydynamo_matches_eager(which):
    torch.manual_seed(0)
    if which == "TinyBlock":
        model = TinyBlock(16, 4).double()
        batches = [(torch.randn(4, 8, 16, dtype=torch.float64),) for _ in range(3)]
        tol = {}
    else:
        model = GPT(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)
        batches = [(torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))) for _ in range(3)]
        tol = {"rtol": 1e-4, "atol": 1e-5}
    kept = list(artifacts.history)  # history is a bounded deque: tell new records by identity, not position
    before = {id(a) for a in kept}
    want_losses, want_params = _train(copy.deepcopy(model), batches)
    got_losses, got_params = _train(copy.deepcopy(model), batches, backend="aot_eager")
    compiled = [a for a in artifacts.history if id(a) not in before and a.get("joint_graph")]
    assert compiled, "tinydynamo did not compile a training graph through aot_eager"
    torch.testing.assert_close(got_losses, want_losses, **tol)
    torch.testing.assert_close(got_params, want_params, **tol)
