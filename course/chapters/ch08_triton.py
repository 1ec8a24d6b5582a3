"""Chapter 8's helpers: plug the learner's Triton backend into tininductor's compiler, compile a
function on the Triton path and show the kernels it generated. Not exercises.

``use_mini_backend(ch.MiniTritonScheduling)`` takes the backend from the chapter module the caller
loaded (the learner's file or the reference answers), so nothing here imports either.
"""
from __future__ import annotations

import contextlib
import os
import re
from unittest import mock

import torch

from course.chapters.ch07_loop_ir import compile_aten
from tininductor.codegen import common
from tinydynamo.registry import swap

if not torch.cuda.is_available():  # read by @triton.jit when it decorates: set it before any kernel exists
    os.environ.setdefault("TRITON_INTERPRET", "1")


def use_mini_backend(scheduling: type):
    """Generate every Triton kernel with ``scheduling`` (the chapter's ``MiniTritonScheduling``)
    while inside the ``with`` (a swap of the backend registry, checked as ``register_backend``
    checks a backend); the package's Triton backend stands again afterwards."""
    # imported here, not at the top: Triton is heavy. Importing it registers the package's Triton
    # backends, which the swap saves and puts back.
    import tininductor.codegen.triton  # noqa: F401

    for device_type in ("cuda", "cpu_triton"):
        common.check_backend(device_type, scheduling)
    return swap(common.backends, {"cuda": scheduling, "cpu_triton": scheduling})


#: compile ``fn`` on the Triton path (interpreter on CPU), raising on errors: chapter 7's
#: ``compile_aten`` (composite ops lowered through their decompositions, kernels named after them)
compile_triton = compile_aten


def kernel_source(compiled, index: int = 0) -> str:
    """The source of the ``index``-th generated ``@triton.jit`` kernel of a compiled graph."""
    src = compiled.source
    starts = [i for i in range(len(src)) if src.startswith("@triton.jit", i)]
    start = starts[index]
    end = src.find("\n\n\n", start)
    return src[start:end if end >= 0 else None]


def torchinductor_triton_kernels(fn, args) -> list[str]:
    """TorchInductor's own Triton kernels for ``fn(*args)``, as source text (PyTorch's side of the
    chapter's side-by-side).

    On a GPU this is ``torch._inductor.utils.run_and_get_code``: compile, run, and keep the
    generated module, whose kernels are the strings passed to ``async_compile.triton``. Without a
    GPU, TorchInductor still writes Triton for the CPU (``torch._inductor.config.cpu_backend =
    "triton"``) but cannot compile it (Triton has no CPU driver here); the kernels are then taken
    as the scheduler defines them (its caches off, so that it generates them), with the one
    question to the missing driver (the backend hash in each kernel's metadata) answered by a
    placeholder. Torch-internal names: if they move in another torch version, the error says so
    and nothing else in the chapter depends on it.
    """
    # TorchInductor's modules take seconds to import, and only this side-by-side needs them
    import torch._dynamo
    from torch._inductor import config as inductor_config
    from torch._inductor.codegen import triton as inductor_triton
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()  # compile afresh, not from torch.compile's cache of an earlier cell
    if args and args[0].is_cuda:
        _, modules = run_and_get_code(torch.compile(fn, backend="inductor"), *args)
        return [src for module in modules
                for src in re.findall(r"async_compile\.triton\('\w+', '''\n(.*?)''', device_str", module, re.S)]
    kernels = []
    define_kernel = inductor_triton.TritonScheduling.define_kernel

    def keep(self, src_code, node_schedule, kernel):
        kernels.append(src_code.strip("\n"))
        return define_kernel(self, src_code, node_schedule, kernel)

    with inductor_config.patch(cpu_backend="triton", force_disable_caches=True), \
            mock.patch("torch.utils._triton.triton_hash_with_backend", lambda: "no-gpu"), \
            mock.patch.object(inductor_triton.TritonScheduling, "define_kernel", keep), \
            contextlib.suppress(Exception):  # the kernels cannot run here; only their source is wanted
        torch.compile(fn, backend="inductor")(*args)
    if not kernels:
        raise RuntimeError("TorchInductor generated no Triton kernel here: this torch version's internals moved "
                           "(TritonScheduling.define_kernel, torch.utils._triton.triton_hash_with_backend)")
    return kernels
