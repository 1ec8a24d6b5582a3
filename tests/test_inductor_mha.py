"""The fused attention ops of nn.MultiheadAttention's and nn.TransformerEncoderLayer's fast paths
(``aten._native_multi_head_attention``, ``aten._transformer_encoder_layer_fwd``) decomposed into
linear layers, attention and softmax (tininductor/decompositions.py): values against the eager op
over its arguments (weights or not, averaged or not, each mask form), then the real modules and
torchvision's VisionTransformer through tinydynamo."""
import logging
import sys

import pytest
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

import tininductor
import tinydynamo
from tests.model_zoo import import_torchvision
from tininductor.aot_autograd import aot_eager
from tininductor.decompositions import DECOMPOSITIONS, decompose
from tininductor.testing import compile_graph, patch_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
aten = torch.ops.aten
MHA = aten._native_multi_head_attention.default
ENCODER_LAYER = aten._transformer_encoder_layer_fwd.default
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def _weights(d, dtype):
    return [torch.randn(3 * d, d, dtype=dtype) / d ** 0.5, torch.randn(3 * d, dtype=dtype),
            torch.randn(d, d, dtype=dtype) / d ** 0.5, torch.randn(d, dtype=dtype)]


def _mask(kind, b, h, t, full_row=False):
    """(mask, mask_type) of each form the op reads; ``full_row`` masks one row (or sequence) entirely."""
    if kind is None:
        return None, None
    if kind == "padding":  # [B, S], type 1
        m = torch.rand(b, t) < 0.3
        m[:, 0] = False
        if full_row:
            m[-1] = True
        return m, 1
    if kind == "attention":  # [T, S], type 0
        return torch.ones(t, t, dtype=torch.bool).triu(1), 0
    if kind == "general":  # [B, heads, T, S], type 2
        m = torch.rand(b, h, t, t) < 0.3
        m[..., 0] = False
        if full_row:
            m[0, 0, 0] = True
        return m, 2
    if kind == "float":  # converted to bool by the op: nonzero entries are masked out
        return torch.where(torch.rand(b, h, t, t) < 0.3, -torch.inf, 0.0).index_fill(-1, torch.tensor([0]), 0.0), 2
    raise ValueError(kind)


def _run_op(shape, dtype, mask_kind, need_weights, average, self_attention=True, full_row=False, backend="cpp"):
    """The op against eager, compiled by ``backend``, or with ``backend=None`` its decomposed graph
    run by torch (the decomposition's meaning alone, fast: no kernel is built)."""
    b, t, d, h = shape
    x = torch.randn(b, t, d, dtype=dtype)
    mask, mask_type = _mask(mask_kind, b, h, t, full_row)
    mask_args = [] if mask is None else [mask]

    q, k, v = (x, x, x) if self_attention else (x, torch.randn(b, t, d, dtype=dtype), torch.randn(b, t, d, dtype=dtype))
    tensors = [q] if self_attention else [q, k, v]
    # a plain function of tensors: FX traces positional parameters, not *args
    names = ["q"] if self_attention else ["q", "k", "v"]
    body = (f"lambda {', '.join(names + ['w', 'bias', 'pw', 'pb'] + (['mask'] if mask is not None else []))}: "
            f"MHA({'q, q, q' if self_attention else 'q, k, v'}, d, h, w, bias, pw, pb, "
            f"{'mask' if mask is not None else 'None'}, need_weights, average, mask_type)")
    fn = eval(body, dict(MHA=MHA, d=d, h=h, need_weights=need_weights, average=average, mask_type=mask_type))
    args = [*tensors, *_weights(d, dtype), *mask_args]
    gm = torch.fx.symbolic_trace(fn)
    if backend is None:
        compiled = decompose(gm, args)
        assert MHA not in [n.target for n in compiled.graph.nodes], compiled.code
    else:
        compiled = compile_graph(gm, args, backend)
        assert "_native_multi_head_attention" not in compiled.source, compiled.source
    out, weights = compiled(*args)
    ref_out, ref_weights = fn(*args)
    torch.testing.assert_close(out, ref_out, equal_nan=True, **TOL[dtype])
    if ref_weights is None:
        assert weights is None
    else:
        torch.testing.assert_close(weights, ref_weights, equal_nan=True, **TOL[dtype])
    return compiled


