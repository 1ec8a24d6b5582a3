"""Dynamic shapes through tininductor: one compile serves every size.

``torch.compile(fn, dynamic=True, backend=...)`` hands the backend a graph with SymInt
placeholders and fake tensors with symbolic sizes. AOT autograd traces it symbolically, the
loop IR's sizes are sympy expressions over the size symbols, kernels take the sizes as
arguments and the wrapper computes them from its inputs: a sweep over lengths must compile
tininductor once (counted by a wrapper around the backend) and match eager, values and
gradients, on the C++ backend and on Triton (the interpreter on a CPU machine).
"""
import logging

import pytest
import torch
import torch.nn.functional as F

import tininductor
from tininductor.compile_fx import compile_fx
from tininductor.testing import DEVICE, patch_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def specialize_floats():
    """torch.compile(dynamic=True) passes float attributes (LayerNorm's eps) as 0-d tensors read with
    ``.item()``, a data-dependent value tininductor does not compile (the graph would run eagerly):
    specialise them, as tinydynamo does."""
    with torch._dynamo.config.patch(specialize_float=True):
        yield

BACKENDS = ["cpp", "triton"] if DEVICE == "cpu" else ["triton"]
LENGTHS = (3, 5, 8, 13)


class CompileCounter:
    """The tininductor backend, counting its compiles and keeping the last generated sources."""

    def __init__(self):
        self.frame_count = 0
        self.sources: list[str] = []

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        compiled = compile_fx(gm, example_inputs)
        self.sources += [g.source for g in getattr(compiled, "compiled_graphs", [])]
        return compiled


def sweep(fn, make_inputs, backend, lengths=LENGTHS, grad=True, atol=1e-5, rtol=1e-4, symbolic=True):
    """Run ``fn`` compiled with dynamic=True over ``lengths``; compare with eager; return the counter."""
    counter = CompileCounter()
    torch._dynamo.reset()
    with patch_config(tininductor.config, fallback_to_eager=False, cpu_backend=backend):
        compiled = torch.compile(fn, dynamic=True, backend=counter)
        for n in lengths:
            torch.manual_seed(n)
            inputs = make_inputs(n)
            ours = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
            out = compiled(*ours)
            ref = fn(*inputs)
            torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)
            if grad:
                out.sum().backward()
                ref.sum().backward()
                for a, b in zip(ours, inputs):
                    if b.requires_grad:
                        torch.testing.assert_close(a.grad, b.grad, atol=atol, rtol=rtol)
    if symbolic:
        assert counter.sources, "tininductor compiled nothing (the graph ran eagerly)"
    assert counter.frame_count == dynamo_frames(fn, make_inputs, lengths) == 1 or \
        counter.frame_count == dynamo_frames(fn, make_inputs, lengths), \
        f"compiled {counter.frame_count} times over lengths {lengths}"
    return counter


def dynamo_frames(fn, make_inputs, lengths) -> int:
    """How many graphs TorchDynamo itself makes over ``lengths`` (a guard on a size can split the
    sweep, whatever the backend): tininductor must compile no more often."""
    from torch._dynamo.testing import CompileCounter as TorchCounter

    torch._dynamo.reset()
    counter = TorchCounter()
    compiled = torch.compile(fn, dynamic=True, backend=counter)
    for n in lengths:
        compiled(*make_inputs(n))
    return counter.frame_count


