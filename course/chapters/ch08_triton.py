"""Chapter 8's helpers: plug the learner's Triton backend into tininductor's compiler, compile a
function on the Triton path and show the kernels it generated. Not exercises.

``use_mini_backend(ch.MiniTritonScheduling)`` takes the backend from the chapter module the caller
loaded (the learner's file or the reference answers), so nothing here imports either.
"""
from __future__ import annotations

import contextlib
import os

import torch

from course.chapters.ch07_loop_ir import compile_aten

if not torch.cuda.is_available():  # read by @triton.jit when it decorates: set it before any kernel exists
    os.environ.setdefault("TRITON_INTERPRET", "1")


@contextlib.contextmanager
def use_mini_backend(scheduling: type):
    """Generate every Triton kernel with ``scheduling`` (the chapter's ``MiniTritonScheduling``)
    while inside the ``with``; the package's Triton backend is registered again afterwards."""
    from tininductor.codegen import (
        common,
        triton as package_triton,  # registers the package's backends first
    )

    old = {k: common.backends.get(k) for k in ("cuda", "cpu_triton")}
    common.register_backend("cuda", scheduling)
    common.register_backend("cpu_triton", scheduling)
    try:
        yield
    finally:
        for k, v in old.items():
            common.backends[k] = v if v is not None else package_triton.TritonScheduling


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
