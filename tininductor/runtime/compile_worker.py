"""Compile Triton kernels in worker processes: TorchInductor's AsyncCompile subprocess pool, small.

Triton's compiler is Python and MLIR work that holds the GIL; threads overlap only its ptxas and
gcc subprocesses. A graph of a hundred kernels (a GPT training step) therefore compiles them
nearly one core at a time. Worker processes, started once and kept, each compile a kernel into
Triton's on-disk cache and answer with its binary (``static_kernel.KernelBinary``: the cubin's
path and what torch's launcher needs to launch it), which the main process loads as it is, without
going through Triton's JIT again.

One subprocess (``python -m tininductor.runtime.compile_worker``) imports torch and Triton once
and forks the workers, as TorchInductor's ``SubprocPool`` does: a worker is a copy of an already
imported process, ready in milliseconds. Sixteen workers that each imported torch themselves
would take sixteen times the import's CPU and disk work, at the moment the main process traces
the model: on the H200 host that slowed OPT's trace from 0.28 s (8 workers) to 1.35 s (16).
Not ``multiprocessing`` workers: spawn would import the user's script again in every worker.
Each worker reads jobs from a pipe of its own and answers on another, with length-prefixed
pickles. A job names the generated module's file and the kernel in it; the worker loads that
module (its kernels' ``TritonLauncher`` objects do nothing until launched) and calls the
kernel's ``warmup`` with the same arguments the main process would use: where the main process
cannot take the binary, its own ``warmup`` finds the kernel in the cache under the same key.

Workers start in the background when the backend is looked up (``start_workers``), next to the
Triton driver's warm-up. A kernel submitted before one is ready is queued, and a thread of the main
process compiles it unless a worker takes it first (``precompile`` cancels the queued job): a small
graph's few kernels need not wait the seconds the pool takes to start.

Workers never start CUDA. The main process names each GPU's architecture (``cuda_archs``), and the
forking process installs a Triton driver that answers with them (``offline_driver``): compiling
for a GPU needs its architecture, not the GPU. Triton's own driver would ask CUDA, and sixteen
workers that each start CUDA (a context, hundreds of MB of GPU memory each) take seconds at the
moment the first kernels are due. With no CUDA in it, the forking process can also compile one
small kernel before it forks (``warm_up``): every worker is then a copy of a process whose
compiler (MLIR, LLVM, ptxas) has already run once, and its first real kernel pays for none of it.
``TINY_COMPILE_WORKERS=N`` sets their number (0: threads only; default: TorchInductor's, one per core, at
most 32).

Jobs wait in a priority queue: a kernel the next call needs (a forward's) goes before one needed
later (a backward's, compiled while the forward runs); among equals the longest kernel goes first,
as its compile likely takes longest (longest-processing-time-first: a long compile started last
finishes after all the others), then the oldest.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import itertools
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import torch

from tininductor.codecache import PyCodeCache
from tininductor.runtime.static_kernel import KernelBinary
from tinydynamo.utils import log_event

_HEADER = struct.Struct("<Q")


def _write(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream):
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("compile worker closed its pipe")
    (size,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(size))


class CompileWorkers:
    """A few kept worker processes; ``submit(job, priority, size)`` returns a future of the worker's answer.

    Each worker has a thread of its own that feeds it: it takes the most urgent job from the queue
    (lowest ``priority``, then the largest ``size``, then the oldest), sends it, and waits for the
    answer."""

    def __init__(self, count: int, archs: list[int] | None = None):
        """``archs``: each CUDA device's architecture (``cuda_archs()``), for compiling without CUDA;
        None: the workers ask Triton's own driver (which starts CUDA in each of them)."""
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()  # ties in priority: first submitted, first compiled
        self._lock = threading.Lock()
        self.starting = count  # workers that have not yet reported ready (or died trying)
        self.ready = 0  # workers that reported ready and are alive
        self.compiled = 0  # kernels the workers compiled
        env = dict(os.environ, TINY_TRITON_PARALLEL_COMPILE="0", TINY_TRITON_WARMUP="0", TINY_COMPILE_WORKERS="0")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        # per worker: a pipe for its jobs and one for its answers; the forking process gets the
        # worker's ends, this process keeps the other two
        jobs = [os.pipe() for _ in range(count)]
        answers = [os.pipe() for _ in range(count)]
        theirs = [fd for (job_read, _), (_, answer_write) in zip(jobs, answers) for fd in (job_read, answer_write)]
        # a session of its own: close() ends the forking process and every worker as one group
        named = ",".join(map(str, archs or [])) or "-"  # the devices' architectures ("-": none named)
        self._server = subprocess.Popen([sys.executable, "-m", "tininductor.runtime.compile_worker", named,
                                         *map(str, theirs)], pass_fds=theirs, env=env, start_new_session=True)
        for fd in theirs:
            os.close(fd)
        self._pipes = [(os.fdopen(job_write, "wb"), os.fdopen(answer_read, "rb"))
                       for (_, job_write), (answer_read, _) in zip(jobs, answers)]
        for i, pipes in enumerate(self._pipes):
            threading.Thread(target=self._serve, args=(*pipes, f"compile worker {i}"), daemon=True).start()
        atexit.register(self.close)

    @property
    def alive(self) -> bool:
        """Whether a worker is ready or may still become so (else no job would ever be answered)."""
        return self.starting + self.ready > 0

    def _serve(self, to_worker, from_worker, name: str) -> None:
        """Feed one worker: wait until it is ready, then compile jobs from the queue until it exits.
        Each job is a span on the worker's track of an active event log (``name``)."""
        try:
            started = _read(from_worker) == "ready"
        except (EOFError, OSError, ValueError):  # the worker died while starting: it is not used
            started = False
        with self._lock:
            self.starting -= 1
            self.ready += started
        if not started:
            self._check_alive(RuntimeError(f"{name} did not start"))
            return
        while True:
            *_, job, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                start = time.perf_counter()
                _write(to_worker, job)
                status, detail = _read(from_worker)
                log_event(f"compile {job[1]}", start, time.perf_counter(), track=name)
            except (EOFError, OSError, ValueError) as e:  # the worker is gone (killed at exit, crashed)
                with self._lock:
                    self.ready -= 1
                future.set_exception(RuntimeError(f"a Triton compile worker process ended: {e}"))
                self._check_alive(e)
                return
            if status != "ok":
                future.set_exception(RuntimeError(f"Triton compile in a worker process failed: {detail}"))
            else:
                self.compiled += 1
                future.set_result(detail)  # the kernel's binary (static_kernel.KernelBinary), or None

    def _check_alive(self, error: Exception) -> None:
        """After a worker ended: if it was the last, fail every queued job (none would be answered;
        their callers compile in threads instead). ``submit`` fails new ones from then on."""
        with self._lock:
            if self.alive:
                return
        while True:
            try:
                *_, future = self._jobs.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError(f"no Triton compile worker process is left: {error}"))

    def submit(self, job: tuple, priority: int = 0, size: int = 0) -> Future:
        """Queue ``job``: lowest ``priority`` first, then the largest ``size`` (the kernel's source
        length, standing for its compile time), then the oldest."""
        future: Future = Future()
        with self._lock:  # (a job queued after the last worker ended would wait forever)
            if not self.alive:
                future.set_exception(RuntimeError("no Triton compile worker process is left"))
                return future
            self._jobs.put((priority, -size, next(self._order), job, future))
        return future

    def close(self) -> None:
        """End the workers (at exit): they hold nothing worth waiting for, and a process's exit
        must not wait for one still importing or compiling (Triton writes its cache atomically)."""
        if self._server is None:
            return
        self._server.terminate()  # it kills and reaps its workers, then exits
        try:
            self._server.wait(timeout=10)
        except subprocess.TimeoutExpired:  # stuck
            pass
        # whatever is left of the group: the server if stuck, and any compiler a killed worker had
        # started (Triton runs ptxas as a process of its own, which outlives its parent)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._server.pid, signal.SIGKILL)
        self._server.wait()
        self._server = None
        for pipes in self._pipes:
            for pipe in pipes:
                try:
                    pipe.close()
                except OSError:  # a write to a killed worker's pipe cannot be flushed
                    pass
        self._pipes = []


