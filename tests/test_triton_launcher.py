"""TritonLauncher: direct launches must pass exactly what Triton's front door would.

The fast path only exists with real compiled kernels (CUDA); here a stand-in JIT function and
compiled kernel record what they are called with, so the bookkeeping is checked on any machine.
The GPU run of the whole suite (TINY_TEST_DEVICE=cuda) checks the real thing against eager.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
from tininductor.runtime import static_kernel, triton_launcher  # noqa: E402
from tininductor.runtime.compile_server import KernelBinary  # noqa: E402
from tininductor.runtime.triton_launcher import TritonLauncher  # noqa: E402


class FakeCompiled:
    """Stands in for triton.compiler.CompiledKernel: records C-launcher calls."""

    def __init__(self):
        self.function, self.packed_metadata, self.calls = "fn-handle", "meta", []

    @property
    def run(self):
        return lambda *a: self.calls.append(a)


class FakeJIT:
    """Stands in for a @triton.jit function: ``fn[grid](*args, **kw)`` compiles per alignment."""

    def __init__(self):
        self.front_door, self.compiled = [], {}

    @staticmethod
    def fn(in_ptr0, out_ptr0, xnumel, XBLOCK, RBLOCK):  # the signature the launcher inspects
        pass

    __name__ = "fake_kernel"
    src = "def fake_kernel(in_ptr0, out_ptr0, xnumel, XBLOCK, RBLOCK): ..."
    debug = False

    def __getitem__(self, grid):
        def launch(*args, num_warps, num_stages, **constants):
            key = tuple(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor))
            self.front_door.append((grid, args, constants, num_warps, num_stages))
            return self.compiled.setdefault(key, FakeCompiled())
        return launch


@pytest.fixture
def fast_launcher(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_launcher, "_stream_getters", lambda: (lambda: 0, lambda device: 1234))
    monkeypatch.setattr(static_kernel, "static_launcher", lambda: None)  # Triton's own launchers
    jit = FakeJIT()
    # constexprs given out of signature order: the launcher must order them by the signature
    return jit, TritonLauncher(jit, grid=(7,), num_warps=4, RBLOCK=32, XBLOCK=8)


def test_first_call_goes_through_triton_then_direct(fast_launcher):
    jit, launcher = fast_launcher
    assert launcher.fast
    a, b = torch.randn(64), torch.empty(64)
    launcher.run(a, b, 64)
    assert len(jit.front_door) == 1 and jit.front_door[0][2] == {"RBLOCK": 32, "XBLOCK": 8}
    assert "run" in vars(launcher), "after the first launch, run is the launcher's generated function"
    launcher.run(a, b, 64)
    launcher.run(b, a, 64)
    assert len(jit.front_door) == 1, "later calls with the same alignment must skip Triton's front door"
    (compiled,) = jit.compiled.values()
    assert compiled.calls == [
        (7, 1, 1, 1234, "fn-handle", "meta", None, None, None, a, b, 64, 8, 32),
        (7, 1, 1, 1234, "fn-handle", "meta", None, None, None, b, a, 64, 8, 32),
    ]


def test_new_alignment_is_compiled_by_triton(fast_launcher):
    jit, launcher = fast_launcher
    storage = torch.randn(65)
    aligned, shifted = storage[:64], storage[1:]  # shifted: 4 bytes past a 16-byte boundary
    out = torch.empty(64)
    launcher.run(aligned, out, 64)
    launcher.run(shifted, out, 64)
    assert len(jit.front_door) == 2 and len(jit.compiled) == 2, "an unaligned pointer needs its own kernel"
    launcher.run(shifted, out, 64)
    assert len(jit.front_door) == 2
    assert [len(c.calls) for c in jit.compiled.values()] == [0, 1]


def test_generated_run_keys_each_pointer_by_its_position(fast_launcher):
    """The generated ``run`` computes the same key as the general one: (aligned, shifted) and
    (shifted, aligned) are two variants, each compiled once and then found again."""
    jit, launcher = fast_launcher
    storage = torch.randn(65)
    aligned, shifted = storage[:64], storage[1:]
    for first, second in [(aligned, aligned), (aligned, shifted), (shifted, aligned), (shifted, shifted)] * 2:
        launcher.run(first, second, 64)
    assert len(jit.front_door) == 4 and len(jit.compiled) == 4
    assert [len(c.calls) for c in jit.compiled.values()] == [1, 1, 1, 1]


def test_arguments_known_aligned_are_not_checked(fast_launcher):
    """``assume_aligned(1)``: the wrapper vouches for the output buffer, so the generated ``run``
    keys the launch on the input alone; a shifted input still gets a variant of its own."""
    jit, launcher = fast_launcher
    launcher.assume_aligned(1)
    storage = torch.randn(65)
    aligned, shifted = storage[:64], storage[1:]
    launcher.run(aligned, aligned, 64)
    launcher.run(aligned, shifted, 64)  # (a promise broken on purpose: the check is skipped)
    assert len(jit.front_door) == 1, "the output's alignment must not be checked"
    launcher.run(shifted, aligned, 64)
    assert len(jit.front_door) == 2, "the input's alignment is still checked"


def test_the_wrapper_vouches_for_its_buffers_and_library_outputs():
    """A Triton kernel's arguments that the wrapper allocated, and a library kernel's output (mm),
    are declared aligned; a graph input is not."""
    from tininductor.testing import DEVICE, compile_graph

    def fn(x, w, b):
        y = torch.mm(x, w)
        return ((y + b).relu() * 2).sum(1)

    x, w, b = torch.randn(8, 16, device=DEVICE), torch.randn(16, 16, device=DEVICE), torch.randn(16, device=DEVICE)
    compiled = compile_graph(fn, [x, w, b], backend="triton")
    (launch,) = [line.strip() for line in compiled.source.splitlines() if ".run(" in line]
    assert launch.endswith(".run(buf0, arg2_1, buf1, 8, 16)"), launch  # mm's output, the bias, the output
    assert f"{launch.split('.run')[0]}.assume_aligned(0, 2)" in compiled.source
    torch.testing.assert_close(compiled(x, w, b), fn(x, w, b))


def test_launch_hooks_keep_the_front_door(fast_launcher, monkeypatch):
    jit, launcher = fast_launcher
    a, b = torch.randn(8), torch.empty(8)
    launcher.run(a, b, 8)

    class Knobs:
        launch_enter_hook, launch_exit_hook = (lambda meta: None), None

    monkeypatch.setattr(triton_launcher, "_runtime_knobs", lambda: Knobs)
    launcher._launchers.clear()
    launcher.run(a, b, 8)  # rebuilds the direct launch with the patched knobs
    launcher.run(a, b, 8)
    assert len(jit.front_door) == 3, "a profiler's launch hook must see every launch"


class FakeStaticLauncher:
    """Stands in for torch._C._StaticCudaLauncher: records loads and launches."""

    def __init__(self):
        self.loads, self.launches = [], []

    def _load_kernel(self, path, name, shared, device):
        self.loads.append((path, name, shared, device))
        return "cu-function", 32, 0

    def _launch_kernel(self, *args):
        self.launches.append(args)


def test_static_launcher_passes_what_the_cubin_takes(fast_launcher, monkeypatch):
    """With torch's prebuilt launcher the kernel is compiled (or found) by Triton's warmup, never
    launched through the front door (whose first launch builds a C launcher with gcc), and each
    launch passes the cubin's arguments: pointers as "O", an int as its C type, an int Triton
    folded into the kernel (== 1) left out, a null for the scratch pointer newer Tritons add."""
    jit, _ = fast_launcher
    static = FakeStaticLauncher()
    monkeypatch.setattr(static_kernel, "static_launcher", lambda: static)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    class Fn:
        arg_names = ["in_ptr0", "out_ptr0", "xnumel", "ks0", "XBLOCK", "RBLOCK"]
        constexprs = [4, 5]

    class Src:
        fn = Fn
        signature = {"in_ptr0": "*fp32", "out_ptr0": "*fp16", "xnumel": "i32", "ks0": "constexpr",
                     "XBLOCK": "constexpr", "RBLOCK": "constexpr"}
        constants = {(3,): 1, (4,): 8, (5,): 32}

    class Meta:
        num_warps, shared, num_ctas, global_scratch_size = 4, 256, 1, 0

    compiled = FakeCompiled()
    compiled.src, compiled.metadata, compiled.name = Src, Meta, "fake_kernel"
    compiled.metadata_group = {"fake_kernel.json": "/c/fake_kernel.json", "fake_kernel.cubin": "/c/fake_kernel.cubin"}
    warmups = []
    jit.warmup = lambda *args, grid, **kw: warmups.append((args, grid, kw)) or compiled

    class Mixed(FakeJIT):
        @staticmethod
        def fn(in_ptr0, out_ptr0, xnumel, ks0, XBLOCK, RBLOCK):
            pass

    mixed = Mixed()
    mixed.warmup = jit.warmup
    launcher = TritonLauncher(mixed, grid=(7,), num_warps=4, RBLOCK=32, XBLOCK=8)
    a, b = torch.randn(64), torch.empty(64)
    launcher.run(a, b, 64, 1)
    launcher.run(b, a, 64, 1)
    assert mixed.front_door == [] and len(warmups) == 1
    assert static.loads == [("/c/fake_kernel.cubin", "fake_kernel", 256, 0)]
    assert static.launches == [
        ("cu-function", 7, 1, 1, 4, 256, "OOiO", (a, b, 64, None), 1234),
        ("cu-function", 7, 1, 1, 4, 256, "OOiO", (b, a, 64, None), 1234),
    ]
    # the generated run launches by itself (no closure call) for the first call's alignment...
    launcher._launchers.update({k: None for k in launcher._launchers})
    launcher.run(a, b, 64, 1)
    assert static.launches[-1] == ("cu-function", 7, 1, 1, 4, 256, "OOiO", (a, b, 64, None), 1234)
    # ...and a pointer of another alignment goes to the general path, which compiles its variant
    shifted = torch.randn(65)[1:]
    launcher.run(shifted, b, 64, 1)
    assert len(warmups) == 2 and static.launches[-1][7] == (shifted, b, 64, None)
    # a profiler's launch hook, set after the run was generated, sees the launch (Triton calls it)
    launcher._launchers.clear()
    knobs = triton_launcher._runtime_knobs()
    monkeypatch.setattr(knobs, "launch_enter_hook", lambda metadata: None)
    n = len(static.launches)
    launcher.run(a, b, 64, 1)
    assert len(static.launches) == n and len(mixed.front_door) == 1


def _launcher_with_pool(jit, monkeypatch, pool):
    """A launcher whose kernel is compiled ahead through ``pool`` (standing in for the worker
    processes), and the list of Triton warmups (compiles or cache lookups) made in this process."""
    monkeypatch.setattr(triton_launcher, "compile_workers", lambda: pool)
    monkeypatch.setattr(triton_launcher, "is_generated", lambda path: True)
    monkeypatch.setattr(triton_launcher, "specialization", lambda *args: '{"name": "fake_kernel"}')
    monkeypatch.setattr(triton_launcher, "_started", {})  # (no compile shared with another test's)
    warmups = []
    jit.warmup = lambda *args, grid, **kw: warmups.append(args) or FakeCompiled()
    launcher = TritonLauncher(jit, grid=(7,), num_warps=4, RBLOCK=32, XBLOCK=8,
                              example_args=(torch.float32, torch.float32, 64))
    return launcher, warmups


def test_a_kernel_compiled_ahead_launches_without_triton(fast_launcher, monkeypatch):
    """A worker answers with the kernel's binary (the cubin and its launch facts, picklable): the
    main process loads it in the background, and the first launch with aligned pointers (what the
    example arguments stood for) launches it with no Triton call at all. A misaligned pointer
    is another specialisation: Triton's warmup compiles it."""
    import pickle
    from concurrent.futures import Future

    jit, _ = fast_launcher
    static = FakeStaticLauncher()
    monkeypatch.setattr(static_kernel, "static_launcher", lambda: static)
    binary = KernelBinary("/c/k.cubin", "fake_kernel", "OOiO", (0, 1, 2), 1, 4, 256)
    assert pickle.loads(pickle.dumps(binary)) == binary
    answered: Future = Future()

    class Workers:  # one ready worker that compiled the kernel
        ready = 1

        def submit(self, job, priority, size):
            answered.set_result(binary)
            return answered

    launcher, warmups = _launcher_with_pool(jit, monkeypatch, Workers())
    a, b = torch.randn(64), torch.empty(64)
    launcher.run(a, b, 64)
    assert static.loads == [("/c/k.cubin", "fake_kernel", 256, 0 if torch.cuda.is_available() else None)]
    assert static.launches == [("cu-function", 7, 1, 1, 4, 256, "OOiO", (a, b, 64, None), 1234)]
    assert warmups == [] and jit.front_door == []
    launcher.run(torch.randn(65)[1:], b, 64)  # misaligned: Triton's own specialisation
    assert len(warmups) == 1


