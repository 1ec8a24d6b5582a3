"""TritonLauncher: launch one generated Triton kernel with as little host work as possible.

``kernel[grid](*args, XBLOCK=64, num_warps=4)`` is Triton's front door. Every call binds the
arguments to the signature, works out how each one specialises the kernel (dtype, 16-byte
alignment of pointers, integers equal to 1), hashes that into a cache key, looks the compiled
kernel up, and only then calls its C launcher. That is 10-20 us of Python per launch on a
fast host: more than a small kernel runs on the GPU.

A generated wrapper knows everything but the pointers ahead of time: shapes are static, so
sizes, grid, block sizes and warps never change. The launcher therefore goes through the front
door once per *alignment pattern* of the pointer arguments (the only thing that can still vary),
keeps the compiled kernel Triton returns, and afterwards calls its C launcher directly::

    compiled.run(grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata,
                 launch_metadata, enter_hook, exit_hook, *args, *constexprs)

This is what TorchInductor's generated launchers do too. Where torch has its prebuilt launcher
(``StaticKernel``, runtime/static_kernel.py) the closure calls that instead, and Triton never
builds a C launcher for the kernel (a gcc run per signature in a cold cache). The slow path
stays in charge whenever the fast one would not be exact: Triton's interpreter (CPU), Triton
before 3.3 (another ``run`` signature), and launch hooks set by a profiler.
"""
from __future__ import annotations

import contextlib
import contextvars
import inspect
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from tinydynamo.utils import dynamo_timed, log_event

from .. import config
from ..codecache import PyCodeCache
from . import static_kernel
from .autotune import autotune
from .compile_server import KernelBinary, KernelJob
from .compile_worker import compile_workers, is_generated
from .index_check import interpreter_asserts
from .static_kernel import StaticKernel


def _triton_version() -> tuple[int, int]:
    import triton  # triton: a second to import, loaded at the first kernel

    major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    return major, minor


def _runtime_knobs():
    from triton import knobs  # triton: a second to import, loaded at the first kernel

    return knobs.runtime


def _stream_getters():
    """(current device, current stream of a device): what Triton's front door launches on.

    Triton asks ``torch.cuda.current_device()`` (Python: a lazy-init check, then C); the C
    function under it answers the same in a tenth of the time.
    """
    from triton.runtime import driver  # triton: a second to import, loaded at the first kernel

    get_device, get_stream = driver.active.get_current_device, driver.active.get_current_stream
    if get_device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
        get_device = torch._C._cuda_getDevice  # CUDA is initialised: a kernel was just compiled
    return get_device, get_stream


def _hook_set(hook) -> bool:
    """A launch hook a profiler installed (Triton 3.6: a callable or None; 3.9: a HookChain)."""
    return hook is not None and getattr(hook, "calls", True) != []


def _profiler_listening(knobs) -> bool:
    """A profiler's launch hook is set (a launch then goes through Triton, which calls it). Asked
    only when a hook object is there: Triton 3.9 keeps an empty HookChain."""
    return _hook_set(knobs.launch_enter_hook) or _hook_set(knobs.launch_exit_hook)