SHAPES = [(2, 5, 16, 2), (3, 7, 32, 4), (1, 1, 8, 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask_kind", [None, "padding", "attention", "general", "float"])
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_native_multi_head_attention_decomposition_matches_eager(dtype, shape, mask_kind, need_weights, average):
    _run_op(shape, dtype, mask_kind, need_weights, average, backend=None)


@pytest.mark.parametrize("mask_kind", [None, "padding", "attention", "general"])
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, False)])
def test_native_multi_head_attention_compiled_matches_eager(mask_kind, need_weights, average):
    _run_op((3, 7, 32, 4), torch.float32, mask_kind, need_weights, average)


@pytest.mark.parametrize("need_weights", [False, True])
def test_separate_query_key_value_project_each_with_its_third(need_weights):
    _run_op((2, 6, 16, 2), torch.float32, "padding", need_weights, True, self_attention=False, backend=None)
    _run_op((2, 6, 16, 2), torch.float32, None, need_weights, True, self_attention=False)


@pytest.mark.parametrize("mask_kind", ["padding", "general"])
def test_fully_masked_row_is_nan_on_cpu_as_in_eager(mask_kind):
    """Eager's CPU ``_masked_softmax`` gives NaN for a row masked everywhere; the decomposition too."""
    _run_op((2, 4, 8, 2), torch.float32, mask_kind, True, False, full_row=True, backend=None)


def test_without_weights_or_mask_uses_the_fused_attention_kernel():
    """One matmul for the packed q/k/v projection and one for the output, their biases in the
    matmul (read by library kernels only), attention as SDPA: nothing is left for a generated kernel."""
    compiled = _run_op((2, 5, 16, 2), torch.float32, None, False, True)
    assert "scaled_dot_product" in compiled.source and compiled.source.count("torch.addmm(") == 2, compiled.source
    assert compiled.kernels == [], compiled.kernels


def test_triton_backend():
    _run_op((2, 5, 16, 2), torch.float32, "padding", True, True, backend="triton")


@pytest.mark.parametrize("bad", ["mask_type", "shape"])
def test_unsupported_arguments_stay_the_op(bad):
    """A mask of a shape the op's kernel rejects, or key/value of another length, is declined:
    the op stays in the graph (a logged fallback) and torch raises its own error."""
    b, t, d, h = 2, 5, 16, 2
    q = torch.randn(b, t, d)
    kv = torch.randn(b, t + 1, d) if bad == "shape" else q
    mask, mask_type = (torch.zeros(b, t, dtype=torch.bool), 0) if bad == "mask_type" else (None, None)
    gm = torch.fx.symbolic_trace(lambda q, kv, w, bias, pw, pb: MHA(q, kv, kv, d, h, w, bias, pw, pb, mask, True,
                                                                     True, mask_type))
    out = decompose(gm, [q, kv, *_weights(d, torch.float32)])
    assert [name for name, _ in out.meta["fallbacks"]] == [str(MHA)]


def test_registered():
    assert DECOMPOSITIONS.lookup(MHA) is not None and DECOMPOSITIONS.lookup(ENCODER_LAYER) is not None


# ----------------------------------------------------------------------------- real modules
def _through_tinydynamo(fn, *args, caplog=None):
    """``fn`` compiled by tinydynamo under no_grad: its result and the fallbacks it logged."""
    tinydynamo.reset()
    compiled = tinydynamo.compile(fn, backend="tininductor", dynamic=False)
    with caplog.at_level(logging.INFO, logger="tininductor.decompositions"), torch.no_grad(), \
            patch_config(tininductor.config, fallback_to_eager=False, cpu_backend="cpp"):
        caplog.clear()
        out = compiled(*args)
    fallbacks = [r.getMessage() for r in caplog.records if "fallback to torch" in r.getMessage()]
    return out, fallbacks


