"""Compile Triton kernels in worker processes: TorchInductor's AsyncCompile subprocess pool, small.

Triton's compiler is Python and MLIR work that holds the GIL; threads overlap only its ptxas and
gcc subprocesses. A graph of a hundred kernels (a GPT training step) therefore compiles them
nearly one core at a time. Worker processes, started once and kept, each compile a kernel into
Triton's on-disk cache; the main process then loads it from there (a cache hit: no compile).

The workers are plain subprocesses (``python -m tininductor.runtime.compile_worker``) fed over
their stdin/stdout with length-prefixed pickles, as TorchInductor's ``SubprocPool`` does, and not
``multiprocessing`` workers: spawn would import the user's script again in every worker. A job
names the generated module's file and the kernel in it; the worker loads that module (its
kernels' ``TritonLauncher`` objects do nothing until launched) and calls the kernel's
``warmup`` with the same arguments the main process would use, so both compute the same cache key.

Workers start in the background when the backend is looked up (``start_workers``), next to the
Triton driver's warm-up; until one reports ready, kernels compile in threads. A ready worker first
compiles a small kernel of its own (``warm_up``), so that its first real kernel does not also pay
for initialising CUDA and Triton's compiler.
``TINY_COMPILE_WORKERS=N`` sets their number (0: threads only; default: TorchInductor's, one per core, at
most 32).

Jobs wait in a priority queue: a kernel the next call needs (a forward's) goes before one needed
later (a backward's, compiled while the forward runs), and otherwise the oldest goes first.
"""
from __future__ import annotations

import atexit
import importlib
import itertools
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import torch

