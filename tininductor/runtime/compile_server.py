"""The worker side of the compile pool (``compile_worker.py`` is the main process's side): the
forking process, its workers, and the one thing a worker does, compile a kernel from its
specialisation. Nothing here imports torch, so the pool is ready in the time Triton takes to
import and compile one small kernel (about a second and a half on the H200 host); a pool that
imported torch first was ready only after four to five seconds, while a small model's first
kernels waited for it.

A job is a :class:`KernelJob`: the kernel's ``@triton.jit`` source and its *specialisation*,
Triton's own JSON record of one compile (``serialize_specialization_data``: the argument types,
which pointers and sizes are 16-byte aligned, the constexprs, the compile options and the target).
The main process works it out with Triton's binder on the launch's real example arguments
(``triton_launcher.specialization``), and the worker hands it to ``JITFunction.preload``, the
entry Triton has for compiling a recorded specialisation ahead of its first launch. The worker
never binds arguments itself: Triton's argument specialiser is C++ that imports torch on first
use and keys its dtype cache by ``hash(dtype)``, so stand-in dtypes without torch would be both
slow and unsafe there.
"""
from __future__ import annotations

import dataclasses
import linecache
import os
import pickle
import signal
import struct
import sys
from typing import NamedTuple

_HEADER = struct.Struct("<Q")