@pytest.mark.parametrize("worker_first", [False, True])
def test_a_thread_compiles_a_kernel_while_the_workers_are_starting(fast_launcher, monkeypatch, worker_first):
    """While no worker is ready, a kernel is queued for the pool; once the caller waits for it, a
    thread compiles it here unless a worker has taken it by then: exactly one of them compiles it.
    Before the wait no thread compiles (it would take the GIL from the main thread's compile)."""
    import threading
    from concurrent.futures import Future

    jit, _ = fast_launcher
    queued: Future = Future()
    taken = threading.Event()

    class Starting:  # a pool whose workers are not ready yet
        ready = 0

        def submit(self, job, priority, size):
            if worker_first:  # a worker became ready and took the job at once
                assert queued.set_running_or_notify_cancel()
                taken.set()
            return queued

    launcher, warmups = _launcher_with_pool(jit, monkeypatch, Starting())
    if worker_first:
        assert taken.is_set()
        queued.set_result(None)  # the worker's answer: compiled, no binary (Triton's cache has it)
        launcher._precompiled.result(timeout=30)
        assert not queued.cancelled() and len(warmups) == 1  # found in Triton's cache, not compiled twice
    else:
        time.sleep(0.05)
        assert not queued.cancelled() and warmups == []  # still queued: nobody waits for it yet
        launcher.wait_compiled()
        assert queued.cancelled() and len(warmups) == 1  # the thread compiled it; no worker will


