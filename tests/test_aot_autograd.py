"""AOT autograd end to end: models train through torch.compile(backend=aot_eager) like eager."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import tinydynamo
from course.models import GPT, TinyBlock
from tininductor.aot_autograd import aot_autograd, aot_eager, aot_eager_min_cut
from tininductor.joint_graph import create_joint
from tininductor.partitioners import default_partition, min_cut_partition
from tininductor.prims import is_prim
from tinydynamo import artifacts


def _train(model, step_inputs, steps=3, lr=0.1, backend=None):
    """Losses and final grads of a few SGD steps, eagerly or through torch.compile(backend)."""
    run = torch.compile(model, backend=backend) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for i in range(steps):
        opt.zero_grad()
        out = run(*step_inputs(i))
        loss = out[1] if isinstance(out, tuple) else (out * out).mean()  # GPT returns (logits, loss)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_min_cut], ids=["default", "min_cut"])
def test_tiny_block_trains_like_eager(backend):
    torch.manual_seed(0)
    model = TinyBlock(16, 4).double()
    xs = [torch.randn(4, 8, 16, dtype=torch.float64) for _ in range(3)]
    compiled_model = copy.deepcopy(model)
    want_losses, want_grads = _train(model, lambda i: (xs[i],))
    got_losses, got_grads = _train(compiled_model, lambda i: (xs[i],), backend=backend)
    torch.testing.assert_close(got_losses, want_losses)
    torch.testing.assert_close(got_grads, want_grads)


def test_gpt_trains_like_eager():
    torch.manual_seed(0)
    model = GPT(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)
    data = [(torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))) for _ in range(3)]
    compiled_model = copy.deepcopy(model)
    want_losses, want_grads = _train(model, lambda i: data[i])
    got_losses, got_grads = _train(compiled_model, lambda i: data[i], backend=aot_eager)
    torch.testing.assert_close(got_losses, want_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grads, want_grads, rtol=1e-4, atol=1e-5)


def test_gpt_min_cut_float64_grads_match():
    torch.manual_seed(1)
    model = GPT(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16).double()
    idx, tgt = torch.randint(0, 32, (2, 6)), torch.randint(0, 32, (2, 6))
    compiled = aot_eager_min_cut(model, [idx, tgt])  # any nn.Module: parameters are lifted
    logits, loss = compiled(idx, tgt)
    grads = torch.autograd.grad(loss + logits.square().mean(), list(model.parameters()))
    ref_logits, ref_loss = model(idx, tgt)
    want = torch.autograd.grad(ref_loss + ref_logits.square().mean(), list(model.parameters()))
    torch.testing.assert_close(grads, want)


def test_min_cut_saves_fewer_bytes_than_default_on_tiny_block():
    model = TinyBlock(16, 4)
    x = torch.randn(4, 8, 16, requires_grad=True)
    gm = torch.fx.symbolic_trace(model)
    default = aot_eager(gm, [x]).aot.partition
    min_cut = aot_eager_min_cut(gm, [x]).aot.partition
    assert 0 < min_cut.saved_bytes < default.saved_bytes
    # the gelu intermediates are recomputed, not saved: erf's output never crosses
    assert not any(name.startswith("erf") for name in min_cut.saved)


def test_graphs_are_prims_and_artifacts_recorded():
    model = TinyBlock(8, 2)
    x = torch.randn(2, 8, requires_grad=True)
    with artifacts.collecting("tiny_block") as arts:
        out = torch.compile(model, backend=aot_eager)(x)
    for kind in ("joint_graph", "forward_graph", "backward_graph"):
        assert arts.get(kind), f"no {kind} artefact recorded"
    assert "tangents_1" in str(arts.get("joint_graph")[0][1])
    out.sum().backward()
    assert x.grad is not None and model.fc1.weight.grad is not None


def test_compilers_get_prim_graphs_and_fake_inputs():
    seen = []

    def spy(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm

    model = TinyBlock(8, 2)
    x = torch.randn(3, 8)
    out = torch.compile(model, backend=aot_autograd(spy))(x)
    assert len(seen) == 2  # forward and backward
    for gm, inputs in seen:
        assert all(is_prim(n.target) for n in gm.graph.nodes if n.op == "call_function")
        assert all(isinstance(t, torch._subclasses.fake_tensor.FakeTensor) for t in inputs)
        assert len(inputs) == len([n for n in gm.graph.nodes if n.op == "placeholder"])
    torch.testing.assert_close(out, model(x))


def test_no_grad_builds_forward_only():
    calls = []

    def spy(gm, example_inputs):
        calls.append(gm)
        return gm

    model = TinyBlock(8, 2)
    x = torch.randn(3, 8)
    with torch.no_grad():
        out = torch.compile(model, backend=aot_autograd(spy))(x)
        torch.testing.assert_close(out, model(x))
    assert len(calls) == 1
    assert not any("tangents" in n.name for n in calls[0].graph.nodes)


def test_inference_compiled_function_refuses_grad_inputs():
    fn = aot_eager(lambda x: x.sin(), [torch.randn(3)])
    torch.testing.assert_close(fn(torch.ones(3)), torch.ones(3).sin())
    with pytest.raises(RuntimeError, match="compiled for inference"):
        fn(torch.randn(3, requires_grad=True))


def test_unused_input_and_nondifferentiable_outputs():
    def f(x, unused, y, idx):
        z = x * y.sum()
        return z, z > 0, idx + 1, z.argmax()

    args = [torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
            torch.randn(2, requires_grad=True),
            torch.randn(4, dtype=torch.float64, requires_grad=True),
            torch.arange(3)]
    compiled = torch.compile(f, backend=aot_eager)
    z, pos, idx1, am = compiled(*args)
    want = f(*args)
    for got, exp in zip((z, pos, idx1, am), want):
        torch.testing.assert_close(got, exp)
    assert z.requires_grad and not pos.requires_grad and not idx1.requires_grad
    (z * z).sum().backward()
    grads = [a.grad for a in args[:3]]
    for a in args[:3]:
        a.grad = None
    (want[0] * want[0]).sum().backward()
    assert grads[1] is None and args[1].grad is None
    torch.testing.assert_close(grads[0], args[0].grad)
    torch.testing.assert_close(grads[2], args[2].grad)


def test_output_unused_in_loss_gets_zero_tangent():
    def f(x):
        return x.sin(), x.cos() * 2

    x = torch.randn(5, requires_grad=True)
    a, b = torch.compile(f, backend=aot_eager)(x)
    a.sum().backward()  # b takes no part: its tangent is zeros
    torch.testing.assert_close(x.grad, x.detach().cos())


@pytest.mark.parametrize("shape", [(3,), (2, 5), (2, 3, 4)])
def test_broadcasting_grads_over_shapes(shape):
    def f(x, b, s):
        return (x * b + s).softmax(-1).log()

    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    b = torch.randn(shape[-1], dtype=torch.float64, requires_grad=True)
    s = torch.randn((), dtype=torch.float64, requires_grad=True)
    out = aot_eager(f, [x, b, s])(x, b, s)
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum(), [x, b, s])
    want = torch.autograd.grad((f(x, b, s) * w).sum(), [x, b, s])
    torch.testing.assert_close(got, want)


def test_partitions_share_the_joint_graph():
    """Both partitioners compute the same outputs and grads from the same joint graph."""
    from tininductor.decompositions import decompose, fake_inputs

    model = TinyBlock(8, 2)
    x = torch.randn(2, 8, requires_grad=True)
    params = list(model.parameters())
    fn = lambda x, *ps: torch.func.functional_call(  # noqa: E731
        model, dict(zip([n for n, _ in model.named_parameters()], ps)), (x,))
    inputs = [x, *params]
    fakes, mode = fake_inputs(inputs)
    joint = create_joint(decompose(fn, fakes), fakes, [True] * len(inputs), mode)
    tangent = torch.randn(2, 8)
    ref = joint.gm(inputs, [tangent])  # the joint takes two lists: primals, tangents
    for partition_fn in (default_partition, min_cut_partition):
        part = partition_fn(joint)
        fw_out = part.fw_gm(*inputs)
        grads = part.bw_gm(*fw_out[1:], tangent)
        torch.testing.assert_close(list(fw_out[:1]) + list(grads), list(ref))


def test_dynamic_shapes_are_specialised_per_shape():
    """TorchDynamo marks a dim dynamic after a size change (int inputs): compile per shape, lazily."""
    def f(x, w):
        return (x @ w).relu().sum(-1) * x.shape[0]

    w = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(f, backend=aot_eager)
    for n in [4, 5, 6, 5]:
        x = torch.randn(n, 8, dtype=torch.float64)
        out = compiled(x, w)
        torch.testing.assert_close(out, f(x, w))
        (got,) = torch.autograd.grad(out.sum(), w)
        (want,) = torch.autograd.grad(f(x, w).sum(), w)
        torch.testing.assert_close(got, want)


def test_in_place_ops_on_intermediates_are_functionalized():
    def f(x):
        y = x * 2
        y.add_(1)
        y.view(-1).mul_(3)  # through a view, too
        return y.sin()

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    out = torch.compile(f, backend=aot_eager)(x)
    torch.testing.assert_close(out, f(x))
    (got,) = torch.autograd.grad(out.sum(), x)
    (want,) = torch.autograd.grad(f(x).sum(), x)
    torch.testing.assert_close(got, want)


def test_input_mutation_is_written_back_in_inference():
    from tininductor.decompositions import decompose

    def f(x):
        x.add_(1)
        return x * 2

    a, b = torch.randn(3), None
    b = a.clone()
    gm = decompose(f, [a])
    assert [name for name, _ in gm.meta["fallbacks"]] == ["aten.copy_.default"]
    torch.testing.assert_close(gm(a), f(b))
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", ["input", "view", "twice"])
def test_outputs_aliasing_inputs_or_each_other(case):
    fns = {"input": lambda x: (x, x * 2), "view": lambda x: (x.t(), x.view(-1) * 2),
           "twice": lambda x: (lambda y: (y, y))(x.sin())}
    f = fns[case]
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    outs = aot_eager(f, [x])(x)
    want = f(x)
    torch.testing.assert_close(outs, want)
    (got,) = torch.autograd.grad(outs[0].sum() + 2 * outs[1].sum(), x)
    (exp,) = torch.autograd.grad(want[0].sum() + 2 * want[1].sum(), x)
    torch.testing.assert_close(got, exp)


INTERMEDIATE_VIEWS = {
    "view_before_base": lambda x: (lambda a: (a.view(-1), a))(x * 2),
    "two_views_one_whole": lambda x: (lambda a: (a.view(-1), a.view(2, 2)))(x * 2),
    "disjoint_rows": lambda x: (lambda a: (a[0], a[1]))(x.view(2, 2) * 2),
    "overlapping_slices": lambda x: (lambda a: (a[:3], a[1:]))(x * 2),
    "detached_and_base": lambda x: (lambda a: (a.detach(), a))(x * 2),
    "detached_base_and_row": lambda x: (lambda a: (a.detach(), a.view(2, 2)[0]))(x * 2),
    "transposed_base_and_row": lambda x: (lambda a: (a, a[0]))(x.view(2, 2).t().sin()),
}


@pytest.mark.parametrize("backend", ["aot_eager", "tininductor"])
@pytest.mark.parametrize("case", sorted(INTERMEDIATE_VIEWS))
def test_outputs_viewing_an_intermediate_take_in_place_writes_like_eager(case, backend):
    """Writing into one output that views an intermediate: eager allows it, and the other outputs
    that share its elements, and their gradients, see the write."""
    f = INTERMEDIATE_VIEWS[case]
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    tinydynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overlapping case runs its graph as captured, and says so
        got = tinydynamo.compile(f, backend=backend)(x)
    want = f(x)
    got[0].mul_(3)
    want[0].mul_(3)
    torch.testing.assert_close(list(got), list(want))
    for j in range(2):  # each output's gradient sees the write (or not) as eager's does
        assert got[j].requires_grad == want[j].requires_grad
        if want[j].requires_grad:
            (g,) = torch.autograd.grad(got[j].sum(), x, retain_graph=True)
            (e,) = torch.autograd.grad(want[j].sum(), x, retain_graph=True)
            torch.testing.assert_close(g, e)


def test_overlapping_views_of_an_intermediate_run_the_graph_as_captured():
    with pytest.warns(UserWarning, match="overlapping views of an intermediate"):
        torch.compile(INTERMEDIATE_VIEWS["overlapping_slices"], backend=aot_eager)(torch.randn(4, requires_grad=True))


DETACHED_WRITES = {
    "input_slice": lambda a: (lambda v: (v, v.detach().mul_(2)))(a[1:]),
    "input_zeroed_then_read": lambda a: (a.detach().zero_(), a + 1)[1],
    "intermediate": lambda a: (lambda y: (y.detach().zero_(), y + 1)[1])(a * 2),
}


@pytest.mark.parametrize("backend", ["aot_eager", "tininductor"])
@pytest.mark.parametrize("case", sorted(DETACHED_WRITES))
def test_a_write_through_a_detached_alias_is_invisible_to_autograd_as_in_eager(case, backend):
    """Eager's autograd does not see a write through ``x.detach()``: later uses of ``x`` read the new
    values but differentiate as ``x``. A functional graph cannot say that, so the graph runs as
    captured, with a warning; the values and gradients are eager's."""
    f = DETACHED_WRITES[case]
    x = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)

    def run(fn):
        outs = fn(x * 1)  # a non-leaf input: writable in place
        outs = outs if isinstance(outs, tuple) else (outs,)
        grads = [torch.autograd.grad(o.sum(), x, retain_graph=True)[0] if o.requires_grad else None for o in outs]
        return [o.detach() for o in outs], [o.requires_grad for o in outs], grads

    want = run(f)
    tinydynamo.reset()
    with pytest.warns(UserWarning, match="x.detach"):
        got = run(tinydynamo.compile(f, backend=backend))
    torch.testing.assert_close(got, want)


