"""The CUDA runtime paths: direct Triton launches and CUDA graphs (mode="reduce-overhead").

These need a GPU (``pytest -m gpu``; the device machine runs them with TINY_TEST_DEVICE=cuda);
everything is checked against eager, call after call, with changing inputs.
"""
from __future__ import annotations

import copy
import sys

import pytest
import torch

import tininductor.compile_fx  # noqa: E402,F401  (the module, not the lazy backend attribute)
import tinydynamo
from tininductor.runtime import cudagraphs  # noqa: E402

compile_fx_module = sys.modules["tininductor.compile_fx"]

pytestmark = pytest.mark.gpu


def chain(x, y):
    return torch.nn.functional.gelu(x * 1.5 + y).softmax(-1) + y.sum(-1, keepdim=True)


def _launchers(compiled):
    from tininductor.runtime.triton_launcher import TritonLauncher

    module = compiled.module if hasattr(compiled, "module") else compiled.fn.module
    return [v for v in vars(module).values() if isinstance(v, TritonLauncher)]


def test_direct_launches_match_eager_and_skip_the_front_door():
    tinydynamo.reset()
    f = tinydynamo.compile(chain)
    x, y = torch.randn(64, 33, device="cuda"), torch.randn(64, 33, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(f(x, y), chain(x, y))
        x, y = torch.randn_like(x), torch.randn_like(y)
    launchers = _launchers(compile_fx_module.compiled_graphs[-1])
    assert launchers and all(l.fast and l._launchers for l in launchers)
    # an input 4 bytes past a 16-byte boundary needs (and gets) its own specialisation
    storage = torch.randn(64 * 33 + 1, device="cuda")
    shifted = storage[1:].view(64, 33)
    torch.testing.assert_close(f(shifted, y), chain(shifted, y))
    assert any(len(l._launchers) == 2 for l in launchers)


def _ready_workers():
    """Start the compile worker pool (once) and wait until a worker is ready; the pool."""
    import time

    from tininductor.runtime import compile_worker

    compile_worker.start_workers()
    deadline = time.time() + 120
    while (compile_worker.compile_workers() is None or compile_worker.compile_workers().ready == 0) \
            and time.time() < deadline:
        time.sleep(0.05)
    workers = compile_worker.compile_workers()
    assert workers is not None and workers.ready > 0
    return workers


def test_kernels_a_worker_compiled_load_without_triton_in_this_process(monkeypatch):
    """With compile workers up, each kernel comes back as a binary (compile_server.KernelBinary):
    the main process only works out the kernel's specialisation with Triton's binder, loads the
    cubin for torch's launcher and has Triton compile or load nothing, and the results are eager's.
    (A misaligned pointer would still go through Triton.)"""
    import triton.runtime.jit as triton_jit

    from tininductor.runtime import compile_worker, static_kernel

    if static_kernel.static_launcher() is None or compile_worker.worker_count() == 0:
        pytest.skip("needs torch's prebuilt launcher and compile worker processes")
    _ready_workers()
    compiled = []  # what Triton compiled or loaded from its cache here (a specialisation alone is None)
    do_compile = triton_jit.JITFunction._do_compile
    monkeypatch.setattr(triton_jit.JITFunction, "_do_compile",
                        lambda self, *args, **kwargs: compiled.append(do_compile(self, *args, **kwargs)) or compiled[-1])
    tinydynamo.reset()
    f = tinydynamo.compile(chain)
    x, y = torch.randn(48, 70, device="cuda"), torch.randn(48, 70, device="cuda")
    torch.testing.assert_close(f(x, y), chain(x, y))
    launchers = _launchers(compile_fx_module.compiled_graphs[-1])
    assert launchers and all(l._launchers for l in launchers)
    assert [kernel for kernel in compiled if kernel is not None] == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reduce_overhead_replays_with_new_inputs(dtype):
    tinydynamo.reset()
    f = tinydynamo.compile(chain, mode="reduce-overhead")
    tol = dict(rtol=2e-3, atol=2e-3) if dtype == torch.float16 else {}
    for step in range(4):
        x = torch.randn(128, 257, device="cuda", dtype=dtype)
        y = torch.randn(128, 257, device="cuda", dtype=dtype)
        torch.testing.assert_close(f(x, y), chain(x, y), **tol)
    runner = compile_fx_module.compiled_graphs[-1]
    assert type(runner).__name__ == "CUDAGraphRunner" and runner.graph is not None
    assert runner.recordings == 1 and runner.disabled is None


def test_reduce_overhead_module_parameters_in_place_and_replaced():
    tinydynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 64)).cuda()
    compiled = tinydynamo.compile(model, mode="reduce-overhead")
    x = torch.randn(32, 64, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        runner = compile_fx_module.compiled_graphs[-1]
        model[1].weight.mul_(0.5)  # an optimizer step: same address, new values
        torch.testing.assert_close(compiled(x), model(x))
        assert runner.recordings == 1
        model[3].weight = torch.nn.Parameter(torch.randn_like(model[3].weight))  # a new address
        # (larger weights: mm + a fused bias add rounds differently from eager's addmm)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        assert compile_fx_module.compiled_graphs[-1].recordings + runner.recordings >= 2


def test_reduce_overhead_outputs_are_overwritten_like_torch_compile():
    tinydynamo.reset()
    f = tinydynamo.compile(lambda x: x * 2, mode="reduce-overhead")
    a, b = torch.ones(8, device="cuda"), torch.full((8,), 3.0, device="cuda")
    first = f(a)
    kept = first.clone()
    second = f(b)
    torch.testing.assert_close(kept, a * 2)
    torch.testing.assert_close(second, b * 2)
    assert first.data_ptr() == second.data_ptr(), "outputs live in the graph's static memory"


def _training_setup(seed=0):
    tinydynamo.reset()
    _first_seq[0] = compile_fx_module._compile_count[0]
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64)).cuda()
    reference = copy.deepcopy(model)
    return model, reference, tinydynamo.compile(model, mode="reduce-overhead")