from tininductor.codecache import PyCodeCache

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
    """A few kept worker processes; ``submit(job, priority)`` returns a future of the worker's answer.

    Each worker has a thread of its own that feeds it: it takes the most urgent job from the queue
    (lowest ``priority``, then the oldest), sends it, and waits for the answer."""

    def __init__(self, count: int):
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()  # ties in priority: first submitted, first compiled
        self._procs: list[subprocess.Popen] = []
        self.ready = 0  # workers that finished their imports
        self.compiled = 0  # kernels the workers compiled
        env = dict(os.environ, TINY_TRITON_PARALLEL_COMPILE="0", TINY_TRITON_WARMUP="0", TINY_COMPILE_WORKERS="0")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for _ in range(count):
            proc = subprocess.Popen([sys.executable, "-m", "tininductor.runtime.compile_worker"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            self._procs.append(proc)
            threading.Thread(target=self._serve, args=(proc,), daemon=True).start()
        atexit.register(self.close)

    def _serve(self, proc) -> None:
        """Feed one worker: wait for its imports, then compile jobs from the queue until it exits."""
        try:
            if _read(proc.stdout) != "ready":
                return
        except (EOFError, OSError):  # the worker died while importing: it is not used
            return
        self.ready += 1
        while True:
            _, _, job, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                _write(proc.stdin, job)
                status, detail = _read(proc.stdout)
            except (EOFError, OSError, ValueError) as e:  # the worker is gone (killed at exit, crashed)
                self.ready -= 1
                future.set_exception(RuntimeError(f"a Triton compile worker process ended: {e}"))
                if self.ready == 0:  # the last one: no job left in the queue would ever be answered
                    self._fail_queued(e)
                return
            if status != "ok":
                future.set_exception(RuntimeError(f"Triton compile in a worker process failed: {detail}"))
            else:
                self.compiled += 1
                future.set_result(None)

    def _fail_queued(self, error: Exception) -> None:
        while True:
            try:
                *_, future = self._jobs.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError(f"no Triton compile worker process is left: {error}"))

    def submit(self, job: tuple, priority: int = 0) -> Future:
        future: Future = Future()
        self._jobs.put((priority, next(self._order), job, future))
        return future

    def close(self) -> None:
        """End the workers (at exit): they hold nothing worth waiting for, and a process's exit
        must not wait for one still importing or compiling (Triton writes its cache atomically)."""
        for proc in self._procs:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                try:
                    pipe.close()
                except OSError:  # a write to a killed worker's pipe cannot be flushed
                    pass
        self._procs = []


_workers: CompileWorkers | None = None


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


#: TorchInductor's cap on its compile processes (``torch._inductor.config.compile_threads``)
MAX_WORKERS = 32


def worker_count() -> int:
    """``TINY_COMPILE_WORKERS``, else as many as TorchInductor takes compile processes: one per
    usable core, at most :data:`MAX_WORKERS`."""
    wanted = os.environ.get("TINY_COMPILE_WORKERS")
    if wanted is not None:
        return int(wanted)
    return min(MAX_WORKERS, usable_cores())


def start_workers() -> None:
    """Start the worker processes (once, in the background: they import torch and Triton)."""
    global _workers
    if _workers is None and worker_count() > 0:
        _workers = CompileWorkers(worker_count())


def workers_ready() -> CompileWorkers | None:
    """The pool, if at least one worker is ready to take a kernel."""
    return _workers if _workers is not None and _workers.ready > 0 else None


def is_generated(path: str) -> bool:
    """Workers only load tininductor's own generated modules (never a user's file)."""
    return os.path.dirname(path) == os.path.dirname(str(PyCodeCache.path_for(""))) and path.endswith(".py")


# --------------------------------------------------------------------------- the worker side

def _compile(path: str, name: str, example_args: tuple, grid, constants: dict, options: dict, device) -> None:
    """Compile kernel ``name`` of the generated module at ``path`` into Triton's cache."""

    source = Path(path).read_bytes().decode()  # bytes: no newline translation
    if Path(path).name != PyCodeCache.path_for(source).name:  # the file is named by its content's hash
        # (the name, not the directory: the main process may have moved TINY_CACHE_DIR since)
        raise ValueError(f"{path} is not an intact tininductor module")
    module = PyCodeCache.load(source)
    fn = getattr(module, name).fn  # the module rebinds the kernel's name to its TritonLauncher
    with torch.cuda.device(device):
        fn.warmup(*example_args, grid=grid, **constants, **options)


#: a kernel compiled once when a worker starts (see :func:`warm_up`)
WARM_UP_SOURCE = """\
import triton
import triton.language as tl


@triton.jit
def tiny_worker_warm_up(ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(ptr + offsets, tl.load(ptr + offsets) + 1)
"""


def warm_up() -> None:
    """Pay a worker's one-time costs before its first job: CUDA's initialisation, Triton's driver,
    and the first run of its compiler (MLIR, LLVM and ptxas loaded). They take seconds, once per
    worker; paid here, while the main process is still tracing, they stay off the first call's
    critical path instead of delaying each worker's first kernel."""
    if not torch.cuda.is_available():
        return
    try:
        with torch.cuda.device(torch.cuda.current_device()):
            PyCodeCache.load(WARM_UP_SOURCE).tiny_worker_warm_up.warmup(torch.float32, grid=(1,), BLOCK=128)
    except Exception:  # noqa: BLE001 - only a warm-up: a real job reports any error of its own
        pass


def main() -> None:
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the pipe
    import triton  # noqa: F401  (the worker pays triton's second of import before its first job)

    # the launcher module every job's kernel module loads, by name: this module sits below it (its pool
    # serves the launcher), the worker process's entry point is the one place that loads it ahead
    importlib.import_module("tininductor.runtime.triton_launcher")

    _write(out, "ready")
    warm_up()  # (a job sent meanwhile waits in the pipe)
    while True:
        try:
            job = _read(inp)
        except EOFError:  # the main process is gone
            return
        try:
            _compile(*job)
            _write(out, ("ok", None))
        except Exception as e:  # noqa: BLE001 - reported to the main process, which raises it
            _write(out, ("error", f"{type(e).__name__}: {e}"[:4000]))


if __name__ == "__main__":
    main()
