"""Training through AOT autograd: forward and backward graphs both compiled by tininductor."""
import pytest
import torch

import tininductor
from tininductor.testing import DEVICE, patch_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def train_step(model, x, *extra):
    out = model(x, *extra)
    loss = out[0] if isinstance(out, tuple) else out.pow(2).mean()
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def compare_training(make_model, *inputs, atol=1e-5, rtol=1e-4):
    torch.manual_seed(0)
    eager, ours = make_model().to(DEVICE), make_model().to(DEVICE)
    ours.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    kernels = []

    def backend(gm, example_inputs):
        fn = tininductor.compile_fx(gm, example_inputs)
        return fn

    with patch_config(tininductor.config, fallback_to_eager=False, cpu_backend="triton"):
        compiled = torch.compile(ours, backend=backend, dynamic=False)
        loss, grads = train_step(compiled, *inputs)
    ref_loss, ref_grads = train_step(eager, *inputs)
    torch.testing.assert_close(loss, ref_loss, atol=atol, rtol=rtol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=atol, rtol=rtol)
    return kernels


def test_block_trains_like_eager():
    from test_inductor_extern import Block

    compare_training(Block, torch.randn(2, 3, 16, device=DEVICE))


def test_gpt_trains_like_eager():
    from test_inductor_models import GPT

    idx = torch.randint(0, 50, (2, 12), device=DEVICE)
    compare_training(GPT, idx, idx.roll(1, 1), atol=1e-4, rtol=1e-3)