def _runners():
    """The CUDA graph runners compiled by the current test (tinydynamo.reset() cleared the rest)."""
    graphs = [g for g in compile_fx_module.compiled_graphs
              if type(g).__name__ == "CUDAGraphRunner" and g.seq > _first_seq[0]]
    return {g.kind: g for g in graphs}


_first_seq = [0]


def test_reduce_overhead_training_steps_match_eager():
    model, reference, compiled = _training_setup()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for step in range(5):
        x = torch.randn(32, 64, device="cuda")
        losses = []
        for fn, opt in zip((compiled, reference), opts):
            opt.zero_grad(set_to_none=True)
            loss = fn(x).square().mean()
            loss.backward()
            losses.append(loss.item())
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            assert p.grad.data_ptr() not in cudagraphs._static_output_ptrs, ".grad must not alias graph memory"
        for opt in opts:
            opt.step()
    runners = _runners()
    assert set(runners) == {"forward", "backward"}
    assert runners["forward"].recordings == 1 and runners["forward"].replays == 5
    assert runners["backward"].replays == 5 and runners["backward"].borrowed_ptrs, \
        "the backward graph should read the saved activations in place"


def test_reduce_overhead_two_forwards_before_backward():
    model, reference, compiled = _training_setup(1)
    xs = [torch.randn(16, 64, device="cuda") for _ in range(2)]
    losses = [compiled(x).sum() for x in xs]  # the second forward must not overwrite the first's saved tensors
    for loss in reversed(losses):
        loss.backward()
    for x in xs:
        reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    assert _runners()["forward"].replays == 1


def test_reduce_overhead_second_backward_after_a_new_forward_raises():
    model, reference, compiled = _training_setup(2)
    x = torch.randn(16, 64, device="cuda")
    loss = compiled(x).sum()
    loss.backward(retain_graph=True)
    compiled(torch.randn(16, 64, device="cuda")).sum().backward()  # replays: overwrites the saved tensors
    with pytest.raises(RuntimeError, match="overwritten by a later replay"):
        loss.backward()


def scaled_by_cpu_scalar(x, k):
    """deberta's pattern: a 0-dim CPU tensor made in the graph (``torch.tensor(size)``), and one
    passed in, both joining CUDA ops (eager reads them as scalars)."""
    scale = torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float))
    return (x / scale.to(x.dtype)).sin() * k + torch.where(x > 0, k, x)