def test_interpreter_and_constexpr_order_disable_the_fast_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not TritonLauncher(FakeJIT(), grid=(1,), num_warps=1, XBLOCK=8, RBLOCK=2).fast

    monkeypatch.delenv("TRITON_INTERPRET")

    class Mixed(FakeJIT):
        @staticmethod
        def fn(in_ptr0, XBLOCK, xnumel):  # a constexpr before a runtime argument
            pass

    assert not TritonLauncher(Mixed(), grid=(1,), num_warps=1, XBLOCK=8).fast
    assert TritonLauncher(FakeJIT(), grid=(1,), num_warps=1, XBLOCK=8, RBLOCK=2).fast


def test_example_args_compile_the_kernel_in_the_background(fast_launcher, monkeypatch):
    """A launcher given example arguments compiles its kernel (Triton's warmup: dtypes stand for
    aligned tensors) and loads it in the compile pool, before its first launch."""
    jit, _ = fast_launcher
    warmups, loaded = [], []

    def warmup(*args, grid, **kwargs):
        warmups.append((args, grid, kwargs))
        compiled = FakeCompiled()
        compiled._init_handles = lambda: loaded.append(True)
        return compiled

    jit.warmup = warmup
    monkeypatch.setenv("TINY_TRITON_PARALLEL_COMPILE", "1")
    launcher = TritonLauncher(jit, grid=(7,), num_warps=4, RBLOCK=32, XBLOCK=8,
                              example_args=(torch.float32, torch.float16, 56))
    launcher._precompiled.result()
    assert warmups == [((torch.float32, torch.float16, 56), (7, 1, 1), {"RBLOCK": 32, "XBLOCK": 8, "num_warps": 4, "num_stages": 1})]
    assert loaded == [True]
    x, y = torch.zeros(56), torch.zeros(56, dtype=torch.float16)
    launcher.run(x, y, 56)  # the first launch waits for it, then goes through Triton (a cache hit there)
    assert launcher._precompiled is None and len(jit.front_door) == 1