_workers: CompileWorkers | None = None


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


#: TorchInductor's cap on its compile processes (``torch._inductor.config.compile_threads``)
MAX_WORKERS = 32


def worker_count() -> int:
    """``TINY_COMPILE_WORKERS``, else as many as TorchInductor takes compile processes: one per
    usable core, at most :data:`MAX_WORKERS`. 0 without ``os.fork`` (workers are forked)."""
    if not hasattr(os, "fork"):
        return 0
    wanted = os.environ.get("TINY_COMPILE_WORKERS")
    if wanted is not None:
        return int(wanted)
    return min(MAX_WORKERS, usable_cores())


def cuda_archs() -> list[int]:
    """Each CUDA device's architecture as Triton names it (``90`` for compute capability 9.0)."""
    return [major * 10 + minor for major, minor in map(torch.cuda.get_device_capability,
                                                       range(torch.cuda.device_count()))]


def start_workers() -> None:
    """Start the worker processes (once, in the background: they import torch and Triton). On
    NVIDIA GPUs they compile for this process's devices without starting CUDA themselves."""
    global _workers
    if _workers is None and worker_count() > 0:
        archs = cuda_archs() if torch.cuda.is_available() and torch.version.hip is None else None
        _workers = CompileWorkers(worker_count(), archs)


def compile_workers() -> CompileWorkers | None:
    """The pool, once started, while a worker is ready or still starting."""
    return _workers if _workers is not None and _workers.alive else None


def is_generated(path: str) -> bool:
    """Workers only load tininductor's own generated modules (never a user's file)."""
    return os.path.dirname(path) == os.path.dirname(str(PyCodeCache.path_for(""))) and path.endswith(".py")


# --------------------------------------------------------------------------- the worker side