def rand(*size, grad=True):
    return torch.randn(*size, device=DEVICE, requires_grad=grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pointwise_chain(backend):
    counter = sweep(lambda x, y: (x.sin() * y + 1).relu() * x.shape[0], lambda n: [rand(n, 7), rand(n, 7)], backend)
    source = counter.sources[0]
    assert "empty_strided_" in source and "s" in source
    assert not any(f"({n}, 7)" in source for n in LENGTHS)  # sizes are symbols in the wrapper


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_and_log_softmax_over_dynamic_row(backend):
    sweep(lambda x: torch.softmax(x, -1) + torch.log_softmax(x * 2, -1), lambda n: [rand(4, n)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm(backend):
    sweep(lambda x, w, b: F.layer_norm(x, (16,), w, b), lambda n: [rand(n, 16), rand(16), rand(16)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_over_dynamic_dim(backend):
    sweep(lambda x: F.layer_norm(x, (x.shape[-1],)), lambda n: [rand(3, n)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reshape_by_sizes(backend):
    def fn(x):
        b, t, c = x.shape
        y = x.reshape(b * t, c).sin()
        return y.view(b, t, 2, c // 2).transpose(1, 2).reshape(b, 2, t * (c // 2)).cos()

    sweep(fn, lambda n: [rand(2, n, 8)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["attention", "cumsum"])
def test_library_kernel_output_layout_follows_our_buffers(backend, op):
    """A library call's output strides follow its input's (attention keeps a transposed query's
    layout, cumsum any dense layout). Eager's ``x * 2`` on a transposed view is transposed too,
    our buffer for it is not: the output layout must come from our buffers, with symbolic sizes
    as with static ones (nanoGPT-style attention in Llama read the wrong elements at a new length)."""
    def fn(x):
        b, t, c = x.shape
        q = x.view(b, t, 2, c // 2).transpose(1, 2) * 2 + 1
        o = F.scaled_dot_product_attention(q, q, q) if op == "attention" else torch.cumsum(q, -1)
        return o.transpose(1, 2).reshape(b, t, c).sin()

    sweep(fn, lambda n: [rand(2, n, 8, grad=False)], backend, grad=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_from_a_symbolic_start_and_its_gradient(backend, caplog):
    """The last rows (``x[:, n - 3:]``, GPT-2's causal-mask slice) and the rows at an index from
    ``arange(n - 3, n)``: their gradients put values at places that start at a size expression,
    which the kernel computes from its size arguments (a per-shape compile before)."""
    def fn(x):
        n = x.shape[1]
        return x[:, n - 3:].sin() * 2 + x[:, torch.arange(n - 3, n, device=x.device)].cos()

    with caplog.at_level(logging.WARNING, logger="tininductor.aot_autograd"):
        sweep(fn, lambda n: [rand(2, n, 4)], backend, lengths=(5, 7, 9))
    assert "per concrete shape" not in caplog.text


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_and_its_gradient(backend, caplog):
    """F.pad (constant) forward and backward at every length from one symbolic graph: its gradient
    is a crop, done with slices (eager's negative padding needs concrete sizes to decompose)."""
    with caplog.at_level(logging.WARNING, logger="tininductor.aot_autograd"):
        sweep(lambda x: F.pad(x, (1, 2, 0, 3)).sin() + F.pad(x, (-1, 2)).sum(), lambda n: [rand(2, n, 5)], backend,
              lengths=(4, 6, 9))
    assert "per concrete shape" not in caplog.text


@pytest.mark.parametrize("backend", BACKENDS)
def test_sum_and_mean_over_dynamic_dim(backend):
    sweep(lambda x: x.sum(0) * 2 + x.mean(0) + x.exp().mean(), lambda n: [rand(n, 6)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_with_dynamic_dim(backend):
    sweep(lambda x, w: torch.tanh(x @ w) @ w.t(), lambda n: [rand(n, 8), rand(8, 8)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_size_one_dims(backend):
    """Size-1 dims are specialised by Dynamo (0/1 specialisation) and stay correct."""
    sweep(lambda x, y: torch.softmax(x + y, -1), lambda n: [rand(1, n), rand(n, 1, n)], backend, lengths=(2, 4, 7))


class Block(torch.nn.Module):
    """A small transformer block: LayerNorm, causal SDPA attention, MLP."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


@pytest.mark.parametrize("backend", BACKENDS)
def test_transformer_block_forward_backward(backend):
    torch.manual_seed(0)
    eager = Block().to(DEVICE)
    ours = Block().to(DEVICE)
    ours.load_state_dict(eager.state_dict())
    counter = CompileCounter()
    torch._dynamo.reset()
    with patch_config(tininductor.config, fallback_to_eager=False, cpu_backend=backend):
        compiled = torch.compile(ours, dynamic=True, backend=counter)
        for t in (3, 6, 9):
            x = torch.randn(2, t, 16, device=DEVICE)
            for m in (eager, ours):
                m.zero_grad()
            out, ref = compiled(x), eager(x)
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
            out.pow(2).mean().backward()
            ref.pow(2).mean().backward()
            for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
                torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    assert counter.frame_count == 1
    assert len(counter.sources) == 2, "forward and backward compiled by tininductor"


def test_dynamic_graph_is_not_specialised_per_shape(caplog):
    """The symbolic path compiles the graph's forward and backward once, not once per shape."""
    from tininductor import compile_fx as cfx

    torch._dynamo.reset()
    before = cfx._compile_count[0]
    with caplog.at_level(logging.WARNING, logger="tininductor.aot_autograd"):
        sweep(lambda x: torch.softmax(x, -1) * 3, lambda n: [rand(2, n)], "cpp" if DEVICE == "cpu" else "triton")
    assert cfx._compile_count[0] - before == 2  # forward + backward, for all four lengths
    assert "per concrete shape" not in caplog.text


def test_wrapper_binds_sizes_in_plain_python():
    """The wrapper reads each size symbol from its arguments once and uses Python arithmetic."""
    counter = sweep(lambda x: (x * 2).sum(-1), lambda n: [rand(3, n, grad=False)],
                    "cpp" if DEVICE == "cpu" else "triton", grad=False)
    call = counter.sources[0].split("def call(args):")[1].split("def get_args")[0]
    assert "sympy" not in call
    assert "empty_strided_" in call


def test_symbolic_view_of_input_output_is_compiled_once(caplog):
    """An output that is a view of an input is rebuilt with sizes from the call's input sizes: one
    symbolic compile, no per-shape fallback (test_view_outputs_are_rebuilt_at_each_size has more)."""
    with caplog.at_level(logging.WARNING, logger="tininductor.aot_autograd"):
        sweep(lambda x: x.view(-1), lambda n: [rand(n, 2, grad=False)], "cpp" if DEVICE == "cpu" else "triton",
              grad=False)
    assert "per concrete shape" not in caplog.text


def test_one_code_cache_entry_for_every_size():
    """The wrapper module (the code cache's key) is the same whatever size the compile saw first."""
    backend = "cpp" if DEVICE == "cpu" else "triton"
    sources = []
    for n in (3, 11):
        counter = sweep(lambda x: torch.softmax(x, -1).sum(0), lambda _: [rand(5, n, grad=False)], backend,
                        lengths=(n,), grad=False)
        sources.append(counter.sources[0])
    assert sources[0] == sources[1]
    assert "11" not in sources[0].split("def call(args):")[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpt_over_sequence_lengths(backend):
    """The course GPT (manual causal softmax over T, a sliced mask buffer, wpe(arange(T))) trains
    over sequence lengths with one compile, losses and gradients equal to eager."""
    from course.models import GPT

    torch.manual_seed(0)
    eager, ours = GPT(n_layer=1, n_embd=16).to(DEVICE), GPT(n_layer=1, n_embd=16).to(DEVICE)
    ours.load_state_dict(eager.state_dict())
    counter = CompileCounter()
    torch._dynamo.reset()
    with patch_config(tininductor.config, fallback_to_eager=False, cpu_backend=backend):
        compiled = torch.compile(ours, dynamic=True, backend=counter)
        for t in (3, 6, 8):
            idx = torch.randint(0, 64, (2, t), device=DEVICE)
            for m in (eager, ours):
                m.zero_grad()
            loss, ref = compiled(idx, idx.roll(1, 1))[1], eager(idx, idx.roll(1, 1))[1]
            torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-4)
            loss.backward()
            ref.backward()
            for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
                torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    assert counter.frame_count == 1
    assert len(counter.sources) == 2


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton backend not tested here")
def test_triton_reduction_picks_persistent_or_looped_per_call():
    """A symbolic row length: the wrapper picks the persistent kernel (blocks from the actual
    length) for short rows and the looped one for long rows, at each call."""
    with patch_config(tininductor.config.triton, persistent_reduction_max=8):
        counter = sweep(lambda x: torch.log_softmax(x, -1), lambda n: [rand(3, n)], "triton", lengths=(3, 8, 9, 20))
    source = counter.sources[0]
    assert "triton_per_" in source and "triton_red_" in source
    assert ".run_rows(" in source and " <= 8 else " in source


@pytest.mark.parametrize("frontend", ["torch", "tiny"])
def test_constant_tensor_made_in_the_graph_compiles_symbolically(frontend, caplog):
    """``torch.tensor(...)`` inside the function is a real constant in the trace (BART's attention
    makes one): the symbolic trace, forward and joint graph, takes it, instead of compiling per shape."""
    import tinydynamo

    def fn(x):
        return x * torch.tensor(2.0, device=x.device) + torch.tensor([1.0, 2.0, 3.0], device=x.device).sum() * x.shape[0]

    torch._dynamo.reset()
    tinydynamo.reset()
    counter = CompileCounter()
    compile_ = torch.compile if frontend == "torch" else tinydynamo.compile
    compiled = compile_(fn, dynamic=True, backend=counter)
    with caplog.at_level(logging.WARNING, logger="tininductor.aot_autograd"), \
            patch_config(tininductor.config, fallback_to_eager=False):
        for n in (3, 5, 8):
            x, x2 = rand(n, 4), rand(n, 4)
            with torch.no_grad():
                x2.copy_(x)
            out, ref = compiled(x), fn(x2)
            torch.testing.assert_close(out, ref)
            out.sum().backward()
            ref.sum().backward()
            torch.testing.assert_close(x.grad, x2.grad)
    assert "per concrete shape" not in caplog.text
    assert counter.frame_count == 1 and len(counter.sources) == 2  # forward and backward


def test_per_shape_compile_error_runs_that_shape_eagerly():
    """A per-shape compile happens inside the call, after TorchDynamo's chance to fall back: when
    it fails too (an op with no VJP rule), that shape's graph runs eagerly with a warning instead
    of raising into the user's code."""
    from tininductor.aot_autograd import aot_autograd

    def never(gm, example_inputs):
        raise NotImplementedError("this compiler compiles nothing")

    torch._dynamo.reset()
    fn = torch.compile(lambda x: x.sin() * 2, dynamic=True, backend=aot_autograd(never))
    for n in (3, 5):
        x = torch.randn(n, requires_grad=True)
        with pytest.warns(UserWarning, match="for these shapes.*compiles nothing"):
            out = fn(x)
        torch.testing.assert_close(out, x.sin() * 2)
        out.sum().backward()
        torch.testing.assert_close(x.grad, 2 * x.cos())


def test_symbolic_compile_error_falls_back_to_per_shape(caplog):
    """A compiler that cannot handle the symbolic graph makes AOT autograd compile per concrete
    shape (logged with the reason) instead of running eagerly."""
    from tininductor.aot_autograd import aot_autograd

    shapes = []

    def static_only(gm, example_inputs):
        if any(isinstance(x, torch.SymInt) for x in example_inputs):
            raise NotImplementedError("this compiler takes static shapes only")
        shapes.append([tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)])
        return gm

    torch._dynamo.reset()
    fn = torch.compile(lambda x: x.sin() * 2, dynamic=True, backend=aot_autograd(static_only))
    with caplog.at_level(logging.WARNING, logger="tininductor.aot_autograd"):
        for n in (3, 5):
            x = torch.randn(n)
            torch.testing.assert_close(fn(x), x.sin() * 2)
    assert "per concrete shape" in caplog.text and "static shapes only" in caplog.text
    assert shapes == [[(3,)], [(5,)]]


def test_contiguous_access_over_symbolic_sizes_indexes_by_xindex():
    """A pointwise kernel over a contiguous (batch, seq, hidden) view with symbolic batch and seq
    loads and stores at ``xindex`` (indexing.join_dimensions): no division by a runtime size per
    element, and no size argument it does not use; the broadcast bias still reads at
    ``xindex % hidden``. Values equal eager at every length."""
    import re

    def fn(x, w, b):
        return torch.nn.functional.gelu(x @ w + b)

    counter = sweep(fn, lambda n: (torch.randn(2, n, 16, device=DEVICE), torch.randn(16, 24, device=DEVICE),
                                   torch.randn(24, device=DEVICE)), "triton", grad=False)
    source = counter.sources[-1]
    kernel = source[source.index("@triton.jit"):source.index("def call")]
    assert re.search(r"tl\.load\(in_ptr\d \+ \(xindex\)", kernel), kernel
    assert re.search(r"tl\.store\(out_ptr0 \+ \(xindex\)", kernel), kernel
    assert re.search(r"= \(xindex % (24|s\d+)\)", kernel), kernel  # the bias: the last dimension
    assert "//" not in kernel, kernel
    signature, body = kernel.split("):", 1)
    assert all(re.search(rf"\b{s}\b", body) for s in re.findall(r"\bs\d+\b", signature)), kernel


def _views(x, y):
    a = x.transpose(0, 1)
    b = x[1:, : x.shape[1] - 1]
    c = (y * 2).view(-1, 2)
    return a, b, c, y.chunk(2, 0)[1]


@pytest.mark.parametrize("frontend", ["torch", "tiny"])
def test_view_outputs_are_rebuilt_at_each_size(frontend, caplog):
    """Outputs that are views of an input or of another output are rebuilt after the call
    (``as_strided``) with sizes, strides and offsets computed from this call's input sizes: one
    symbolic compile serves every size (it was compiled per shape), and each output is the same
    view as eager's (shape, strides, shared storage). ``chunk`` guards on its number of pieces only."""
    import tinydynamo

    torch._dynamo.reset()
    tinydynamo.reset()
    counter = CompileCounter()
    compile_ = torch.compile if frontend == "torch" else tinydynamo.compile
    compiled = compile_(_views, dynamic=True, backend=counter)
    with caplog.at_level(logging.WARNING, logger="tininductor.aot_autograd"), \
            patch_config(tininductor.config, fallback_to_eager=False):
        for n in (4, 6, 9):
            x, y = rand(n, n + 1, grad=False), rand(2 * n, 3, grad=False)
            out, ref = compiled(x, y), _views(x, y)
            for o, r in zip(out, ref):
                assert o.shape == r.shape and o.stride() == r.stride() and o.storage_offset() == r.storage_offset()
                torch.testing.assert_close(o, r)
            assert out[0].data_ptr() == x.data_ptr() and out[1].untyped_storage().data_ptr() == x.data_ptr()
    assert "per concrete shape" not in caplog.text
    assert counter.frame_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["conv_stride2", "max_pool"])
def test_strided_convolution_and_pooling_over_symbolic_sizes(op, backend, caplog):
    """A strided convolution's (or pooling's) output strides are ``Max(1, (h - k)//2 + 1)``: the
    wrapper computes them with Python's max and Triton kernels index with its builtin max, so one
    graph serves every image size."""
    w = torch.randn(4, 3, 3, 3, device=DEVICE, requires_grad=True)
    fn = {"conv_stride2": lambda x: F.conv2d(x, w, stride=2).relu(),
          "max_pool": lambda x: F.max_pool2d(x, 2) * 2}[op]
    with caplog.at_level(logging.WARNING, logger="tininductor.aot_autograd"):
        sweep(fn, lambda n: [rand(2, 3, n, n + 1)], backend, lengths=(8, 11, 16))
    assert "per concrete shape" not in caplog.text
