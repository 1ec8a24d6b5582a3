"""AOT autograd never drops a gradient: multi-output ops, missing VJP rules, double backward.

Each model is trained one step through ``tinydynamo.compile`` and every parameter's ``.grad``
is compared with eager's (issue 12: these gradients used to be ``None`` or wrong, silently).
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tininductor.testing  # noqa: F401  (TRITON_INTERPRET=1 on CPU)
import tinydynamo
from tininductor.joint_graph import MissingVJPRule
from tinydynamo.exc import BackendCompilerFailed

BACKENDS = ["aot_eager", "tininductor"]


@pytest.fixture(autouse=True)
def _fresh_caches():
    """A frame that fell back to eager stays eager: start every test from empty caches."""
    tinydynamo.reset()
    yield
    tinydynamo.reset()


class Attention(nn.Module):
    """nanoGPT's CausalSelfAttention with a pre-LayerNorm: F.scaled_dot_product_attention."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.ln, self.qkv, self.proj, self.heads = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class ConvBN(nn.Module):
    """Conv + BatchNorm (train mode: ``_native_batch_norm_legit``, a tuple) + GroupNorm + pooling."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.gn, self.fc = nn.GroupNorm(2, 4), nn.Linear(4, 2)

    def forward(self, x):
        y = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        y = F.interpolate(self.gn(y), scale_factor=2, mode="bilinear")
        return self.fc(F.hardswish(F.pad(y, (1, 1, 1, 1), mode="reflect")).mean((2, 3)))


class Selections(nn.Module):
    """max(dim), sort, topk, var_mean, std, logsumexp, cumsum, embedding with padding_idx."""

    def __init__(self):
        super().__init__()
        self.lin, self.emb = nn.Linear(8, 8), nn.Embedding(6, 8, padding_idx=0)

    def forward(self, x, idx):
        y = self.lin(x) + self.emb(idx)
        var, mean = torch.var_mean(y, 1)
        return (torch.max(y, 1).values.sum() + torch.sort(y, 1).values[:, :3].sum()
                + torch.topk(y, 2, 1).values.square().sum() + (var * mean).sum() + y.std(0).sum()
                + torch.logsumexp(y, 1).sum() + F.silu(y.cumsum(1)).sum() + F.mish(y).min(0)[0].sum())


def _inputs(name):
    torch.manual_seed(0)
    if name == "attention":
        return Attention().double(), (torch.randn(2, 5, 16, dtype=torch.float64),)
    if name == "conv_bn":
        return ConvBN().double(), (torch.randn(2, 3, 6, 6, dtype=torch.float64),)
    return Selections().double(), (torch.randn(4, 8, dtype=torch.float64), torch.tensor([0, 3, 0, 5]))


def _loss(out):
    return out if out.dim() == 0 else out.square().mean()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["attention", "conv_bn", "selections"])
def test_every_parameter_gets_eagers_gradient(name, backend):
    model, args = _inputs(name)
    ref = copy.deepcopy(model)
    want = _loss(ref(*args))
    want.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the graph must compile, with its gradients
        got = _loss(tinydynamo.compile(model, backend=backend)(*args))
        got.backward()
    torch.testing.assert_close(got, want)
    for (n, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
        assert q.grad is not None, f"{n}: gradient dropped"
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{n}: {m}")
    if name == "selections":  # the padding row gets no gradient, as in eager
        assert torch.count_nonzero(model.emb.weight.grad[0]) == 0


# --------------------------------------------------------------------------- a missing rule
_lib = torch.library.Library("tinyad_test", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
_lib.impl("twice", lambda x: torch.empty_like(x), "Meta")
torch.library.register_autograd("tinyad_test::twice", lambda ctx, g: g * 2)


def _uses_op_without_rule(x, w):
    return (torch.ops.tinyad_test.twice(x * w).sin() * w).sum()


def _args():
    return torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_op_without_rule_falls_back_with_a_warning_naming_it(backend):
    x, w = _args()
    want = torch.autograd.grad(_uses_op_without_rule(x, w), w)
    with pytest.warns(UserWarning, match=r"no VJP rule for tinyad_test\.twice"):
        out = tinydynamo.compile(_uses_op_without_rule, backend=backend)(x, w)
    torch.testing.assert_close(torch.autograd.grad(out, w), want)  # eager ran it: right gradient


@pytest.mark.parametrize("backend", BACKENDS)
def test_op_without_rule_raises_with_fullgraph_or_without_suppress_errors(backend):
    # raised as torch does it: BackendCompilerFailed naming the stage, the rule's error inside
    x, w = _args()
    with pytest.raises(BackendCompilerFailed, match=r"joint_graph.*tinyad_test\.twice") as raised:
        tinydynamo.compile(_uses_op_without_rule, backend=backend, fullgraph=True)(x, w)
    assert isinstance(raised.value.inner_exception, MissingVJPRule)
    with tinydynamo.config.patch(suppress_errors=False):
        with pytest.raises(BackendCompilerFailed, match=r"tinyad_test\.twice") as raised:
            tinydynamo.compile(_uses_op_without_rule, backend=backend)(x, w)
    assert isinstance(raised.value.inner_exception, MissingVJPRule)


def test_op_without_rule_is_fine_when_no_gradient_passes_through_it():
    x, w = _args()
    fn = lambda x, w: (torch.ops.tinyad_test.twice(x).sin() * w).sum()  # noqa: E731  (x needs no grad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = tinydynamo.compile(fn, backend="aot_eager")(x, w)
    torch.testing.assert_close(torch.autograd.grad(out, w), torch.autograd.grad(fn(x, w), w))


# --------------------------------------------------------------------------- double backward
def _penalty(x, w):
    return (torch.tanh(x @ w) * x.sum(1, keepdim=True)).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_create_graph_backward_falls_back_to_eager_autograd(backend):
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)

    def second_order(fn):
        (gx,) = torch.autograd.grad(fn(x, w), x, create_graph=True)  # a gradient penalty
        return torch.autograd.grad(gx.square().sum(), (x, w))

    want = second_order(_penalty)
    with pytest.warns(UserWarning, match="create_graph=True"):
        got = second_order(tinydynamo.compile(_penalty, backend=backend))
    torch.testing.assert_close(got, want)


def test_create_graph_backward_through_random_ops_raises():
    x = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    fn = tinydynamo.compile(lambda x: F.dropout(x.sin(), 0.5, training=True).sum(), backend="aot_eager")
    with pytest.raises(RuntimeError, match="random"):
        torch.autograd.grad(fn(x), x, create_graph=True)


# --------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_in_training_keeps_eagers_statistics_and_its_mask(backend):
    """Dropout draws its own mask (not eager's draws); what must hold: about ``1 - p`` of the
    values kept, kept values scaled by ``1 / (1 - p)``, and the backward uses the same mask."""
    torch.manual_seed(0)
    p = 0.25
    x = (torch.rand(64, 64, dtype=torch.float64) + 1).requires_grad_()
    fn = tinydynamo.compile(lambda x: F.dropout(x, p, training=True) * 3, backend=backend)
    y = fn(x)
    kept = y != 0
    assert abs(kept.double().mean().item() - (1 - p)) < 0.03
    torch.testing.assert_close(y[kept], (x * 3 / (1 - p))[kept])
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, kept.double() * 3 / (1 - p))


# --------------------------------------------------------------------------- CUDA attention
_KERNEL_OP = {"FLASH_ATTENTION": "_scaled_dot_product_flash_attention",
              "EFFICIENT_ATTENTION": "_scaled_dot_product_efficient_attention",
              "CUDNN_ATTENTION": "_scaled_dot_product_cudnn_attention", "MATH": None}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused attention kernels need CUDA")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", ["none", "causal", "bias"])
@pytest.mark.parametrize("kernel", list(_KERNEL_OP))
def test_cuda_attention_forms_train_like_eager(kernel, mask, backend):
    """Each SDPA kernel stays a fused extern call; its VJP rule calls the matching ATen backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tininductor.aot_autograd import aot_eager

    torch.manual_seed(0)
    dtype = torch.float32 if kernel in ("EFFICIENT_ATTENTION", "MATH") else torch.bfloat16
    q, k, v = [torch.randn(2, 4, 64, 32, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3)]
    bias = torch.randn(64, 64, device="cuda", dtype=dtype, requires_grad=True) if mask == "bias" else None

    def attention(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=mask == "causal")

    inputs = [q, k, v] + ([bias] if bias is not None else [])
    with sdpa_kernel(getattr(SDPBackend, kernel)):
        try:
            want = attention(q, k, v, bias)
        except RuntimeError as e:
            pytest.skip(f"eager has no {kernel} kernel for this case: {e}")
        cot = torch.randn_like(want)
        want_grads = torch.autograd.grad(want, inputs, cot)
        if _KERNEL_OP[kernel]:
            prim_gm = aot_eager(lambda *a: attention(*a, *([None] if bias is None else [])), inputs).aot.prim_gm
            ops = {getattr(n.target, "_opname", "") for n in prim_gm.graph.nodes}
            assert _KERNEL_OP[kernel] in ops, f"{kernel}: the fused op is not in the graph: {sorted(ops)}"
        tinydynamo.reset()
        with warnings.catch_warnings():
            # a fallback would warn; torch's own notes (cuBLAS context, disabled kernels) are not ours
            warnings.filterwarnings("error", message=r"(?s).*(tinydynamo|tininductor)")
            got = tinydynamo.compile(attention, backend=backend)(q, k, v, bias)
            got_grads = torch.autograd.grad(got, inputs, cot)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, **tol)
    for name, g, w in zip("qkvb", got_grads, want_grads):
        torch.testing.assert_close(g, w, **tol, msg=lambda m: f"grad of {name}: {m}")


