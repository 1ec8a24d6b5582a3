"""Chapter 8's helpers: plug the learner's Triton backend into tininductor's compiler, compile a
function on the Triton path and show the kernels it generated. Not exercises.

``use_mini_backend(ch.MiniTritonScheduling)`` takes the backend from the chapter module the caller
loaded (the learner's file or the reference answers), so nothing here imports either.
"""
from __future__ import annotations

import os

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
