"""Test helpers: compile a function with tininductor and compare it with eager.

On a machine without CUDA the Triton kernels run in the interpreter, so this module sets
``TRITON_INTERPRET=1`` on import (before any ``triton.jit``); on the GPU machine the same
tests run real Triton on CUDA.
"""
from __future__ import annotations

import os
from unittest import mock

import torch

from . import config
from .compile_fx import compile_fx

DEVICE = os.environ.get("TINY_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")


def patch_config(obj, **values):
    """Temporarily set attributes of a config object (``tininductor.config`` or ``config.triton``):
    the standard library's ``unittest.mock.patch.multiple``, which also refuses a name the object lacks."""
    return mock.patch.multiple(obj, **values)


def compile_graph(fn, args, backend: str | None = None, **options):
    """symbolic_trace ``fn`` and compile it with ``compile_fx`` (no Dynamo: fast), raising on errors.
    ``backend``: the CPU backend ("cpp" / "triton"; default ``$TINY_CPU_BACKEND``, else triton);
    ``options``: ``tininductor.config`` settings for this compile (``force_shape_padding=True``...)."""
    gm = torch.fx.symbolic_trace(fn) if not isinstance(fn, torch.fx.GraphModule) else fn
    backend = backend or os.environ.get("TINY_CPU_BACKEND", "triton")
    with patch_config(config, fallback_to_eager=False, cpu_backend=backend, **options):
        return compile_fx(gm, list(args))


def check(fn, *args, atol=None, rtol=None, kernels=None, equal_nan=True):
    """Compile ``fn``, run it on ``args``, compare with eager; optionally check the kernel count."""
    compiled = compile_graph(fn, args)
    expected = fn(*args)
    actual = compiled(*args)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=equal_nan, check_stride=False)
    if kernels is not None:
        assert len(compiled.kernels) == kernels, (
            f"expected {kernels} generated kernel(s), got {len(compiled.kernels)}: {compiled.kernels}\n{compiled.source}"
        )
    return compiled
