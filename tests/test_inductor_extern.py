"""Extern kernels (mm/bmm/addmm), fallbacks with logged reasons, the LayerNorm-MLP block, the wrapper."""
import logging
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from course.chapters.ch07_loop_ir import lower_and_schedule
from tininductor.graph import _fake_call_key
from tininductor.ir import InputBuffer, Layout
from tininductor.testing import DEVICE, check, compile_graph
from tinydynamo.exc import EagerFallbackWarning

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def rand(*size):
    return torch.randn(size, device=DEVICE)


class Block(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear, with a residual."""

    def __init__(self, d=16, h=32):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def test_mm_bmm_are_extern_calls():
    c = check(lambda a, b, c: (a @ b + 1, torch.bmm(c, c.transpose(1, 2)).relu()), rand(4, 5), rand(5, 3), rand(2, 3, 4),
              atol=1e-5, rtol=1e-5)
    assert "torch.mm(" in c.source and "torch.bmm(" in c.source
    assert "extern by design" in c.source


def test_layernorm_mlp_block_forward_kernel_count():
    block = Block().to(DEVICE)
    with torch.no_grad():
        c = check(block, rand(2, 3, 16), atol=1e-5, rtol=1e-4)
    matmuls = c.source.count("torch.addmm(") + c.source.count("torch.mm(")
    assert matmuls == 2, c.source
    assert len(c.kernels) <= 3, c.kernels


def test_fallback_logs_reason(caplog):
    with caplog.at_level(logging.INFO, logger="tininductor.lowering"):
        c = check(lambda x: torch.cumprod(x, 0) * 2, rand(5, 3))
    assert any("no lowering" in r.message for r in caplog.records)
    assert any("cumprod" in r for r in c.fallback_reasons)


def test_fallback_with_views_and_tuple_outputs():
    check(lambda x: torch.sort(x.t() + 1, dim=-1)[0] * 2, rand(4, 6))


def test_compile_error_falls_back_to_eager_with_warning():
    import tininductor

    def f(x):
        return x + 1

    gm = torch.fx.symbolic_trace(f)
    with pytest.warns(EagerFallbackWarning, match="running it eagerly"):
        fn = tininductor.compile_fx(gm, [3])  # a non-tensor input is unsupported
    assert fn(3) == 4


def test_wrapper_module_runs_standalone(tmp_path):
    c = compile_graph(lambda x, y: (x * y).sum(-1), [rand(4, 8), rand(4, 8)])
    path = tmp_path / "dump.py"
    path.write_text(c.source)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, str(path), "2"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ms per call" in out.stdout


def test_output_code_log_and_artifacts():
    from tinydynamo import artifacts, logs

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logs.get_logger("output_code")
    logs.set_logs(output_code=True)
    logger.addHandler(handler)
    try:
        with artifacts.collecting("f") as arts:
            compile_graph(lambda x: x.cos() + 1, [rand(3)])
    finally:
        logger.removeHandler(handler)
        logs.set_logs(output_code=False)
    assert any("def call(args):" in r.getMessage() for r in records)
    assert arts.get("ir") and arts.get("kernels") and arts.get("output_code")
    assert re.search(r"(triton_poi|cpp)_fused_cos_add_0", arts.get("kernels")[0][0])


def test_extern_output_layout_follows_the_device_kernel():
    """A convolution of a channels-last input gives a channels-last output on CPU and CUDA (its meta
    kernel says contiguous): the kernel that reads the output must index it by the real strides.
    ConvNeXt's downsample (LayerNorm over channels, permuted back) followed by a depthwise conv
    and another LayerNorm was wrong by ~0.5 when layouts came from meta tensors."""
    c = 8
    w_down, b_down, w_dw = rand(2 * c, c, 2, 2), rand(2 * c), rand(2 * c, 1, 3, 3)
    ln_w, ln_b = rand(2 * c), rand(2 * c)

    def f(x):
        y = F.layer_norm(x.permute(0, 2, 3, 1), (c,)).permute(0, 3, 1, 2)  # channels-last values
        y = F.conv2d(y, w_down, b_down, stride=2)
        y = F.conv2d(y, w_dw, padding=1, groups=2 * c)
        return F.layer_norm(y.permute(0, 2, 3, 1), (2 * c,), ln_w, ln_b)

    check(f, rand(2, c, 8, 8), atol=1e-4, rtol=1e-4)


def test_outputs_keep_the_strides_the_graph_promises():
    """Saved activations come out of the compiled forward with the strides of the forward graph's
    example values, which the backward was compiled for. CPU flash attention lays its output out
    after its query's strides: eager's query is a transposed view, ours a contiguous buffer (the
    rotary-style pointwise op on it is a kernel), so the saved attention output had other strides
    than the backward read it by, and Qwen2/Mistral's o_proj gradients were wrong (by 2e-5 in
    float64, silently)."""
    import tinydynamo

    torch.manual_seed(0)
    proj = torch.nn.Linear(32, 32, bias=False).double()

    def attention(x, w_o):
        b, n, _ = x.shape
        q = (x.view(b, n, 2, 16).transpose(1, 2) * 1.5 + 0.1)  # a pointwise kernel writes the query
        kv = x.view(b, n, 2, 16).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, kv, kv, is_causal=True)
        return F.linear(a.transpose(1, 2).reshape(b, n, 32), w_o)

    x = torch.randn(2, 8, 32, dtype=torch.double)
    grads = []
    for fn in (attention, tinydynamo.compile(attention, backend="tininductor")):
        w = proj.weight.detach().clone().requires_grad_()
        fn(x, w).pow(2).mean().backward()
        grads.append(w.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_complex_dtype_ops_run_in_torch_with_a_reason(backend, caplog):
    """Generated kernels have no complex type: an op on complex32/complex64 tensors (``chalf`` and
    its backward's cast of a complex32 gradient) is a fallback with its reason logged, the rest of
    the graph still compiles (was: a Triton launch error, ``KeyError: 'complex32'``)."""
    import tininductor
    import tinydynamo
    from tininductor.testing import patch_config

    if backend == "cpp" and DEVICE != "cpu":
        pytest.skip("the C++ backend runs on the CPU")

    scale = {"cpp": 2.0, "triton": 3.0}[backend]  # another graph per backend: not a cache hit, logs again

    def f(x):
        return (x.sin() * scale).chalf()

    x = rand(3, 4).double().requires_grad_()
    grad = torch.randn(3, 4, dtype=torch.complex64, device=DEVICE).to(torch.complex32)
    expected = f(x)
    (want,) = torch.autograd.grad(expected, x, grad)
    with patch_config(tininductor.config, fallback_to_eager=False, cpu_backend=backend), \
            caplog.at_level(logging.INFO, logger="tininductor.lowering"):
        actual = tinydynamo.compile(f, backend="tininductor")(x)
        (got,) = torch.autograd.grad(actual, x, grad)
    assert actual.dtype == torch.complex32
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(got, want)
    assert any("complex32" in r.message for r in caplog.records)


def test_repeated_extern_calls_run_on_fake_tensors_once():
    """An extern call's output layout comes from running it on fake tensors laid out as its inputs
    are; a model's repeated layers make the same call again, answered from the graph's memo
    (``GraphLowering._fake_outputs``). Another layout, or a scalar of another type, is another
    entry; the results still match eager."""
    def layers(x, w1, w2):
        for _ in range(3):
            x = torch.mm(torch.mm(x, w1).relu(), w2)
        return x, torch.mm(x.t(), x)  # the last: a transposed input, its own entry

    args = [rand(8, 16), rand(16, 16), rand(16, 16)]
    graph, _ = lower_and_schedule(layers, args)
    assert len(graph._fake_outputs) == 2, list(graph._fake_outputs)
    check(layers, *args)

    buf = InputBuffer("a", Layout(torch.device("cpu"), torch.float32, [4, 4], [4, 1]))
    transposed = InputBuffer("b", Layout(torch.device("cpu"), torch.float32, [4, 4], [1, 4]))
    add = torch.ops.aten.add.Tensor
    assert _fake_call_key(add, (buf, 1), {}) != _fake_call_key(add, (buf, 1.0), {})
    assert _fake_call_key(add, (buf, buf), {}) != _fake_call_key(add, (buf, transposed), {})
    assert _fake_call_key(add, (buf, [1, 2]), {}) != _fake_call_key(add, (buf, (1, 2)), {})
    assert _fake_call_key(add, (buf, bytearray(b"no key")), {}) is None  # unhashable: no memo