@pytest.mark.parametrize("backend", ["aot_eager", "tininductor"])
def test_zero_dim_cpu_tensor_joins_a_cuda_kernel(backend):
    tinydynamo.reset()
    f = tinydynamo.compile(scaled_by_cpu_scalar, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(8, 16, device="cuda", requires_grad=True)
        k = torch.tensor(1.5) + torch.rand(())
        out = f(x, k)
        torch.testing.assert_close(out, scaled_by_cpu_scalar(x, k))
        (g,) = torch.autograd.grad(out.sum(), x)
        (ref,) = torch.autograd.grad(scaled_by_cpu_scalar(x, k).sum(), x)
        torch.testing.assert_close(g, ref)


def shift_right(ids, x):
    """BART's ``shift_tokens_right``: ``out[:, 0] = 2`` lifts the 2 as a 0-dim CPU constant; a CPU
    constant also joins a CUDA kernel (``where``)."""
    out = ids.new_zeros(ids.shape)
    out[:, 1:] = ids[:, :-1].clone()
    out[:, 0] = 2
    return out * 3, torch.where(x > 0, x, torch.tensor(-1.5))


def test_cpu_scalar_constants_keep_the_graph_a_cuda_graph():
    tinydynamo.reset()
    f = tinydynamo.compile(shift_right, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):
        ids, x = torch.randint(3, 100, (4, 16), device="cuda"), torch.randn(4, 16, device="cuda")
        got, want = f(ids, x), shift_right(ids, x)
        torch.testing.assert_close(got, want)
    runner = compile_fx_module.compiled_graphs[-1]
    assert type(runner).__name__ == "CUDAGraphRunner" and runner.disabled is None
    assert runner.recordings == 1 and runner.replays == 4


def test_a_kernel_that_does_not_compile_falls_back_at_compile_time(monkeypatch):
    """A Triton compile error (raised in the background compile) fails the graph's compile, which
    falls back to eager with a warning, instead of raising at the first call."""
    from concurrent.futures import Future

    from tininductor.runtime import triton_launcher

    def broken(launcher, example_args):
        future = Future()
        future.set_exception(RuntimeError("planted Triton compile error"))
        return future

    def planted(x):  # a kernel no other test compiles (the code cache would hand back its launchers)
        return (x * 3.25).relu() + 1.0625

    monkeypatch.setattr(triton_launcher, "precompile", broken)
    tinydynamo.reset()
    x = torch.randn(64, 35, device="cuda")
    with pytest.warns(UserWarning, match="planted Triton compile error"):
        out = tinydynamo.compile(planted)(x)
    torch.testing.assert_close(out, planted(x))


def test_kernels_compile_in_worker_processes():
    """Once the worker processes are up (runtime/compile_worker.py), a new graph's kernels are
    compiled there and loaded from Triton's disk cache; results equal eager's."""
    workers = _ready_workers()
    before = workers.compiled

    def fresh(x, y):  # kernels no other test compiled
        return (x * 1.8125 - y).tanh().softmax(-1) * y.mean(-1, keepdim=True)

    tinydynamo.reset()
    x, y = torch.randn(96, 40, device="cuda"), torch.randn(96, 40, device="cuda")
    torch.testing.assert_close(tinydynamo.compile(fresh)(x, y), fresh(x, y))
    assert workers.compiled > before


def test_reduce_overhead_records_once_per_size_under_dynamic_shapes():
    tinydynamo.reset()
    f = tinydynamo.compile(chain, mode="reduce-overhead", dynamic=True)
    sizes = [40, 72, 40, 72, 100]
    for n in sizes:  # every size right, each replayed from its own recording
        x, y = torch.randn(n, 33, device="cuda"), torch.randn(n, 33, device="cuda")
        torch.testing.assert_close(f(x, y), chain(x, y))
    runner = compile_fx_module.compiled_graphs[-1]
    assert type(runner).__name__ == "CUDAGraphRunner" and runner.dynamic
    assert runner.recordings == len(set(sizes))
