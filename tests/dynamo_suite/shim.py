"""A pytest plugin that routes PyTorch's dynamo tests to tinydynamo (``-p tests.dynamo_suite.shim``).

PyTorch's test/dynamo files compile through ``torch.compile(..., backend=...)``,
``torch._dynamo.optimize(backend)`` and ``torch._dynamo.optimize_assert(backend)``, and reset
between tests with ``torch._dynamo.reset``. This plugin rebinds those names (where the test files
and ``torch._dynamo.testing`` / ``test_case`` look them up) to tinydynamo's, before the test
modules are imported. Everything else stays torch's: ``CompileCounter``, ``same`` and
``EagerAndRecordGraphs`` are plain FX backends and helpers that work on tinydynamo's graphs too.

Backend names map to tinydynamo's: "eager" and "aot_eager" are the same ideas; torch's compiler
backends ("inductor", the default, and "aot_eager_decomp_partition") become tinydynamo's
"eager", since these tests check the front end and tininductor's C++ builds would only slow
them down. ``torch._dynamo.config`` patches reach torch's config; the settings tinydynamo has under the same name
and meaning (:data:`MIRRORED_SETTINGS`) are copied to tinydynamo's config while a frame compiles.
``torch._dynamo.disable`` stays torch's (torch's own code calls it): tinydynamo honours its mark.
``torch._dynamo.exc.Unsupported``, as the tests read it (``assertRaises(torch._dynamo.exc.Unsupported)``
around a ``fullgraph=True`` call that cannot be captured), is tinydynamo's Unsupported.
"""
from __future__ import annotations

import torch
import torch._dynamo
import torch._dynamo.eval_frame
import torch._dynamo.exc
import torch._dynamo.test_case
import torch._dynamo.testing

import tinydynamo
import tinydynamo.eval_frame

#: torch backend name -> tinydynamo backend name
BACKENDS = {"eager": "eager", "aot_eager": "aot_eager", "inductor": "eager",
            "aot_eager_decomp_partition": "aot_eager", "aot_eager_default_partitioner": "aot_eager",
            "eager_noexcept": "eager", "cudagraphs": "eager"}

_torch_reset = torch._dynamo.reset

#: torch._dynamo.config settings that mean the same in tinydynamo.config: a test's
#: ``@torch._dynamo.config.patch(capture_scalar_outputs=True)`` holds for tinydynamo's compile too
MIRRORED_SETTINGS = ("capture_scalar_outputs",)
_tiny_convert_frame = tinydynamo.eval_frame.convert_frame


def convert_frame(*args, **kwargs):
    """tinydynamo's frame compiler, under the torch settings of :data:`MIRRORED_SETTINGS` as they are now."""
    with tinydynamo.config.patch({name: getattr(torch._dynamo.config, name) for name in MIRRORED_SETTINGS}):
        return _tiny_convert_frame(*args, **kwargs)


def tiny_backend(b):
    """A torch backend (a name or a callable ``(gm, example_inputs)``) as tinydynamo takes it."""
    if b is None:
        return "eager"
    if isinstance(b, str):
        return BACKENDS.get(b, b)
    return b


def reset() -> None:
    _torch_reset()
    tinydynamo.reset()


def compile(model=None, *, fullgraph: bool = False, dynamic=None, backend="inductor", mode=None,
            options=None, disable: bool = False):
    """``torch.compile`` with tinydynamo (``mode``/``options`` configure inductor: ignored)."""
    if disable:
        return model if model is not None else (lambda m: m)
    return tinydynamo.compile(model, backend=tiny_backend(backend), fullgraph=fullgraph, dynamic=dynamic)


def optimize(backend="inductor", *, nopython: bool = False, dynamic=None, disable: bool = False, **_ignored):
    """``torch._dynamo.optimize(backend, nopython=...)`` with tinydynamo."""
    if disable:
        return lambda fn: fn
    return tinydynamo.optimize(tiny_backend(backend), nopython=nopython, dynamic=dynamic)


def optimize_assert(backend, *, dynamic=None, **_ignored):
    """``torch._dynamo.optimize_assert``: the whole frame in one graph (``nopython=True``)."""
    return tinydynamo.optimize(tiny_backend(backend), nopython=True, dynamic=dynamic)


def install() -> None:
    """Rebind the compile entry points (idempotent)."""
    torch.compile = compile
    for module in (torch._dynamo, torch._dynamo.eval_frame, torch._dynamo.testing):
        for name, value in (("optimize", optimize), ("optimize_assert", optimize_assert)):
            if hasattr(module, name):
                setattr(module, name, value)
    for module in (torch._dynamo, torch._dynamo.testing, torch._dynamo.test_case):
        module.reset = reset
    torch._dynamo.run = tinydynamo.run
    torch._dynamo.exc.Unsupported = tinydynamo.Unsupported  # what a fullgraph compile raises where it cannot capture
    tinydynamo.eval_frame.convert_frame = convert_frame
    torch.compiler.reset = reset


def pytest_configure(config) -> None:
    install()