@pytest.mark.parametrize("op, bias", [("_scaled_dot_product_flash_attention", False),
                                      ("_scaled_dot_product_efficient_attention", True),
                                      ("_scaled_dot_product_cudnn_attention", True)])
def test_cuda_attention_rules_match_the_aten_schemas(op, bias):
    """Without a GPU: run each CUDA attention rule on meta tensors, so its call of the ATen
    backward op is checked against the op's schema and meta kernel (argument order, shapes)."""
    from tininductor.vjp_rules import VJP_RULES

    aten = torch.ops.aten
    q, k, v = [torch.empty(2, 4, 64, 32, device="meta", dtype=torch.bfloat16) for _ in range(3)]
    forward = getattr(aten, op)
    args = (q, k, v, torch.empty(64, 64, device="meta", dtype=torch.bfloat16), True) if bias else (q, k, v)
    out = forward(*args, 0.0, False)
    grads = VJP_RULES[forward](([torch.empty_like(out[0])] + [None] * (len(out) - 1)), out, *args, 0.0, False)
    assert [tuple(g.shape) for g in grads[:3]] == [tuple(q.shape)] * 3
    if op == "_scaled_dot_product_efficient_attention":
        assert tuple(grads[3].shape) == (64, 64)


@pytest.mark.parametrize("op", ["_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"])
def test_cuda_attention_is_traced_with_its_logsumexp(op):
    """Graphs are traced without grad, where torch would skip the logsumexp the backward needs."""
    from tininductor.decompositions import DECOMPOSITIONS

    aten = torch.ops.aten
    q = torch.empty(1, 2, 8, 16, device="meta")
    decomposition = DECOMPOSITIONS[getattr(aten, op).default]
    assert decomposition(q, q, q, None, True) is NotImplemented  # already computed: keep the op
    out = decomposition(q, q, q, None, False)
    assert out[1].numel() > 0