def _eager(fn, *args):
    with torch.no_grad():
        return fn(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kwargs", [dict(need_weights=False), dict(need_weights=True),
                                    dict(need_weights=True, average_attn_weights=False), "padding", "attention"])
def test_multihead_attention_module(dtype, kwargs, caplog):
    m = nn.MultiheadAttention(32, 4, batch_first=True).eval().to(dtype)
    x = torch.randn(3, 6, 32, dtype=dtype)
    if kwargs == "padding":
        mask = torch.zeros(3, 6, dtype=torch.bool)
        mask[1, 4:] = True
        kwargs = dict(key_padding_mask=mask)
    elif kwargs == "attention":
        kwargs = dict(attn_mask=torch.ones(6, 6, dtype=torch.bool).triu(1), need_weights=False)
    fn = lambda x: m(x, x, x, **kwargs)  # noqa: E731
    (out, weights), fallbacks = _through_tinydynamo(fn, x, caplog=caplog)
    ref_out, ref_weights = _eager(fn, x)
    assert not any("multi_head_attention" in f for f in fallbacks), fallbacks
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    assert (weights is None) == (ref_weights is None)
    if ref_weights is not None:
        torch.testing.assert_close(weights, ref_weights, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
@pytest.mark.parametrize("padding", [False, True])
def test_transformer_encoder_layer(dtype, norm_first, activation, padding, caplog):
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first).eval().to(dtype)
    x = torch.randn(2, 7, 32, dtype=dtype)
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[0, 5:] = True
    args = (x, mask) if padding else (x,)
    fn = (lambda x, mask: layer(x, src_key_padding_mask=mask)) if padding else layer  # noqa: E731
    out, fallbacks = _through_tinydynamo(fn, *args, caplog=caplog)
    assert not any("transformer_encoder_layer" in f or "multi_head" in f for f in fallbacks), fallbacks
    torch.testing.assert_close(out, _eager(fn, *args), **TOL[dtype])


def test_torchvision_vision_transformer(caplog):
    tv = import_torchvision()
    if tv is None:
        pytest.skip("torchvision is not installed")
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                              num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    out, fallbacks = _through_tinydynamo(model, x, caplog=caplog)
    assert not any("multi_head_attention" in f for f in fallbacks), fallbacks
    torch.testing.assert_close(out, _eager(model, x), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- the fused kernels' logsumexp
def test_fused_attention_keeps_its_logsumexp_only_for_a_backward():
    """The CUDA attention kernels write a logsumexp for the backward when asked: asked in a graph
    traced for training, not in one traced for inference (fake CUDA tensors: no GPU needed)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        q = torch.empty(2, 2, 4, 8, device="cuda")
    fn = lambda q: aten._scaled_dot_product_efficient_attention(q, q, q, None, False)[0]  # noqa: E731
    for inference in (False, True):
        gm = decompose(torch.fx.symbolic_trace(fn), [q], inference=inference)
        [node] = [n for n in gm.graph.nodes if n.target is aten._scaled_dot_product_efficient_attention.default]
        assert node.args[4] is (not inference)


@pytest.mark.parametrize("grad", [False, True])
def test_aot_traces_for_inference_when_no_backward_can_follow(grad, monkeypatch):
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("inference"))
        return decompose(*args, **kwargs)

    monkeypatch.setattr(sys.modules["tininductor.aot_autograd"], "decompose", spy)  # the package exports a function of that name
    x = torch.randn(3, requires_grad=True)
    with torch.set_grad_enabled(grad):
        aot_eager(lambda x: x.sin(), [x])
    assert seen == [not grad]
