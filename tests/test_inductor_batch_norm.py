"""Batch norm lowered into a reduction and pointwise ops (``config.decompose_batch_norm``), and the
``config.freezing`` pass that folds it into the convolution before it: values, gradients and running
statistics against eager, on the C++ backend and the Triton interpreter."""
import copy

import pytest
import torch
from torch import nn

from tininductor.testing import compile_graph

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
BACKENDS = ["cpp", "triton"]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)



class ConvBnBlock(nn.Module):
    """A torchvision BasicBlock's second half: conv -> bn -> + identity -> relu."""

    def __init__(self, c=4, bn=nn.BatchNorm2d):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = bn(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + x)


def _randomize_stats(m):
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.running_mean.uniform_(-1, 1)
            mod.running_var.uniform_(0.5, 2)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return m


def _source(compiled):
    return "\n".join(g.source for g in compiled.compiled_graphs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_batch_norm_fuses_with_relu_and_add(backend):
    m = _randomize_stats(ConvBnBlock()).eval()
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        c = compile_graph(m, [x], backend)
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    assert c.fallback_reasons == [], c.fallback_reasons
    assert "batch_norm" not in c.source
    # normalise + add + relu: one kernel after the convolution (besides, under layout optimization,
    # the copies of its input and weight into channels-last, named after the convolution)
    assert len([k for k in c.kernels if "convolution" not in k]) == 1, c.kernels


def test_eval_batch_norm_is_a_fallback_with_the_pass_off():
    m = _randomize_stats(ConvBnBlock()).eval()
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        c = compile_graph(m, [x], "cpp", decompose_batch_norm=False)
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    assert any("batch_norm" in r for r in c.fallback_reasons), c.fallback_reasons


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_eval_batch_norm_half_precision(dtype):
    m = _randomize_stats(ConvBnBlock()).eval().to(dtype)
    x = torch.randn(2, 4, 6, 6, dtype=dtype)
    with torch.no_grad():
        c = compile_graph(m, [x], "cpp")
        ref = copy.deepcopy(m).float()(x.float()).to(dtype)  # eager in float32, rounded once
        torch.testing.assert_close(c(x), ref, rtol=2e-2, atol=2e-2)
    assert c.fallback_reasons == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bn,shape", [(nn.BatchNorm2d, (3, 4, 5, 5)), (nn.BatchNorm1d, (6, 4)),
                                      (nn.BatchNorm1d, (3, 4, 7))])
def test_training_batch_norm_values_gradients_running_stats(backend, bn, shape):
    """Two training steps: outputs, every gradient, running mean/var (unbiased) and the step count
    equal eager's, and the forward and backward graphs call no batch norm op."""
    if len(shape) == 4:
        m = ConvBnBlock(bn=bn)
    else:
        m = nn.Sequential(nn.Linear(shape[-1], shape[-1]) if len(shape) == 2 else nn.Identity(), bn(4), nn.ReLU())
    m = _randomize_stats(m).train()
    ref = copy.deepcopy(m)
    x = torch.randn(shape, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    c = compile_graph(m, [x], backend, decompose_batch_norm_training=True)
    for _ in range(2):
        out, want = c(x), ref(x_ref)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
        (out * torch.arange(out.numel()).view(out.shape).sin()).sum().backward()
        (want * torch.arange(want.numel()).view(want.shape).sin()).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
        for (name, b), r in zip(m.named_buffers(), ref.buffers()):
            torch.testing.assert_close(b, r, rtol=1e-5, atol=1e-6, msg=name)
    assert "batch_norm" not in _source(c), _source(c)
    # the running statistics leave the graph as outputs, written back after the call in one batch,
    # not by a copy launched in the middle of the forward
    assert "aten.copy_" not in _source(c), _source(c)


def test_training_batch_norm_without_running_stats():
    def m(x):
        return torch.nn.functional.batch_norm(x, None, None, training=True)

    x = torch.randn(3, 4, 2, 2, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    c = compile_graph(m, [x], "cpp", decompose_batch_norm_training=True)
    out, want = c(x), m(x_ref)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    out.pow(2).sum().backward()
    want.pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    assert "batch_norm" not in _source(c)


class ConvBnStack(nn.Module):
    """Conv (with and without bias) -> BN -> ReLU, twice, and a residual add."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=True), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_freezing_folds_batch_norm_into_the_convolution(backend):
    m = _randomize_stats(ConvBnStack()).eval()
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        frozen = compile_graph(m, [x], backend, freezing=True)
        plain = compile_graph(m, [x], backend)
        torch.testing.assert_close(frozen(x), m(x), rtol=1e-4, atol=1e-5)
    prim = frozen.aot.prim_gm
    assert not any(n.target is torch.ops.aten.rsqrt.default for n in prim.graph.nodes), prim.code
    assert any(n.target is torch.ops.aten.rsqrt.default for n in plain.aot.prim_gm.graph.nodes)
    convs = [n for n in prim.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert all(n.args[1].op == "get_attr" and n.args[2].op == "get_attr" for n in convs), prim.code
    # relu; add + relu, each with its convolution's bias on the GPU: the batch norms are gone (besides,
    # under layout optimization, the input's copy into channels-last; frozen weights are converted once)
    compute = [k for k in frozen.kernels if "relu" in k]
    assert len(compute) == 2 and len(frozen.kernels) - len(compute) <= 1, frozen.kernels


def test_freezing_bfloat16_matches_eager():
    m = _randomize_stats(ConvBnStack()).eval().to(torch.bfloat16)
    x = torch.randn(2, 3, 6, 6, dtype=torch.bfloat16)
    with torch.no_grad():
        frozen = compile_graph(m, [x], "cpp", freezing=True)
        ref = copy.deepcopy(m).float()(x.float())
        torch.testing.assert_close(frozen(x).float(), ref, rtol=5e-2, atol=5e-2)


def test_freezing_leaves_training_graphs_alone():
    m = _randomize_stats(ConvBnStack()).train()
    ref = copy.deepcopy(m)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    c = compile_graph(m, [x], "cpp", freezing=True)
    torch.testing.assert_close(c(x), ref(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend,levels", [("triton", 2), ("cpp", 1)])
def test_training_statistics_over_a_long_map_come_in_two_levels_where_reductions_split(backend, levels):
    """Three channels over 4x40x40 values: Triton would split that reduction, so the statistics are
    each sample's, then combined over the batch (Chan's parallel variance), two kernels where the
    split two-pass variance takes four; C++ splits nothing and keeps one. Values, gradients and
    running statistics equal eager's either way."""
    m = _randomize_stats(nn.Sequential(nn.BatchNorm2d(3))).train()
    ref = copy.deepcopy(m)
    x = torch.randn(4, 3, 40, 40) * 2 + 1
    x_ref = x.detach().clone().requires_grad_()
    x.requires_grad_()
    c = compile_graph(m, [x], backend, decompose_batch_norm_training=True)
    out, want = c(x), ref(x_ref)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    out.pow(2).sum().backward()
    want.pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad, rtol=1e-4, atol=1e-4)
    for b, r in zip(m.buffers(), ref.buffers()):
        torch.testing.assert_close(b, r, rtol=1e-5, atol=1e-5)
    forward = c.compiled_graphs[0]  # the statistics' kernels, the normalisation's, the step count's
    assert len(forward.kernels) == levels + 2, (forward.kernels, forward.source)