def test_in_place_op_on_a_value_needing_grad_falls_back():
    """A mutation left in the prim graph would hide data flow from AD: refused, never a wrong gradient."""
    from tininductor.decompositions import fake_inputs
    from tininductor.joint_graph import AutogradCompileError, create_joint

    aten = torch.ops.aten

    def fn(x):  # an in-place op that functionalization does not see (called on the prim graph)
        y = aten.mul.Tensor(x, 2.0)
        aten.mul_.Tensor(y, y)
        return aten.sum.default(y)

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    fakes, mode = fake_inputs([x])
    gm = torch.fx.symbolic_trace(fn)
    with mode:
        for node in gm.graph.nodes:
            if node.op == "call_function":
                node.meta["val"] = node.target(*[a.meta["val"] if isinstance(a, torch.fx.Node) else a
                                                 for a in node.args])
            elif node.op == "placeholder":
                node.meta["val"] = fakes[0]
    with pytest.raises(AutogradCompileError, match="modifies a tensor that requires grad"):
        create_joint(gm, fakes, [True], mode)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sdpa_learned_mask_gets_its_gradient(backend):
    """A float attention mask that requires grad (T5's learned position bias) gets the gradient of
    the scores, recomputed from the saved logsumexp; the fused backward returns q/k/v's only."""
    torch.manual_seed(0)
    q, k, v = [torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3)]
    bias = torch.randn(3, 5, 5, requires_grad=True)  # broadcast over the batch

    def attention(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).sin().sum()

    want = torch.autograd.grad(attention(q, k, v, bias), [q, k, v, bias])
    tinydynamo.reset()
    with tinydynamo.config.patch(suppress_errors=False):
        got = torch.autograd.grad(tinydynamo.compile(attention, backend=backend)(q, k, v, bias), [q, k, v, bias])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_running_stats_written_in_place_by_an_aten_op_then_backward(backend):
    """``_native_batch_norm_legit`` writes ``running_mean``/``running_var`` in place (its schema's
    ``(a!)`` arguments, not ``self``). They are written back after the graph, and are not version-
    checked as inputs eager saved before the write (backward raised "modified by an inplace
    operation"); values, running stats and gradients equal eager's (the OpInfo sample)."""
    def bn(x, w, b, rm, rv):
        return torch.ops.aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.5, 0.6)

    torch.manual_seed(0)
    args = [torch.randn(5, 5, 5, dtype=torch.float64, requires_grad=True),
            torch.randn(5, dtype=torch.float64, requires_grad=True),
            torch.randn(5, dtype=torch.float64, requires_grad=True),
            torch.randn(5, dtype=torch.float64), torch.rand(5, dtype=torch.float64) + 0.5]
    ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    compiled = tinydynamo.compile(bn, backend=backend, fullgraph=True)
    for _ in range(2):
        out, ref = compiled(*args), bn(*ref_args)
        (out[0] * out[0]).sum().backward()
        (ref[0] * ref[0]).sum().backward()
        for got, want in zip([*out, *args[3:]], [*ref, *ref_args[3:]]):
            torch.testing.assert_close(got, want)
        for a, r in zip(args[:3], ref_args[:3]):
            torch.testing.assert_close(a.grad, r.grad)