def test_an_input_only_read_detached_gets_no_backward_edge():
    """``e`` requires grad, but the graph reads only ``e.detach()``: the call must not link the new
    loss to the graph that made ``e``, whose backward already ran and freed what it saved (GANs)."""
    def f(a, b):
        e = a @ torch.ones(2, 2)
        (e - 1).abs().mean().backward()
        loss = (b @ e.detach()).mean()  # a graph break above: this graph takes e as an input
        loss.backward()
        return loss

    a, b = torch.randn(2, 2, requires_grad=True), torch.randn(2, 2, requires_grad=True)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    tinydynamo.reset()
    torch.testing.assert_close(tinydynamo.compile(f, backend="aot_eager")(a2, b2), f(a, b))
    torch.testing.assert_close((a2.grad, b2.grad), (a.grad, b.grad))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16], ids=["same_size", "other_size"])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_an_output_viewing_its_input_as_another_dtype_keeps_the_dtype(dtype, requires_grad):
    def f(x):
        return x.view(dtype), x.view(-1)[1:].view(dtype)

    x = torch.arange(8.0, requires_grad=requires_grad)
    outs, want = torch.compile(f, backend=aot_eager)(x), f(x)
    for got, exp in zip(outs, want):  # the same values and dtype, and still a view of x
        assert got.dtype == exp.dtype and torch.equal(got, exp)
        assert got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [aot_eager, aot_eager_min_cut], ids=["default", "min_cut"])
