"""Layout optimization (``config.layout_optimization``; forced here, where there is no GPU): a
convolution graph keeps its 4-D intermediates channels-last and its pointwise kernels walk them in
that order. Values and gradients against eager, on the C++ backend and the Triton interpreter.
Unforced, it is on for inference graphs whose convolutions cuDNN or oneDNN runs."""
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


class Bottleneck(nn.Module):
    """conv-bn-relu twice and a residual add, then a global average pool and a linear head."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, 3)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return y, self.fc(y.mean([2, 3]))



@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_last_intermediates_inference(backend):
    m = Bottleneck().eval()
    x = torch.randn(2, 8, 5, 6)
    with torch.no_grad():
        c = compile_graph(m, [x], backend, force_layout_optimization=True)
        out, want = c(x), m(x)
        plain = compile_graph(m, [x], backend, layout_optimization=False)  # on by default on CUDA
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert out[0].stride() == want[0].stride()  # outputs keep eager's layout
    channels_last = "(240, 1, 48, 8)"  # (N, C, H, W) = (2, 8, 5, 6) laid out as (N, H, W, C)
    assert channels_last in c.source, c.source
    assert channels_last not in plain.source


def test_cpu_inference_runs_channels_last_where_onednn_runs_the_convolutions():
    """As TorchInductor decides: on the CPU with oneDNN (``torch.backends.mkldnn``) an inference
    graph's convolutions get channels-last inputs; without oneDNN, or in a training graph, NCHW."""
    m = Bottleneck().eval()
    x = torch.randn(2, 8, 5, 6)
    channels_last = "(240, 1, 48, 8)"
    with torch.no_grad():
        default = compile_graph(m, [x], "cpp")
        with torch.backends.mkldnn.flags(enabled=False):
            without_onednn = compile_graph(m, [x], "cpp")
        torch.testing.assert_close(default(x), m(x), rtol=1e-4, atol=1e-5)
    training = compile_graph(copy.deepcopy(m).train(), [x.clone().requires_grad_()], "cpp")
    if torch.backends.mkldnn.is_available():
        assert channels_last in default.source, default.source
    assert channels_last not in without_onednn.source
    assert all(channels_last not in g.source for g in training.compiled_graphs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_forward_saves_channels_last_activations_for_its_backward(backend):
    """The forward keeps the activations it saves in the layout it chose (no copy back to NCHW); the
    backward is compiled for those strides. A mutant that compiles the backward for the traced
    (NCHW) strides reads them wrongly, which the gradients below catch."""
    m = Bottleneck().train()
    ref = copy.deepcopy(m)
    x = torch.randn(2, 8, 5, 6, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    c = compile_graph(m, [x], backend, force_layout_optimization=True)
    forward, backward = c.compiled_graphs
    channels_last = (240, 1, 48, 8)
    assert channels_last in forward.output_strides
    assert "(240, 1, 48, 8)" in backward.source  # its kernels index the saved values as stored
    out, want = c(x), ref(x_ref)
    (out[0].sin().sum() + out[1].pow(2).sum()).backward()
    (want[0].sin().sum() + want[1].pow(2).sum()).backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    for (name, p), p_ref in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_training_graphs_are_laid_out_only_on_cuda_and_when_asked():
    """Unforced, a training graph is laid out on CUDA only, with ``layout_optimization_training``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tininductor import config
    from tininductor.graph import _wants_channels_last

    gm = torch.fx.symbolic_trace(lambda x, w: torch.ops.aten.convolution.default(
        x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["val"] = torch.empty(2, 8, 5, 6)
    if torch.backends.mkldnn.is_available():
        assert _wants_channels_last(gm, is_inference=True)
    assert not _wants_channels_last(gm, is_inference=False)  # a CPU training graph
    with config.patch({"layout_optimization_training": True}):
        assert not _wants_channels_last(gm, is_inference=False)  # still the CPU
        with FakeTensorMode():  # a CUDA graph, as its fake values say (no GPU needed)
            cuda_val = torch.empty(2, 8, 5, 6, device="cuda")
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                node.meta["val"] = cuda_val
        assert _wants_channels_last(gm, is_inference=False)


def test_a_cuda_graph_whose_convolutions_are_rare_keeps_its_layouts():
    """A transformer whose one convolution embeds the patches (ViT): fewer than one convolution per
    300 nodes, so on CUDA the graph is not laid out channels-last (TorchInductor's line); a graph of
    the same convolution with a short tail is. On the CPU oneDNN wants channels-last either way."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tininductor.graph import _wants_channels_last

    def patch_embedding_then(layers):
        def fn(x, w):
            y = torch.ops.aten.convolution.default(x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
            for _ in range(layers):
                y = torch.ops.aten.add.Tensor(torch.ops.aten.mul.Tensor(y, 0.5), 1.0)
            return y
        return torch.fx.symbolic_trace(fn)

    with FakeTensorMode():
        cuda_vals = torch.empty(2, 3, 8, 8, device="cuda"), torch.empty(4, 3, 2, 2, device="cuda")
    for layers, laid_out in ((10, True), (150, False)):
        gm = patch_embedding_then(layers)
        for node, val in zip([n for n in gm.graph.nodes if n.op == "placeholder"], cuda_vals):
            node.meta["val"] = val
        assert _wants_channels_last(gm, is_inference=True) is laid_out, (layers, len(gm.graph.nodes))
        for node, val in zip([n for n in gm.graph.nodes if n.op == "placeholder"], (torch.empty(2, 3, 8, 8),)):
            node.meta["val"] = val  # the same graph on the CPU
        if torch.backends.mkldnn.is_available():
            assert _wants_channels_last(gm, is_inference=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_last_training_gradients(backend):
    m = Bottleneck().train()
    ref = copy.deepcopy(m)
    x = torch.randn(2, 8, 5, 6, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    c = compile_graph(m, [x], backend, force_layout_optimization=True)
    out, want = c(x), ref(x_ref)
    for o, w in zip(out, want):
        torch.testing.assert_close(o, w, rtol=1e-4, atol=1e-5)
    (out[0].sin().sum() + out[1].pow(2).sum()).backward()
    (want[0].sin().sum() + want[1].pow(2).sum()).backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    assert any("(240, 1, 48, 8)" in g.source for g in c.compiled_graphs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_last_buffer_flattened_and_pooled(backend):
    """A channels-last buffer read by a flatten (not a view of its memory: a copy in NCHW order),
    a max pool and a cat along channels."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4 * 4 * 6 + 8 * 2 * 3, 5)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            z = torch.cat([y, y * 2], 1)
            return self.fc(torch.cat([y.flatten(1), nn.functional.max_pool2d(z, 2).flatten(1)], 1))

    m = Net().eval()
    x = torch.randn(2, 3, 4, 6)
    with torch.no_grad():
        c = compile_graph(m, [x], backend, force_layout_optimization=True)
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: a depthwise convolution, then LayerNorm and an MLP over channels-last
    ``(N, H, W, C)`` views (permutes), a layer scale and a residual."""

    def __init__(self, c=8):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.scale = nn.Parameter(torch.rand(c, 1, 1))
        self.out = nn.Conv2d(c, c, 1)

    def forward(self, x):
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.fc2(nn.functional.gelu(self.fc1(y))).permute(0, 3, 1, 2)
        return self.out(self.scale * y + x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_permuted_views_of_channels_last_tensors_stay_contiguous(backend):
    """A pointwise kernel lays its output out in the memory order of what it reads: the LayerNorm of
    a channels-last tensor permuted to ``(N, H, W, C)`` is contiguous, so the Linear layers read it
    without a copy and the normalisation shares a kernel with its statistics; the residual is
    channels-last for the next convolution."""
    m = ConvNeXtBlock().eval()
    x = torch.randn(2, 8, 5, 6)
    with torch.no_grad():
        c = compile_graph(m, [x], backend, force_layout_optimization=True)
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    nhwc_transposed = "(240, 1, 40, 5)"  # (N, H, W, C) = (2, 5, 6, 8) laid out as if H were the channels
    assert nhwc_transposed not in c.source, c.source
    assert "(240, 1, 48, 8)" in c.source  # the residual sum, channels-last for the 1x1 convolution
    assert len(c.kernels) == 4, c.kernels  # input to channels-last, LayerNorm, bias + gelu, scale + residual


@pytest.mark.parametrize("backend", BACKENDS)
def test_convolution_bias_added_by_the_consumer(backend):
    """``split_conv_bias`` (on for GPUs, forced here): the convolutions run without their bias and
    each bias is added inside the kernel that reads the output, values as eager's."""
    m = ConvNeXtBlock().eval()
    x = torch.randn(2, 8, 5, 6)
    with torch.no_grad():
        c = compile_graph(m, [x], backend, force_layout_optimization=True, force_split_conv_bias=True)
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    calls = [line for line in c.source.splitlines() if "torch.convolution(" in line]
    # the depthwise bias joins the LayerNorm's kernel; the last convolution's output only leaves the
    # graph, so cuDNN adds its bias (a kernel of its own would be one more pass over it)
    assert len(calls) == 2 and ", None, [1, 1]" in calls[0] and ", None, [1, 1]" not in calls[1], calls
    assert len(c.kernels) == 4, c.kernels


class DenseLayers(nn.Module):
    """DenseNet's pattern: each layer normalises the concatenation of every earlier feature map and
    convolves it; the cat is the next convolution's input."""

    def __init__(self, c=8, layers=4):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.norms = nn.ModuleList(nn.BatchNorm2d(c * (i + 1)) for i in range(layers))
        self.convs = nn.ModuleList(nn.Conv2d(c * (i + 1), c, 3, padding=1) for i in range(layers))
        self.transition = nn.Conv2d(c * (layers + 1), c, 1)

    def forward(self, x):
        features = [self.stem(x)]
        for norm, conv in zip(self.norms, self.convs):
            features.append(conv(torch.relu(norm(torch.cat(features, 1)))))
        block = torch.cat(features, 1)  # read twice: stored once, by a kernel of its own
        return self.transition(block), block.amax([2, 3])


@pytest.mark.parametrize("backend", BACKENDS)
def test_cat_of_channels_last_tensors_is_channels_last(backend):
    """A cat reads each input at ``(j - start) % n`` along the joined dim; that walks memory as ``j``
    does, so the cat of channels-last convolution outputs is laid out channels-last too: its kernel
    reads and writes in memory order, and the next convolution takes it without a copy."""
    m = DenseLayers().eval()
    x = torch.randn(2, 3, 5, 6)
    with torch.no_grad():
        c = compile_graph(m, [x], backend, force_layout_optimization=True)
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    # the block's cat of 5 feature maps, (2, 40, 5, 6), stored once, as (N, H, W, C): not in NCHW
    # and then copied to channels-last for the transition's convolution
    stored = [line for line in c.source.splitlines() if "empty_strided" in line and "(2, 40, 5, 6)" in line]
    assert len(stored) == 1 and "(1200, 1, 240, 40)" in stored[0], stored