def _job(name: str, src: str | None = None):
    """A job for the worker processes that no worker can compile (it has no specialisation)."""
    from tininductor.runtime.compile_server import KernelJob

    return KernelJob("tiny_test", name, src or f"def {name}(x):\n    pass\n", False, "{}", 0)


def test_compile_worker_processes_answer_and_report_errors(tmp_path):
    """The worker pool (runtime/compile_worker.py): a worker starts, takes a job over its pipe and
    answers; a kernel that cannot be compiled comes back as an error the main process raises."""
    import time

    from tininductor.runtime.compile_worker import CompileWorkers

    pool = CompileWorkers(1, archs=[90])
    try:
        deadline = time.time() + 120
        while pool.ready == 0 and time.time() < deadline:
            time.sleep(0.1)
        assert pool.ready == 1
        bad = pool.submit(_job("kernel", src="def kernel(:\n"))
        with pytest.raises(RuntimeError, match="worker process failed: SyntaxError"):
            bad.result(timeout=60)
        again = pool.submit(_job("kernel"))  # no specialisation to compile from
        with pytest.raises(RuntimeError, match="worker process failed"):  # the worker is still alive after an error
            again.result(timeout=60)
    finally:
        pool.close()


OFFLINE_PROBE = """\
import types

import triton
import triton.language as tl


@triton.jit
def tiny_offline_probe(in_ptr, out_ptr, xnumel, XBLOCK: tl.constexpr):
    offsets = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offsets < xnumel
    tl.store(out_ptr + offsets, tl.exp(tl.load(in_ptr + offsets, mask=mask).to(tl.float32)), mask=mask)


tiny_offline_probe = types.SimpleNamespace(fn=tiny_offline_probe)  # what a generated module's launcher offers
"""


