"""Compile Triton kernels in worker processes: TorchInductor's AsyncCompile subprocess pool, small.

Triton's compiler is Python and MLIR work that holds the GIL; threads overlap only its ptxas and
gcc subprocesses. A graph of a hundred kernels (a GPT training step) therefore compiles them
nearly one core at a time. Worker processes, started once and kept, each compile a kernel into
Triton's on-disk cache and answer with its binary (``compile_server.KernelBinary``: the cubin's
path and what torch's launcher needs to launch it), which the main process loads as it is, without
going through Triton's JIT again.

This module is the main process's side; ``compile_server.py`` is the workers' side. One
subprocess (``python -m tininductor.runtime.compile_server``) imports Triton, never torch, and
forks the workers, as TorchInductor's ``SubprocPool`` does: a worker is a copy of an already
imported process, ready in milliseconds. Sixteen workers that each imported Triton themselves
would take sixteen times the import's CPU and disk work, at the moment the main process traces
the model. Not ``multiprocessing`` workers: spawn would import the user's script again in every
worker. Each worker reads jobs from a pipe of its own and answers on another, with
length-prefixed pickles. A job (``compile_server.KernelJob``) carries the kernel's source and its
specialisation, worked out here with Triton's own binder (``triton_launcher.specialization``).

Workers start in the background when the backend is looked up (``start_workers``), next to the
Triton driver's warm-up. A kernel submitted before one is ready is queued, and a thread of the main
process compiles it unless a worker takes it first (``precompile`` cancels the queued job): a small
graph's few kernels need not wait the second the pool takes to start.

Workers never start CUDA, and they run only for NVIDIA GPUs. The main process names each GPU's
architecture (``cuda_archs``), and the forking process installs a Triton driver that answers with
them (``compile_server.offline_driver``): compiling for a GPU needs its architecture, not the GPU.
Triton's own driver would ask CUDA (through torch), and sixteen workers that each start CUDA (a
context, hundreds of MB of GPU memory each) take seconds at the moment the first kernels are due.
With no CUDA in it, the forking process can also compile one small kernel before it forks
(``compile_server.warm_up``): every worker is then a copy of a process whose compiler (MLIR, LLVM,
ptxas) has already run once, and its first real kernel pays for none of it.
``TINY_COMPILE_WORKERS=N`` sets their number (0: threads only; default: TorchInductor's, one per
core, at most 32).

Jobs wait in a priority queue: a kernel the next call needs (a forward's) goes before one needed
later (a backward's, compiled while the forward runs); among equals the longest kernel goes first,
as its compile likely takes longest (longest-processing-time-first: a long compile started last
finishes after all the others), then the oldest.
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import torch

from tininductor.codecache import PyCodeCache
from tinydynamo.utils import log_event

from .compile_server import KernelJob, read, write


class CompileWorkers:
    """A few kept worker processes; ``submit(job, priority, size)`` returns a future of the worker's answer.

    Each worker has a thread of its own that feeds it: it takes the most urgent job from the queue
    (lowest ``priority``, then the largest ``size``, then the oldest), sends it, and waits for the
    answer."""

    def __init__(self, count: int, archs: list[int]):
        """``archs``: each CUDA device's architecture (``cuda_archs()``), which the workers compile for."""
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
        self._server = subprocess.Popen([sys.executable, "-m", "tininductor.runtime.compile_server",
                                         ",".join(map(str, archs)),
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
            started = read(from_worker) == "ready"
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
                write(to_worker, job)
                status, detail = read(from_worker)
                log_event(f"compile {job.name}", start, time.perf_counter(), track=name)
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
                future.set_result(detail)  # the kernel's binary (compile_server.KernelBinary), or None

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

    def submit(self, job: KernelJob, priority: int = 0, size: int = 0) -> Future:
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
    """Start the worker processes (once, in the background: they import Triton), on NVIDIA GPUs:
    they compile for this process's devices without starting CUDA themselves."""
    global _workers
    if _workers is None and worker_count() > 0 and torch.cuda.is_available() and torch.version.hip is None:
        _workers = CompileWorkers(worker_count(), cuda_archs())


def compile_workers() -> CompileWorkers | None:
    """The pool, once started, while a worker is ready or still starting."""
    return _workers if _workers is not None and _workers.alive else None


def is_generated(path: str) -> bool:
    """Workers only compile kernels of tininductor's own generated modules (never a user's
    kernel, whose module-level names a worker would not have)."""
    return os.path.dirname(path) == os.path.dirname(str(PyCodeCache.path_for(""))) and path.endswith(".py")
