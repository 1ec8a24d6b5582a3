"""Training through AOT autograd: forward and backward graphs both compiled by tininductor.

The course models (course/models.py) train for a few SGD steps under
``torch.compile(backend=tininductor.compile_fx)`` with losses and gradients equal to eager.
"""
import pytest
import torch

import tininductor
from course.models import GPT, TinyBlock
from tininductor.testing import DEVICE, patch_config
from tinydynamo.exc import EagerFallbackWarning

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def loss_of(out):
    if isinstance(out, tuple):  # GPT: (logits, loss)
        return out[1]
    return out.pow(2).mean()


def train(model, inputs, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(model(*inputs))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), [p.grad.detach().clone() for p in model.parameters()]


def compare_training(make_model, inputs, atol=1e-5, rtol=1e-4):
    torch.manual_seed(0)
    eager, ours = make_model().to(DEVICE), make_model().to(DEVICE)
    ours.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    with patch_config(tininductor.config, fallback_to_eager=False, cpu_backend="triton"):
        compiled = torch.compile(ours, backend=tininductor.compile_fx, dynamic=False)
        losses, grads = train(compiled, inputs)
    ref_losses, ref_grads = train(eager, inputs)
    torch.testing.assert_close(losses, ref_losses, atol=atol, rtol=rtol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=atol, rtol=rtol)


def test_tiny_block_trains_like_eager():
    compare_training(lambda: TinyBlock(hidden=16), [torch.randn(2, 3, 16, device=DEVICE)])


def test_gpt_trains_like_eager():
    idx = torch.randint(0, 64, (2, 8), device=DEVICE)
    compare_training(lambda: GPT(n_layer=1, n_embd=16), [idx, idx.roll(1, 1)], atol=1e-4, rtol=1e-3)


def test_tiny_block_forward_kernel_count():
    """The seeds' LayerNorm-MLP block forward: 2 matmuls + at most 3 generated kernels."""
    from tininductor.testing import check

    block = TinyBlock(hidden=16).to(DEVICE)
    with torch.no_grad():
        c = check(block, torch.randn(2, 3, 16, device=DEVICE), atol=1e-5, rtol=1e-4)
    assert c.source.count("torch.addmm(") + c.source.count("torch.mm(") == 2
    assert len(c.kernels) <= 3, c.kernels


def test_linear_weight_gradient_comes_out_in_the_weights_layout():
    """``x @ W.t()``: W's gradient is made contiguous by the backward's mm itself; a transposed
    one would make autograd copy it into W's layout every step."""
    import tinydynamo

    lin = torch.nn.Linear(8, 16).to(DEVICE)
    seen = []
    lin.weight.register_hook(lambda g: seen.append(g.stride()))
    compiled = tinydynamo.compile(lin, backend="tininductor")
    compiled(torch.randn(4, 8, device=DEVICE)).sum().backward()
    assert seen == [lin.weight.stride()]


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_saved_activation_keeps_its_traced_strides(backend):
    """``x.t().sin()`` keeps x's transposed layout in the trace; the backward graph (compiled
    from that trace) reads the saved activation by those strides, so the forward must write it
    with them, not contiguous as its buffers are by default (was silently wrong: w's gradient
    read a transposed matrix, as bf16 llama's saved flash-attention output was)."""
    import tinydynamo

    def f(x, w):
        return x.t().sin() @ w

    x = torch.randn(6, 4, device=DEVICE)
    w = torch.randn(6, 5, device=DEVICE, requires_grad=True)
    expected = f(x, w)
    expected.pow(2).sum().backward()
    w_grad, w.grad = w.grad, None
    # the default partitioner saves sin's output (min_cut would recompute it in the backward)
    with patch_config(tininductor.config, fallback_to_eager=False, cpu_backend=backend, partitioner="default"):
        actual = tinydynamo.compile(f, backend="tininductor")(x, w)
        actual.pow(2).sum().backward()
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(w.grad, w_grad)


def test_graph_output_has_eagers_strides():
    """A compiled function's output has the strides eager gives it (TorchInductor's
    keep_output_stride): here the transposed layout a pointwise op inherits from its input."""
    from tininductor.testing import compile_graph

    def f(x):
        y = x.t().cos() + 1
        return y, y[:, None, :].expand(3, 4, 5)  # an expanded one: computed once, viewed with stride 0

    x = torch.randn(5, 3, device=DEVICE)
    for out, expected in zip(compile_graph(f, [x])(x), f(x)):
        torch.testing.assert_close(out, expected)
        assert out.stride() == expected.stride()


def _mlp_step(compiled, x):
    loss = compiled(x).pow(2).mean()
    loss.backward()
    return loss.detach()


def test_backward_waits_for_its_kernels_at_its_first_call(monkeypatch):
    """The backward's kernels compile while the forward runs; the backward's first call waits for
    them. One that failed to compile makes the backward run in torch, with a warning, and the
    gradients stay eager's."""
    from tininductor import compile_fx as compile_fx_module

    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).to(DEVICE)
    ours = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).to(DEVICE)
    ours.load_state_dict(eager.state_dict())
    x = torch.randn(4, 16, device=DEVICE)
    torch._dynamo.reset()
    waits = []

    def failing_wait(module):
        waits.append(module)
        raise RuntimeError("a backward kernel did not compile")

    with patch_config(tininductor.config, cpu_backend="triton"):
        compiled = torch.compile(ours, backend=tininductor.compile_fx, dynamic=False)
        out = compiled(x)  # compiles the forward and the backward; runs the forward
        backward = [g for g in compile_fx_module.compiled_graphs if g.kind == "backward"][-1]
        assert backward.waits_at_first_call
        monkeypatch.setattr(compile_fx_module, "_wait_for_module", failing_wait)
        with pytest.warns(EagerFallbackWarning, match="did not compile.*running it eagerly"):
            out.pow(2).mean().backward()
        assert len(waits) == 1
        for p in ours.parameters():
            p.grad = None
        _mlp_step(compiled, x)  # the backward's choice is kept: no second wait
        assert len(waits) == 1
    _mlp_step(eager, x)
    for p, r in zip(ours.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, r.grad, atol=1e-5, rtol=1e-4)