class TritonLauncher:
    """``launcher.run(*args)`` = ``fn[grid](*args, **constants, num_warps=num_warps)``, faster.

    ``args`` are the kernel's runtime arguments in signature order (tensors, then sizes);
    ``constants`` its ``tl.constexpr`` parameters, which the wrapper fixed at compile time.
    """

    def __init__(self, fn, grid: tuple[int, ...], num_warps: int, autotune: list[dict] | None = None,
                 numel: int | None = None, checks_indices: bool = False, example_args: tuple | None = None,
                 rows_block: int | None = None, num_stages: int = 1, **constants):
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.constants = constants
        # the kernel asserts its indirect indices are in range (runtime/index_check.py): it is
        # compiled with debug=True (without Triton's integer-overflow checks, which debug adds)
        self.checks_indices = checks_indices
        self.fast = _fast_path_possible(fn, constants)
        # mode="max-autotune": candidate configs ({"XBLOCK": .., "num_warps": ..}), the first being
        # the heuristic's; timed at the first launch on a GPU (runtime/autotune.py)
        self.autotune = autotune if autotune and len(autotune) > 1 else None
        self.numel = numel
        # run_rows (a persistent reduction over a symbolic row length): XBLOCK * RBLOCK at most this
        self.rows_block = rows_block
        self._by_rblock: dict[int, "TritonLauncher"] = {}
        # alignment pattern of the pointer arguments -> a direct launch closure
        self._launchers: dict[int, object] = {}
        self._pointer_positions: tuple[int, ...] | None = None
        # positions of pointer arguments that are 16-byte aligned at every launch (assume_aligned)
        self.known_aligned: frozenset[int] = frozenset()
        self._int_positions: tuple[int, ...] | None = None  # run_grid: the int arguments (sizes)
        # what the kernel is compiled for: a torch dtype per pointer, the sizes (see precompile below)
        self.example_args = example_args
        # compile now, in the background, with the graph's other kernels
        self._precompiled = None
        if example_args is not None and self.fast and self.autotune is None:
            self._precompiled = precompile(self, example_args)

    def assume_aligned(self, *positions: int) -> None:
        """The pointer arguments at ``positions`` are 16-byte aligned at every launch: buffers the
        wrapper allocates (the caching allocator hands out 512-byte aligned blocks) and outputs of
        library kernels (fresh allocations). Their launches skip those arguments' alignment check
        (TorchInductor assumes the same of its buffers); the graph's inputs are still checked."""
        self.known_aligned = frozenset(positions)

    def wait_compiled(self) -> None:
        """Block until the background compile is done. Its error (a Triton ``CompilationError``)
        is raised here, while the graph is being compiled, so the graph falls back to eager with a
        warning, as TorchInductor's ``AsyncCompile.wait`` does, instead of failing at its first call."""
        if self._precompiled is not None:
            await_kernel(self._precompiled)

    def with_config(self, config: dict) -> "TritonLauncher":
        """This kernel launched with another config: its grid follows XBLOCK (one program per block)."""
        constants = {**self.constants, **{k: v for k, v in config.items() if k != "num_warps"}}
        grid = (max(1, -(-self.numel // constants["XBLOCK"])),)
        return TritonLauncher(self.fn, grid, config["num_warps"], numel=self.numel,
                              checks_indices=self.checks_indices, num_stages=self.num_stages, **constants)

    def __repr__(self) -> str:
        return f"TritonLauncher({self.fn.__name__}, grid={self.grid}, num_warps={self.num_warps}, {self.constants})"

    def run(self, *args):
        if not self.fast:
            self._launch_through_triton(args)
            return
        key = 0
        for i in self._pointer_positions or ():
            key = (key << 1) | ((args[i].data_ptr() & 15) == 0)
        launch = self._launchers.get(key)
        if launch is None:  # first call with this alignment pattern: compile (or find) it in Triton
            self._first_launch(key, args)
        else:
            launch(args)

    def run_rows(self, numel: int, rnumel: int, *args):
        """A persistent reduction whose row length is only known now: RBLOCK is the row rounded
        up to a power of two, XBLOCK fills ``rows_block`` elements, and each RBLOCK gets its own
        compiled variant (a handful over a sweep of lengths), kept for the next call."""
        rblock = 1 << (rnumel - 1).bit_length() if rnumel > 1 else 1
        launcher = self._by_rblock.get(rblock)
        if launcher is None:
            xblock = max(1, self.rows_block // rblock)
            warps = max(1, min(8, (xblock * rblock) // 256))
            launcher = TritonLauncher(self.fn, (1,), warps, checks_indices=self.checks_indices,
                                      **{**self.constants, "XBLOCK": xblock, "RBLOCK": rblock})
            self._by_rblock[rblock] = launcher
        xblock = launcher.constants["XBLOCK"]
        launcher.run_grid((numel + xblock - 1) // xblock, *args)

    def run_grid(self, grid_x: int, *args):
        """A launch over ``grid_x`` programs: a kernel compiled for dynamic shapes, whose grid and
        int arguments (sizes) change from call to call. Triton specialises an int argument on
        ``== 1`` and ``% 16 == 0``, so those facts are part of the compiled variant's key.

        Through the direct launcher, one compiled variant per specialisation key (pointer
        alignment, and each size's ``== 1`` and ``% 16 == 0``), as Triton's front door would pick;
        ``config.triton.direct_launch_dynamic = False`` goes through ``kernel[grid](...)`` instead
        (a few microseconds more per launch)."""
        if not self.fast or not config.triton.direct_launch_dynamic:
            self._launch_through_triton(args, (grid_x, 1, 1))
            return
        key = 0
        for i in self._pointer_positions or ():
            key = (key << 1) | ((args[i].data_ptr() & 15) == 0)
        for i in self._int_positions or ():
            v = args[i]
            key = (key << 2) | ((v % 16 == 0) << 1) | (v == 1)
        launch = self._launchers.get(key)
        if launch is None:
            self._first_launch(key, args, (grid_x, 1, 1))
        else:
            launch(args, grid_x)

    def _options(self) -> dict:
        """Triton compile options besides the constexprs: warps, pipelining stages; for kernels that
        assert their indices, no integer-overflow checks (which ``debug=True`` would add to every index)."""
        return {"num_warps": self.num_warps, "num_stages": self.num_stages,
                **({"sanitize_overflow": False} if self.checks_indices else {})}

    def _launch_through_triton(self, args, grid=None):
        """Triton's front door: binds, specialises, compiles on a miss, launches; returns the compiled kernel."""
        grid = grid or self.grid
        if self.checks_indices and os.environ.get("TRITON_INTERPRET") == "1":
            with interpreter_asserts():
                return self.fn[grid](*args, **self.constants, num_warps=self.num_warps)
        return self.fn[grid](*args, **self.constants, **self._options())

    def _first_launch(self, key: int, args, grid=None):
        if self.autotune is not None and self.fast:  # timings mean something only on a GPU

            with dynamo_timed("autotune"):
                best = self.with_config(autotune(self, args))
            self.grid, self.num_warps, self.constants = best.grid, best.num_warps, best.constants
            self.autotune = None
        precompiled = None
        if self._precompiled is not None:
            with dynamo_timed("triton_wait_precompile"):
                try:
                    precompiled = await_kernel(self._precompiled)
                except Exception:  # compiled again (and its error raised) by the launch below
                    pass
            self._precompiled = None
        with dynamo_timed("triton_first_launch"):  # Triton's JIT compile (and its launcher's build)
            static = compiled = None
            if precompiled is not None and grid is None and \
                    all(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor)):
                # the kernel compiled ahead, for what the example arguments stood for (aligned pointers)
                static = self._static_launch(precompiled)
            elif self.fast and static_kernel.static_launcher() is not None:  # compile (or find) it, no launch yet
                compiled = self.fn.warmup(*args, grid=grid or self.grid, **self.constants, **self._options())
                static = self._direct_launch(compiled, static_only=True)
            if static is not None:
                static(args, grid[0]) if grid is not None else static(args)
            else:
                compiled = self._launch_through_triton(args, grid)
        if self._pointer_positions is None:
            self._pointer_positions = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
            key = 0
            for i in self._pointer_positions:
                key = (key << 1) | ((args[i].data_ptr() & 15) == 0)
            if grid is not None:
                self._int_positions = tuple(i for i, a in enumerate(args) if isinstance(a, int))
                for i in self._int_positions:
                    v = args[i]
                    key = (key << 2) | ((v % 16 == 0) << 1) | (v == 1)
        if static is not None:
            self._launchers[key] = static
        elif compiled is not None and hasattr(compiled, "packed_metadata"):
            self._launchers[key] = self._direct_launch(compiled)
        else:  # not a compiled kernel (an unexpected Triton): stay on the front door
            self.fast = False
        if self.fast and grid is None and "run" not in vars(self):
            self.run = self._specialized_run(key, len(args))

    def _specialized_run(self, key: int, n_args: int):
        """``run`` for this kernel's arguments, generated once their pointer positions are known:
        the alignment key as one expression (no loop, no attribute lookups) over the arguments
        not known to be aligned (:meth:`assume_aligned`). Where the first
        launch went through torch's prebuilt launcher, that launch is written into ``run`` itself
        for the first call's alignment (one Python frame per launch, everything else a constant);
        another alignment, or a profiler's launch hook, goes through :meth:`run`. The saving is
        per launch, so it counts on models of hundreds of kernels, whose cached calls are bound
        by the host."""
        n = len(self._pointer_positions)
        checked = [(j, i) for j, i in enumerate(self._pointer_positions) if i not in self.known_aligned]
        bits = [f"((args[{i}].data_ptr() & 15) == 0) << {n - 1 - j}" for j, i in checked]
        # the known-aligned arguments' bits are as at the first launch (aligned, by the wrapper's word)
        known = key & ~sum(1 << (n - 1 - j) for j, _ in checked)
        key_expr = " | ".join(bits) or "0"
        scope = {"get": self._launchers.get, "general": TritonLauncher.run, "self": self}
        parts = getattr(self._launchers.get(key), "static_parts", None)
        knobs = _runtime_knobs()
        enter, exit = knobs.launch_enter_hook, knobs.launch_exit_hook
        if parts is not None and not _hook_set(enter) and not _hook_set(exit):
            scope.update(parts, enter=enter, exit=exit)
            kept = "".join(f"args[{i}], " for i in (parts["keep"] if parts["keep"] is not None else range(n_args)))
            gx, gy, gz = self.grid
            # a profiler's hook: a new hook object, or (Triton 3.9) one added to the empty HookChain
            hooked = "knobs.launch_enter_hook is not enter or knobs.launch_exit_hook is not exit"
            hooked += "".join(f" or {name}.calls" for name, hook in (("enter", enter), ("exit", exit))
                              if hasattr(hook, "calls"))
            source = ("def run(*args):\n"
                      f"    if ({key_expr}) != {key & ~known} or {hooked}:\n"
                      "        return general(self, *args)\n"
                      f"    c_launch(function, {gx}, {gy}, {gz}, warps, shared, types, ({kept}*extra),"
                      " get_stream(get_device()))\n")
        else:
            source = ("def run(*args):\n"
                      f"    launch = get({key_expr}{f' | {known}' if known else ''})\n"
                      "    if launch is None:\n"
                      "        return general(self, *args)\n"
                      "    launch(args)\n")
        exec(compile(source, f"<launcher {self.fn.__name__}>", "exec"), scope)
        return scope["run"]

    def _direct_launch(self, compiled, static_only: bool = False):
        """A closure that launches the compiled kernel with everything precomputed: through
        torch's prebuilt launcher where it applies (``StaticKernel``), else through the C launcher
        Triton builds for the kernel's signature. ``static_only``: None instead of the latter."""
        static = StaticKernel.load(compiled)
        if static is not None:
            return self._static_launch(static)
        if static_only:
            return None
        gx, gy, gz = self.grid
        get_device, get_stream = _stream_getters()
        knobs = _runtime_knobs()

        c_launch = compiled.run  # property: loads the module (and builds the C launcher) on first use
        function, metadata = compiled.function, compiled.packed_metadata
        constexprs = tuple(self.constants[name] for name in self._constexpr_order)

        def launch(args, gx=gx):
            if (knobs.launch_enter_hook is not None or knobs.launch_exit_hook is not None) and _profiler_listening(knobs):
                self._launch_through_triton(args, (gx, gy, gz))  # let Triton call the profiler's hooks
                return
            c_launch(gx, gy, gz, get_stream(get_device()), function, metadata, None, None, None,
                     *args, *constexprs)

        return launch

    def _static_launch(self, static: StaticKernel):
        """A closure that launches a kernel loaded for torch's prebuilt launcher."""
        gx, gy, gz = self.grid
        get_device, get_stream = _stream_getters()
        knobs = _runtime_knobs()
        keep, extra = static.keep, static.extra
        c_launch, function, warps, shared, types = static.launch, static.function, static.num_warps, static.shared, static.types

        def launch(args, gx=gx):
            if (knobs.launch_enter_hook is not None or knobs.launch_exit_hook is not None) \
                    and _profiler_listening(knobs):
                self._launch_through_triton(args, (gx, gy, gz))  # let Triton call the profiler's hooks
                return
            if keep is not None:
                args = tuple(args[i] for i in keep)
            c_launch(function, gx, gy, gz, warps, shared, types, (*args, *extra), get_stream(get_device()))

        # what _specialized_run writes into a generated run (the launch without this frame)
        launch.static_parts = {"c_launch": c_launch, "function": function, "warps": warps, "shared": shared,
                               "types": types, "keep": keep, "extra": extra, "knobs": knobs,
                               "get_stream": get_stream, "get_device": get_device}
        return launch

    @property
    def _constexpr_order(self) -> list[str]:
        names = list(inspect.signature(self.fn.fn).parameters)
        return [n for n in names if n in self.constants]


def _fast_path_possible(fn, constants: dict) -> bool:
    """Direct launches need a real compiled kernel (no interpreter), Triton >= 3.3's ``run``
    signature (all bound arguments, constexprs last), and constexprs after every runtime argument."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("TINY_TRITON_DIRECT_LAUNCH", "1") == "0":
        return False
    try:
        if _triton_version() < (3, 3):
            return False
        _runtime_knobs()
        names = list(inspect.signature(fn.fn).parameters)
    except (ImportError, AttributeError, ValueError):
        return False
    first_constant = min((names.index(n) for n in constants if n in names), default=len(names))
    return all(n in constants for n in names[first_constant:])


# --------------------------------------------------------------------------- parallel compilation
_compile_pool = None
#: the threads that compile kernels queued for worker processes that are still starting, once the
#: main thread waits for them: two, since Triton's compiler holds the GIL for much of its work
_take_over_pool = None
TAKE_OVER_THREADS = 2
#: take-overs of kernels queued while no worker was ready, not yet started (see ``await_kernel``)
_queued_take_overs: list = []
_queued_lock = threading.Lock()
_driver_ready = None   # the future of warm_up_driver's job


def warm_up_driver() -> None:
    """Start Triton's CUDA driver in a background thread (once): importing triton and, in a cold
    cache, building its ``cuda_utils`` module with gcc. Called when the backend is looked up,
    it overlaps with TorchDynamo's import (the first FakeTensorMode) instead of delaying the
    first kernel's compile. Kernel compiles wait for it (one driver, built once).
    ``TINY_TRITON_WARMUP=0`` turns it off."""
    global _driver_ready
    if _driver_ready is not None or os.environ.get("TINY_TRITON_WARMUP", "1") == "0":
        return
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return

    def job():
        from triton.runtime import driver  # (on the warm-up thread: triton is slow to import)

        driver.active.get_current_target()

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiny_triton_driver")
    _driver_ready = pool.submit(job)
    pool.shutdown(wait=False)


def precompile(launcher: TritonLauncher, example_args: tuple):
    """Compile ``launcher``'s kernel in the background; returns the future of the kernel loaded
    for torch's prebuilt launcher (a :class:`StaticKernel`, or None where that launcher does not
    apply), or None.

    A wrapper module builds all its launchers when it loads, so a graph's kernels compile side
    by side instead of one per first launch. ``example_args`` stand for the runtime arguments:
    a torch dtype per pointer (Triton's ``warmup`` takes it as a 16-byte-aligned tensor, the
    usual case) and the sizes. The first launch with aligned pointers then launches the kernel
    loaded here; a differently aligned pointer compiles its own variant (Triton's front door).
    Once worker processes are started (runtime/compile_worker.py), the compile itself runs in one
    of them (while none is ready yet and a caller waits for it, one of ``TAKE_OVER_THREADS`` threads
    takes it unless a worker does first: :func:`await_kernel`), on its own core, at the priority the
    loading module asked for (``compile_priority``; longer kernels first), and the worker sends
    back the kernel's binary (``KernelBinary``): a thread here only loads its cubin. Without
    workers, or where the worker could not describe the kernel, the compile runs in a thread
    (threads overlap Triton's ptxas and gcc subprocesses), which also loads the kernel, or else
    builds Triton's C launcher for its signature (gcc, in a cold cache). ``TINY_TRITON_PARALLEL_COMPILE=0`` turns it off.
    """
    global _compile_pool, _take_over_pool
    if os.environ.get("TINY_TRITON_PARALLEL_COMPILE", "1") == "0":
        return None
    if _compile_pool is None:
        workers = int(os.environ.get("TINY_COMPILE_THREADS", 0)) or min(16, max(2, os.cpu_count() or 2))
        _compile_pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tiny_triton_compile")
        _take_over_pool = ThreadPoolExecutor(max_workers=TAKE_OVER_THREADS, thread_name_prefix="tiny_triton_take_over")
    fn, grid, constants, options = launcher.fn, launcher.grid, dict(launcher.constants), launcher._options()
    device = torch.cuda.current_device() if torch.cuda.is_available() else None

    def load(binary: KernelBinary | None = None) -> StaticKernel | None:
        start = time.perf_counter()
        try:
            return _load(binary)
        finally:
            log_event(f"load {fn.fn.__name__}" + (" (binary)" if binary is not None else ""), start,
                      time.perf_counter())

    def _load(binary: KernelBinary | None) -> StaticKernel | None:
        with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
            if binary is not None:  # a worker compiled it: load its cubin, no Triton here
                kernel = StaticKernel.from_binary(binary, device)
                if kernel is not None:
                    return kernel
            if _driver_ready is not None:
                try:
                    _driver_ready.result()
                except Exception:  # the compile below makes the driver itself (and raises its error)
                    pass
            # a worker compiled it into Triton's disk cache (found there), or else it compiles here,
            # raising a real compile error with its own message
            compiled = fn.warmup(*example_args, grid=grid, **constants, **options)
            # load it for torch's prebuilt launcher, or else build Triton's C launcher for its
            # signature (a gcc run per new signature in a cold cache): here, in parallel, not at
            # the first launch
            kernel = StaticKernel.load(compiled)
            if kernel is None:
                init = getattr(compiled, "_init_handles", None)
                if init is not None:
                    init()
            return kernel

    workers = compile_workers() if is_generated(fn.fn.__code__.co_filename) else None
    if workers is None:
        return _compile_pool.submit(load)
    # the same kernel source with the same arguments, already asked for (compile_early's module, or
    # another graph's): its compile is shared
    key = (fn.fn.__name__, fn.src, tuple(example_args), grid, tuple(constants.items()), tuple(options.items()), device)
    if key in _started:
        return _started[key]
    spec = specialization(fn, example_args, grid, constants, options, device)
    if spec is None:  # this Triton records no specialisation, or the kernel is compiled already
        return _compile_pool.submit(load)
    job = KernelJob(fn.fn.__module__, fn.fn.__name__, fn.src, bool(fn.debug), spec, device or 0)
    in_worker = workers.submit(job, priority=_priority.get(), size=len(fn.src))
    done: Future = Future()
    _started[key] = done

    def loaded(answer: Future) -> None:
        # a thread is taken only once the worker has answered (with an error, or ended: the
        # compile then runs here), so that no thread waits behind the workers' queue
        if answer.cancelled():  # a thread took the job while the workers were starting
            return
        binary = answer.result() if answer.exception() is None else None
        _compile_pool.submit(load, binary).add_done_callback(lambda f: _settle(done, f))

    def take_over() -> None:
        # the workers are still starting (importing Triton, warming the compiler: a second) and a
        # caller waits: one of a few threads compiles the kernel here unless a worker has taken it
        # meanwhile, so that a small graph's few kernels do not wait for the pool
        if in_worker.cancel():
            try:
                done.set_result(load())
            except BaseException as e:  # noqa: BLE001 - the first launch raises it
                done.set_exception(e)

    in_worker.add_done_callback(loaded)
    if workers.ready == 0:
        with _queued_lock:
            _queued_take_overs.append(take_over)
    return done


_capturing = threading.local()  # .spec: where specialization() records what Triton would compile


def _capture_hook(previous):
    """Triton's ``jit_cache_hook``, called with a compile's specialisation just before it would
    compile: in a thread inside :func:`specialization` it records that and skips the compile;
    elsewhere it leaves the call to the hook that was there before (if any)."""

    def hook(*args, **kwargs):
        if getattr(_capturing, "spec", False) is None:
            _capturing.spec = kwargs["compile"]["specialization_data"]
            return True  # compile nothing
        return previous(*args, **kwargs) if previous is not None else None

    hook.tiny_capture = True
    return hook


def specialization(fn, example_args: tuple, grid, constants: dict, options: dict, device: int | None) -> str | None:
    """How Triton would specialise ``fn`` for ``example_args`` (a torch dtype per pointer, taken as
    16-byte aligned, and the sizes), as the JSON record its ``JITFunction.preload`` compiles from:
    argument types and alignments, constexprs, options, target. Worked out by Triton's own binder,
    stopped just before it compiles (``knobs.runtime.jit_cache_hook``), so that a compile worker,
    which has no torch to bind arguments with, compiles exactly what a launch here would.

    None where this Triton has no such hook, or when ``fn`` is already compiled for these
    arguments in this process (Triton then compiles nothing and asks no hook)."""
    try:
        knobs = _runtime_knobs()
    except ImportError:  # Triton before 3.4
        return None
    if not getattr(knobs.jit_cache_hook, "tiny_capture", False):
        knobs.jit_cache_hook = _capture_hook(knobs.jit_cache_hook)
    _capturing.spec = None
    try:
        with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
            fn.warmup(*example_args, grid=grid, **constants, **options)
        return _capturing.spec
    finally:
        del _capturing.spec


#: (kernel name, source, example arguments, launch options, device) -> the future of its compile in
#: a worker process (precompile): each kernel is compiled once per process
_started: dict[tuple, Future] = {}


def compile_early(module_source: str) -> None:
    """Start compiling a Triton kernel while the rest of its graph is being generated:
    ``module_source`` (the kernel and its ``TritonLauncher`` with their imports, from
    codegen/triton.py) is loaded as a module of its own, whose launcher asks the workers to compile
    it now (:func:`precompile`); the graph's module, loaded later, finds that compile under the same
    key and shares it. Without worker processes nothing is done: the graph's module starts the
    compile when it loads.

    Submitted only when the module loads, a backward's kernels would start compiling after all of
    its code generation, and its first call would wait for what is left (BART's training step on
    the H200 host: 33 kernels, a second and a half of compiles on sixteen workers, 0.74 s waited;
    compiled as generated, none)."""
    if compile_workers() is not None:
        PyCodeCache.load(module_source)


def await_kernel(future: Future):
    """``future.result()`` for a kernel of :func:`precompile`. Before blocking, kernels queued while
    no worker process was ready are handed to the take-over threads, if still none is ready.

    Not earlier: until a caller waits, the main thread is compiling (the backward, the next graph),
    and threads compiling kernels beside it would take the GIL from it for kernels that the workers,
    ready seconds later, compile in a fraction of the time (OPT's training forward, H200 host: its
    first two kernels took 2.1 and 2.5 s in threads, the workers' took 0.1-1 s)."""
    if not future.done():
        with _queued_lock:
            queued = list(_queued_take_overs)
            _queued_take_overs.clear()
        workers = compile_workers()
        if workers is None or workers.ready == 0:  # (none left alive: each job has failed over to a thread)
            for take_over in queued:
                _take_over_pool.submit(take_over)
    return future.result()


def _settle(future: Future, source: Future) -> None:
    error = source.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(source.result())


#: the priority of the kernels of a module being loaded: 0 for what the next call runs, 1 for a
#: backward's (needed only after the forward has run)
_priority: contextvars.ContextVar[int] = contextvars.ContextVar("tiny_compile_priority", default=0)


@contextlib.contextmanager
def compile_priority(priority: int):
    """Kernels of modules loaded in this block are compiled at ``priority`` (lower goes first)."""
    token = _priority.set(priority)
    try:
        yield
    finally:
        _priority.reset(token)
