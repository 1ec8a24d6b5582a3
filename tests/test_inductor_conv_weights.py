"""Convolution weights under layout optimization (forced here, where there is no GPU): a weight that
is a parameter and not channels-last is converted once by ``runtime/conv_weights.channels_last_weight``
and the copy reused across calls while the parameter is unchanged, instead of by the library
convolution inside every call. Values against eager; copies counted by the helper and by
``torch.profiler``."""
import collections
import gc
import importlib
import re
import weakref

import pytest
import torch
from torch import nn
from torch.profiler import profile

import tinydynamo
from tininductor import config
from tininductor.runtime import conv_weights
from tininductor.runtime.conv_weights import channels_last_weight
from tininductor.testing import compile_graph, patch_config

compile_fx = importlib.import_module("tininductor.compile_fx")  # the module (the package exports the function)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def fresh():
    torch.manual_seed(0)
    conv_weights.clear()
    tinydynamo.reset()
    yield
    tinydynamo.reset()


class BasicBlock(nn.Module):
    """ResNet's basic block with a 1x1 projection: two 3x3 weights to convert, one 1x1 weight that is
    channels-last as stored, batch norms, a residual add."""

    def __init__(self, c=4):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * c)
        self.conv2, self.bn2 = nn.Conv2d(2 * c, 2 * c, 3, padding=1, bias=False), nn.BatchNorm2d(2 * c)
        self.down = nn.Conv2d(c, 2 * c, 1, stride=2, bias=False)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


def host_ops(fn, *args) -> collections.Counter:
    """ATen ops one call of ``fn`` runs on the host."""
    with profile() as prof:
        fn(*args)
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def compiled_block(backend="cpp", **options):
    m = BasicBlock().eval()
    x = torch.randn(2, 4, 6, 6)
    with patch_config(config, force_layout_optimization=True, cpu_backend=backend,
                      fallback_to_eager=False, **options):
        c = tinydynamo.compile(m, backend="tininductor", dynamic=False, fullgraph=True)
        with torch.no_grad():
            c(x)
    return m, c, x


def output_code() -> str:
    """The wrapper module of the graph compiled last."""
    return compile_fx.compiled_graphs[-1].source


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_weight_converted_once_not_per_call(backend):
    m, c, x = compiled_block(backend)
    source = output_code()
    body = source[source.index("def call(args):"):]
    helper_calls = re.findall(r"(\w+) = channels_last_weight\((\w+)\)", body)
    assert len(helper_calls) == 2, body  # the two 3x3 weights; the 1x1 one is already channels-last
    convs = re.findall(r"torch\.convolution\(\w+, (\w+),", body)
    assert len(convs) == 3
    assert {name for name, _ in helper_calls} <= set(convs)  # each convolution reads the converted copy
    assert "from tininductor.runtime.conv_weights import channels_last_weight" in source
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
        assert conv_weights.stats["copy"] == 2  # at the first call only
        ops = host_ops(c, x)
    assert conv_weights.stats["copy"] == 2
    # (the Triton interpreter copies its kernels' arguments: ``copy_`` counts only on the C++ backend)
    assert not {"aten::contiguous", "aten::clone"} & set(ops), ops
    assert backend == "triton" or "aten::copy_" not in ops, ops


def test_the_library_convolution_converts_per_call_without_the_cache():
    """What the cache saves: without it the convolution converts each 3x3 weight in every call."""
    m, c, x = compiled_block(cache_conv_weights=False)
    assert "channels_last_weight" not in output_code()
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
        assert host_ops(c, x)["aten::contiguous"] == 2


def test_inplace_updates_are_seen():
    """optimizer.step(), an in-place op under no_grad and ``copy_`` bump the weight's version counter;
    ``p.data = other`` moves its data pointer: each makes a fresh copy, and outputs follow eager."""
    m, c, x = compiled_block()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)

    def check():
        with torch.no_grad():
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)

    for p in m.parameters():
        p.grad = torch.randn_like(p)
    copies = conv_weights.stats["copy"]
    opt.step()
    check()
    assert conv_weights.stats["copy"] == copies + 2
    with torch.no_grad():
        m.conv1.weight.mul_(-2)
    check()
    with torch.no_grad():
        m.conv2.weight.copy_(torch.randn_like(m.conv2.weight))
    check()
    m.conv1.weight.data = torch.randn_like(m.conv1.weight)
    check()
    assert conv_weights.stats["copy"] == copies + 5


def test_replaced_parameter_is_seen():
    m, c, x = compiled_block()
    m.conv2.weight = nn.Parameter(torch.randn_like(m.conv2.weight))
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)


def test_helper_keys_on_identity_version_and_pointer():
    w = torch.randn(8, 4, 3, 3)
    first = channels_last_weight(w)
    assert first.is_contiguous(memory_format=torch.channels_last) and torch.equal(first, w)
    assert channels_last_weight(w) is first  # reused
    other = w.clone()
    assert channels_last_weight(other) is not first  # another tensor, its own copy
    w.add_(1)
    again = channels_last_weight(w)
    assert again is not first and torch.equal(again, w)
    w.data = torch.randn(8, 4, 3, 3)
    assert torch.equal(channels_last_weight(w), w)
    assert conv_weights.stats["copy"] == 4


def test_helper_holds_weights_weakly():
    """A dead weight's entry and copy go with it: the cache never keeps a model alive."""
    w = torch.randn(8, 4, 3, 3, requires_grad=True)
    copy = weakref.ref(channels_last_weight(w))
    assert not channels_last_weight(w).requires_grad  # no autograd graph kept with the copy
    assert len(conv_weights._cache) == 1
    del w
    gc.collect()
    assert len(conv_weights._cache) == 0 and copy() is None


def test_inference_tensor_weight_is_converted_each_time():
    with torch.inference_mode():
        w = torch.randn(8, 4, 3, 3)
    assert torch.equal(channels_last_weight(w), w)
    assert len(conv_weights._cache) == 0


def test_frozen_weight_converted_at_compile_time():
    """Freezing makes the weights constants: the channels-last copy is made once, at compile time."""
    m = BasicBlock().eval()
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        c = compile_graph(m, [x], "cpp", force_layout_optimization=True, freezing=True)
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
        ops = host_ops(c, x)
    assert "channels_last_weight" not in c.source
    assert "aten::contiguous" not in ops, ops