# prints Triton's specialisation of the probe (at the path in argv[1]) for device 1, an sm_90 (no GPU needed)
SPECIALIZE_PROBE = """\
import sys

import torch

from tininductor.codecache import PyCodeCache
from tininductor.runtime import compile_server, triton_launcher

source = open(sys.argv[1]).read()
compile_server.offline_driver([80, 90]).set_current_device(1)
fn = PyCodeCache.load(source).tiny_offline_probe.fn
print(triton_launcher.specialization(fn, (torch.bfloat16, torch.float32, 1000), (8, 1, 1), {"XBLOCK": 128},
                                     {"num_warps": 4, "num_stages": 1}, None))
"""


def test_workers_compile_for_a_named_gpu_without_starting_cuda(tmp_path, monkeypatch):
    """Given the devices' architectures, the forking process compiles its warm-up kernel before it
    forks and a worker compiles a job's kernel into a cubin for that architecture, with no GPU
    visible: neither starts CUDA (which each of sixteen workers would otherwise do at the moment
    the first kernels are due), and none imports torch. The job's specialisation is Triton's own
    (``triton_launcher.specialization``, worked out here with Triton's binder)."""
    import json
    import subprocess
    import sys
    import time

    pytest.importorskip("triton.backends.nvidia.driver")
    from tininductor.codecache import PyCodeCache
    from tininductor.runtime.compile_server import KernelJob
    from tininductor.runtime.compile_worker import CompileWorkers

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a worker that asked CUDA for its device would fail
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # (the CPU test run's default) compile for real
    # the main process's side, in a process of its own (this one imported Triton for its interpreter)
    fn = PyCodeCache.load(OFFLINE_PROBE).tiny_offline_probe.fn
    spec = subprocess.run([sys.executable, "-c", SPECIALIZE_PROBE, str(PyCodeCache.path_for(OFFLINE_PROBE))],
                          capture_output=True, text=True, check=True).stdout
    assert json.loads(spec)["signature"] == {"in_ptr": "*bf16", "out_ptr": "*fp32", "xnumel": "i32",
                                             "XBLOCK": "constexpr"}
    pool = CompileWorkers(1, archs=[80, 90])
    try:
        deadline = time.time() + 180
        while pool.ready == 0 and pool.alive and time.time() < deadline:
            time.sleep(0.05)
        assert pool.ready == 1
        # the warm-up was compiled before the fork, for the first device
        assert list((tmp_path / "triton").rglob("tiny_worker_warm_up.cubin"))
        binary = pool.submit(KernelJob(fn.fn.__module__, "tiny_offline_probe", fn.src, False, spec, 1)).result(timeout=180)
        server = pool._server.pid
        assert "libtorch" not in Path(f"/proc/{server}/maps").read_text()  # the forking process has no torch
    finally:
        pool.close()
    cubins = list((tmp_path / "triton").rglob("tiny_offline_probe.cubin"))
    assert len(cubins) == 1
    meta = json.loads((cubins[0].parent / "tiny_offline_probe.json").read_text())
    assert meta["target"]["arch"] == 90  # device 1's architecture, not device 0's
    assert binary.cubin == str(cubins[0]) and binary.name == "tiny_offline_probe"
    assert binary.types == "OOi" + "O" * binary.extra  # two pointers, an int32 (and scratch pointers)