def offline_driver(archs: list[int]):
    """Make Triton compile for CUDA devices of architectures ``archs`` (by device index) without
    starting CUDA: its NVIDIA driver, built without its ``__init__`` (which binds torch.cuda's
    queries), answering the current device, its capability and stream from here. Set as Triton's
    active driver; returns it (``.device`` is the device compiled for)."""
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime import driver as triton_driver

    offline = CudaDriver.__new__(CudaDriver)
    offline.device = 0
    offline.get_current_device = lambda: offline.device
    offline.set_current_device = lambda index: setattr(offline, "device", index)
    offline.get_device_capability = lambda index: divmod(archs[index], 10)
    offline.get_current_stream = lambda index: 0  # (a compile launches nothing)
    triton_driver.set_active(offline)
    return offline


_offline = None  # the worker's offline driver, when the main process named its devices' archs


def _compile(path: str, name: str, example_args: tuple, grid, constants: dict, options: dict,
             device) -> KernelBinary | None:
    """Compile kernel ``name`` of the generated module at ``path`` into Triton's cache; its binary
    as torch's prebuilt launcher loads it (None where that launcher does not apply)."""

    source = Path(path).read_bytes().decode()  # bytes: no newline translation
    if Path(path).name != PyCodeCache.path_for(source).name:  # the file is named by its content's hash
        # (the name, not the directory: the main process may have moved TINY_CACHE_DIR since)
        raise ValueError(f"{path} is not an intact tininductor module")
    module = PyCodeCache.load(source)
    fn = getattr(module, name).fn  # the module rebinds the kernel's name to its TritonLauncher
    if _offline is not None:  # the device to compile for is the offline driver's current one
        _offline.set_current_device(device or 0)
    with torch.cuda.device(device) if _offline is None else contextlib.nullcontext():
        return KernelBinary.describe(fn.warmup(*example_args, grid=grid, **constants, **options))


#: a kernel compiled once before the workers fork (see :func:`warm_up`)
WARM_UP_SOURCE = """\
import triton
import triton.language as tl


@triton.jit
def tiny_worker_warm_up(ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(ptr + offsets, tl.load(ptr + offsets) + 1)
"""


def warm_up() -> None:
    """Compile a small kernel for the current device: the first run of Triton's compiler (MLIR,
    LLVM and ptxas loaded and initialised) takes about a second. The forking process pays it once,
    before it forks, so that no worker's first real kernel does (without an offline driver, each
    worker pays it itself, with CUDA's start, before its first job)."""
    try:
        PyCodeCache.load(WARM_UP_SOURCE).tiny_worker_warm_up.warmup(torch.float32, grid=(1,), BLOCK=128)
    except Exception:  # noqa: BLE001 - only a warm-up: a real job reports any error of its own
        pass


def serve(inp, out) -> None:
    """One worker: say it is ready, then compile each job it reads until the pipe closes."""
    _write(out, "ready")
    if _offline is None:  # Triton's own driver: CUDA and the compiler start here (a job waits in the pipe)
        warm_up()
    while True:
        try:
            job = _read(inp)
        except EOFError:  # the main process is gone
            return
        try:
            _write(out, ("ok", _compile(*job)))
        except Exception as e:  # noqa: BLE001 - reported to the main process, which raises it
            _write(out, ("error", f"{type(e).__name__}: {e}"[:4000]))


def main(archs: list[int], fds: list[int]) -> None:
    """The forking process: import what every job needs once (and, given the devices' ``archs``,
    compile a first kernel without CUDA), then fork one worker per pair of pipe ends (``fds``: its
    jobs' read end, its answers' write end) and wait for them."""
    global _offline
    import triton  # noqa: F401  (imported once, here, for every worker)

    # the launcher module every job's kernel module loads, by name: this module sits below it (its pool
    # serves the launcher), the worker process's entry point is the one place that loads it ahead
    importlib.import_module("tininductor.runtime.triton_launcher")

    sys.stdout = sys.stderr  # the pipes carry pickles only; a stray print goes to stderr
    if archs:
        try:
            _offline = offline_driver(archs)
        except (ImportError, AttributeError):  # not Triton's NVIDIA backend: each worker starts CUDA
            _offline = None
        else:
            warm_up()  # no CUDA was started: forking after it is safe
    workers = []
    for job_read, answer_write in zip(fds[0::2], fds[1::2]):
        pid = os.fork()
        if pid == 0:  # the worker: its own two ends only
            for fd in fds:
                if fd not in (job_read, answer_write):
                    os.close(fd)
            try:
                serve(os.fdopen(job_read, "rb"), os.fdopen(answer_write, "wb"))
            finally:
                os._exit(0)  # never return into the forking loop
        workers.append(pid)
    for fd in fds:
        os.close(fd)

    def end(signum, frame):  # CompileWorkers.close: kill the workers, reap them, exit
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    for _ in workers:  # else they end when the main process closes their pipes (or dies)
        os.wait()


if __name__ == "__main__":
    main([int(arch) for arch in sys.argv[1].split(",") if arch != "-"], [int(fd) for fd in sys.argv[2:]])