def write(stream, obj) -> None:
    """Send one length-prefixed pickle down a pipe."""
    data = pickle.dumps(obj)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read(stream):
    """Read one length-prefixed pickle from a pipe (EOFError: the other end closed it)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("compile worker closed its pipe")
    (size,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(size))


class KernelJob(NamedTuple):
    """One kernel to compile: its ``@triton.jit`` function as Triton keeps it (``src``: from
    ``def`` on; ``debug``: compiled with device-side asserts), the module it was defined in
    (Triton checks a specialisation against the function's full name), the specialisation (JSON,
    see the module's docstring) and the device whose architecture it is for."""

    module: str
    name: str
    src: str
    debug: bool
    specialization: str
    device: int


# Triton's signature types -> the argument codes of torch's launcher (its StaticallyLaunchedCudaKernel)
_ARG_CODES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H",
              "u32": "I", "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "fp64": "d"}

#: what KernelBinary.of raises for a kernel torch's launcher cannot take (Triton's own launches it)
UNSUPPORTED = (NotImplementedError, KeyError, AttributeError, TypeError, ValueError)


@dataclasses.dataclass(frozen=True)
class KernelBinary:
    """A compiled kernel as torch's launcher takes it (``static_kernel.StaticKernel`` loads it):
    picklable, with nothing of Triton or torch in it.

    ``types``: one code per argument the cubin takes (``"O"`` a pointer); ``keep``: positions of
    the runtime arguments the cubin takes (Triton folds an int equal to 1 into the kernel as a
    constant; None when all are kept); ``extra``: how many trailing scratch-pointer arguments newer
    Tritons add (passed as null, as TorchInductor does).
    """

    cubin: str
    name: str
    types: str
    keep: tuple[int, ...] | None
    extra: int
    num_warps: int
    shared: int

    @classmethod
    def of(cls, compiled) -> "KernelBinary":
        """The binary of Triton's ``CompiledKernel``; raises one of :data:`UNSUPPORTED` where
        torch's launcher cannot take it (no single cubin, clusters, scratch memory, an argument
        type it cannot pass, another Triton)."""
        meta = compiled.metadata
        cubins = [p for p in compiled.metadata_group.values() if str(p).endswith(".cubin")]
        if len(cubins) != 1 or getattr(meta, "num_ctas", 1) != 1:
            raise NotImplementedError("no single cubin, or clusters")
        src = compiled.src
        names = src.fn.arg_names
        folded = {k[0] if isinstance(k, tuple) else names.index(k) for k in getattr(src, "constants", {})}
        keep, types = [], ""
        for i, name in enumerate(names):
            ty = src.signature.get(name, "constexpr")
            if ty == "constexpr" or i in folded:
                continue
            keep.append(i)
            types += "O" if ty.startswith("*") else _ARG_CODES[ty]  # KeyError: a type it cannot pass
        extra = 0
        for scratch in ("global_scratch_size", "profile_scratch_size"):
            if hasattr(meta, scratch):
                if getattr(meta, scratch):
                    raise NotImplementedError(f"{scratch} > 0")
                types += "O"
                extra += 1
        runtime = [i for i in range(len(names)) if i not in src.fn.constexprs]  # what a launch passes
        return cls(str(cubins[0]), compiled.name, types, None if keep == runtime else tuple(keep), extra,
                   meta.num_warps, meta.shared)


#: the module-level names a generated kernel uses (codegen/triton.py's header, less the launcher)
KERNEL_GLOBALS = "import triton\nimport triton.language as tl\nfrom tininductor.codegen import triton_helpers\n\n\n"


def jit_function(module: str, name: str, src: str, debug: bool = False):
    """The ``@triton.jit`` function ``name`` of ``src``, as if defined in module ``module``. Its
    source is registered with ``linecache`` (Triton reads a kernel's source back through
    ``inspect``)."""
    source = KERNEL_GLOBALS + ("@triton.jit(debug=True)\n" if debug else "@triton.jit\n") + src
    filename = f"<tininductor kernel {module}.{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict = {"__name__": module}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


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


def compile_job(job: KernelJob) -> KernelBinary | None:
    """Compile ``job``'s kernel into Triton's cache; its binary as torch's prebuilt launcher loads
    it (None where that launcher cannot take it: the main process then finds it in the cache)."""
    from triton.runtime import driver as triton_driver

    fn = jit_function(job.module, job.name, job.src, job.debug)
    triton_driver.active.set_current_device(job.device)
    compiled = fn.preload(job.specialization)
    try:
        return KernelBinary.of(compiled)
    except UNSUPPORTED:
        return None


#: a kernel compiled once before the workers fork (see :func:`warm_up`)
WARM_UP_SOURCE = """\
def tiny_worker_warm_up(ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(ptr + offsets, tl.load(ptr + offsets) + 1)
"""


def warm_up() -> None:
    """Compile a small kernel for the current device: the first run of Triton's compiler (MLIR,
    LLVM and ptxas loaded and initialised) takes about a second. The forking process pays it once,
    before it forks, so that no worker's first real kernel does. Its signature is written out here
    (no arguments to specialise on)."""
    try:
        import triton
        from triton.compiler import ASTSource
        from triton.runtime import driver as triton_driver

        fn = jit_function("tininductor.runtime.compile_server", "tiny_worker_warm_up", WARM_UP_SOURCE)
        source = ASTSource(fn, signature={"ptr": "*fp32", "BLOCK": "constexpr"}, constexprs={(1,): 128})
        triton.compile(source, target=triton_driver.active.get_current_target())
    except Exception:  # noqa: BLE001 - only a warm-up: a real job reports any error of its own
        pass


def serve(inp, out) -> None:
    """One worker: say it is ready, then compile each job it reads until the pipe closes."""
    write(out, "ready")
    while True:
        try:
            job = read(inp)
        except EOFError:  # the main process is gone
            return
        try:
            write(out, ("ok", compile_job(job)))
        except Exception as e:  # noqa: BLE001 - reported to the main process, which compiles it itself
            write(out, ("error", f"{type(e).__name__}: {e}"[:4000]))


def main(archs: list[int], fds: list[int]) -> None:
    """The forking process: import Triton and compile a first kernel for the devices' ``archs``
    (with no CUDA started, forking after it is safe), then fork one worker per pair of pipe ends
    (``fds``: its jobs' read end, its answers' write end) and wait for them."""
    exec(KERNEL_GLOBALS, {})  # Triton and the kernels' helpers, imported once, here, for every worker
    sys.stdout = sys.stderr  # the pipes carry pickles only; a stray print goes to stderr
    offline_driver(archs)
    warm_up()
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
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in workers:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    for _ in workers:  # else they end when the main process closes their pipes (or dies)
        os.wait()


if __name__ == "__main__":
    # run through the module's own name, so that what the workers pickle (KernelBinary) names this
    # module, not ``__main__``, when the main process reads it
    from tininductor.runtime import compile_server

    compile_server.main([int(arch) for arch in sys.argv[1].split(",")], [int(fd) for fd in sys.argv[2:]])