def test_a_pool_whose_workers_all_failed_to_start_fails_its_jobs(monkeypatch):
    """Jobs wait for workers that are still starting; once none is left (here none could start),
    the waiting jobs and any new one fail at once, and the caller compiles in a thread instead."""
    import sys
    import time

    from tininductor.runtime.compile_worker import CompileWorkers

    monkeypatch.setattr(sys, "executable", "/bin/false")  # the forking process exits at once
    pool = CompileWorkers(2, archs=[90])
    try:
        waiting = pool.submit(_job("kernel"))
        with pytest.raises(RuntimeError, match="no Triton compile worker process is left"):
            waiting.result(timeout=60)
        deadline = time.time() + 60
        while pool.alive and time.time() < deadline:
            time.sleep(0.01)
        assert not pool.alive and pool.ready == 0
        late = pool.submit(_job("kernel"))
        assert late.done() and "no Triton compile worker" in str(late.exception())
    finally:
        pool.close()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process parents from /proc")
def test_compile_workers_are_forked_from_one_process_and_end_with_it():
    """One process imports torch and Triton and forks the workers (none imports them again while
    the main process traces); closing the pool ends that process and every worker."""
    import time

    from tininductor.runtime.compile_worker import CompileWorkers

    def processes():  # (pid, state, parent, process group) of each process
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                state, parent, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            except OSError:  # the process ended meanwhile
                continue
            found.append((int(stat.parent.name), state, int(parent), int(group)))
        return found

    def children(pid):
        return [child for child, _, parent, _ in processes() if parent == pid]

    pool = CompileWorkers(3, archs=[90])
    group = pool._server.pid
    try:
        deadline = time.time() + 120
        while pool.ready < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert pool.ready == 3
        assert len(children(group)) == 3
    finally:
        pool.close()
    # nothing of the group runs on: not the server, nor a worker, nor a compiler a worker started
    # (Triton's ptxas; killed, it may stay a zombie until init reaps it)
    assert not [pid for pid, state, _, pgrp in processes() if pgrp == group and state != "Z"]


def test_compile_workers_take_the_most_urgent_job_first(tmp_path):
    """Jobs queued before a worker is ready run by priority (a forward's kernels, 0, before a
    backward's, 1), within one priority the largest kernel first (its compile is likely the
    longest), and in the order they came among equals."""
    import time

    from tininductor.runtime.compile_worker import CompileWorkers

    pool = CompileWorkers(1, archs=[90])
    try:
        order = []
        jobs = [("late-1", 1, 10), ("now-1", 0, 10), ("late-2", 1, 10), ("now-2", 0, 10), ("now-big", 0, 99),
                ("late-big", 1, 99)]
        for name, priority, size in jobs:  # all queued while the worker still imports Triton
            future = pool.submit(_job(name.replace("-", "_")), priority, size)
            future.add_done_callback(lambda _, name=name: order.append(name))
        assert pool.ready == 0
        deadline = time.time() + 120
        while len(order) < len(jobs) and time.time() < deadline:
            time.sleep(0.05)
        assert order == ["now-big", "now-1", "now-2", "late-big", "late-1", "late-2"]
    finally:
        pool.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles for a CUDA GPU")