def test_models_train_on_cuda_like_eager(backend):
    torch.manual_seed(0)
    for model, batches in [
        (TinyBlock(32, 4), [(torch.randn(4, 8, 32),) for _ in range(3)]),
        (GPT(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16),
         [(torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))) for _ in range(3)]),
    ]:
        model = model.cuda()
        batches = [tuple(t.cuda() for t in b) for b in batches]
        want_losses, want_grads = _train(copy.deepcopy(model), lambda i: batches[i])
        torch._dynamo.reset()
        got_losses, got_grads = _train(copy.deepcopy(model), lambda i: batches[i], backend=backend)
        torch.testing.assert_close(got_losses, want_losses, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got_grads, want_grads, rtol=1e-3, atol=1e-4)


def test_module_compiled_under_no_grad_refuses_to_train_silently():
    model = TinyBlock(8, 2)
    x = torch.randn(2, 8)
    with torch.no_grad():
        compiled = aot_eager(torch.fx.symbolic_trace(model), [x])
        torch.testing.assert_close(compiled(x), model(x))
    with pytest.raises(RuntimeError, match="compiled for inference"):
        compiled(x)  # the parameters require grad now: no silent gradient-less output


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_min_cut], ids=["default", "min_cut"])
def test_training_dropout_uses_one_mask_forward_and_backward(backend):
    """Random dropout stays a fallback op (bernoulli) in the forward; the backward reuses its mask."""
    def f(x):
        return F.dropout(x, 0.5, training=True).sin()

    x = (torch.rand(64, 32, dtype=torch.float64) + 0.1).requires_grad_()
    y = backend(f, [x])(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    kept = y != 0  # x > 0, so sin(2x) != 0 exactly where the element was kept
    assert 0.3 < kept.double().mean() < 0.7
    torch.testing.assert_close(y, torch.where(kept, torch.sin(2 * x), 0.0))
    torch.testing.assert_close(grad, torch.where(kept, 2 * torch.cos(2 * x), 0.0))


@pytest.mark.parametrize("backend", [aot_eager, "tininductor"])
def test_mixed_dtype_gradient_takes_its_inputs_dtype(backend):
    """``bf16 * fp32`` (T5's layer norm: ``x * rsqrt(var.float())``): the gradient reaching the
    bf16 operand is rounded to bf16, as autograd's engine does; it then meets bf16 weights in
    the matmul's backward (was: ``mm`` of fp32 and bf16 raised while tracing the joint graph)."""
    import tinydynamo
    from tininductor import config

    def f(x, w, s):
        return (x @ w) * s

    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(8, 6, dtype=torch.bfloat16, requires_grad=True)
    s = torch.rand(6, dtype=torch.float32) + 0.5
    expected = f(x, w, s)
    expected.sum().backward()
    eager_grads = x.grad, w.grad
    x.grad = w.grad = None
    compiled = (tinydynamo.compile(f, backend="tininductor") if backend == "tininductor"
                else torch.compile(f, backend=backend))
    with config.patch({"fallback_to_eager": False}):
        actual = compiled(x, w, s)
        actual.sum().backward()
    assert actual.dtype == torch.float32 and x.grad.dtype == w.grad.dtype == torch.bfloat16
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close((x.grad, w.grad), eager_grads)