def test_the_compile_warm_up_compiles_a_kernel_for_the_current_device(tmp_path, monkeypatch):
    """compile_server.warm_up compiles a small kernel for the current device (the forking process
    runs it before it forks, so that Triton's compiler has run once in every worker). The warm-up
    swallows errors, so this checks that it really compiled, here through Triton's own driver."""
    from tininductor.runtime import compile_server

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    compile_server.warm_up()
    assert list(tmp_path.rglob("tiny_worker_warm_up*.cubin")), list(tmp_path.rglob("*"))


def test_a_kernel_asked_for_twice_compiles_once(fast_launcher, monkeypatch):
    """The same kernel source with the same arguments (compile_early's module of one kernel, then
    the graph's module; or another graph's kernel) goes to the workers once, and both launchers
    share that compile. Other example arguments are another compile."""
    from concurrent.futures import Future

    jit, _ = fast_launcher
    jit.src = "def fake_kernel(in_ptr0, out_ptr0, xnumel, XBLOCK, RBLOCK): ..."
    submitted = []

    class Workers:  # one ready worker, which has not answered yet
        ready = 1

        def submit(self, job, priority, size):
            submitted.append(job)
            return Future()

    monkeypatch.setattr(triton_launcher, "_started", {})
    first, _ = _launcher_with_pool(jit, monkeypatch, Workers())
    again = TritonLauncher(jit, grid=(7,), num_warps=4, RBLOCK=32, XBLOCK=8,
                           example_args=(torch.float32, torch.float32, 64))
    assert len(submitted) == 1 and again._precompiled is first._precompiled
    TritonLauncher(jit, grid=(7,), num_warps=4, RBLOCK=32, XBLOCK=8, example_args=(torch.float16, torch.float32, 64))
    assert len(submitted) == 2


def test_triton_kernels_start_compiling_as_they_are_generated(monkeypatch):
    """Each Triton kernel the wrapper keeps is handed to ``compile_early`` as a module of its own
    (its imports, the ``@triton.jit`` function, its launcher) while the rest of the graph is
    generated; that module loads alone, and its launcher is the kernel's."""
    from tininductor.codecache import PyCodeCache
    from tininductor.codegen import triton as triton_codegen
    from tininductor.testing import DEVICE, compile_graph

    early = []
    monkeypatch.setattr(triton_codegen, "compile_early", early.append)

    def fn(x, y):  # two kernels: a row sum, then what reads it across rows
        s = (x + y).relu().sum(1, keepdim=True)
        return (x / s.sum()).cos() * 3

    x, y = torch.randn(8, 16, device=DEVICE), torch.randn(8, 16, device=DEVICE)
    compiled = compile_graph(fn, [x, y], backend="triton")
    assert len(early) == len(compiled.kernels) >= 2
    for source in early:
        module = PyCodeCache.load(source)
        names = [n for n, v in vars(module).items() if isinstance(v, TritonLauncher)]
        assert len(names) == 1 and f"def {names[0]}(" in source
    torch.testing.assert_close(compiled(x, y), fn(x, y))


def test_compile_early_loads_only_with_compile_workers(monkeypatch):
    """Without worker processes ``compile_early`` loads nothing (the graph's module starts the
    compiles when it loads); with them it loads the kernel's module, whose launcher submits it."""
    import types

    loaded = []
    monkeypatch.setattr(triton_launcher, "PyCodeCache", types.SimpleNamespace(load=loaded.append))
    monkeypatch.setattr(triton_launcher, "compile_workers", lambda: None)
    triton_launcher.compile_early("source of one kernel")
    assert loaded == []
    monkeypatch.setattr(triton_launcher, "compile_workers", lambda: object())
    triton_launcher.compile_early("source of one kernel")
    assert loaded == ["source of one kernel"]
