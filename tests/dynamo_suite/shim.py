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
An Unsupported that tinydynamo raises (a ``fullgraph=True`` call that cannot be captured) is also an
instance of ``torch._dynamo.exc.Unsupported``, the class the tests' ``assertRaises`` name.
"""
from __future__ import annotations

import torch
import torch._dynamo
import torch._dynamo.eval_frame
import torch._dynamo.exc
import torch._dynamo.test_case
import torch._dynamo.testing
import torch._dynamo.utils

import tinydynamo
import tinydynamo.eval_frame
import tinydynamo.exc

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
    """tinydynamo's frame compiler, under the torch settings of :data:`MIRRORED_SETTINGS` as they are now.
    An Unsupported it raises (fullgraph) is also torch's ``Unsupported`` (:func:`as_torch_unsupported`);
    torch's ``counters["frames"]`` count the frames tried (``total``) and compiled (``ok``), as torch's do."""
    with tinydynamo.config.patch({name: getattr(torch._dynamo.config, name) for name in MIRRORED_SETTINGS}):
        frames = torch._dynamo.utils.counters["frames"]  # torch's frame counters: frames tried, frames compiled
        frames["total"] += 1
        try:
            entry = _tiny_convert_frame(*args, **kwargs)
        except tinydynamo.exc.Unsupported as e:
            raise as_torch_unsupported(e) from e.__cause__
        if entry is not None:
            frames["ok"] += 1
        return entry


_TORCH_UNSUPPORTED: dict[type, type] = {}


def as_torch_unsupported(e: "tinydynamo.exc.Unsupported") -> BaseException:
    """``e`` as an instance of a class deriving from both its own class and ``torch._dynamo.exc.Unsupported``:
    the tests' ``assertRaises(Unsupported)`` name torch's class for the same meaning (a construct the
    compiler cannot capture, raised under fullgraph). Same message, attributes and traceback."""
    cls = type(e)
    if isinstance(e, torch._dynamo.exc.Unsupported):
        return e
    if cls not in _TORCH_UNSUPPORTED:
        _TORCH_UNSUPPORTED[cls] = type(cls.__name__, (cls, torch._dynamo.exc.Unsupported), {"__module__": cls.__module__})
    mapped = BaseException.__new__(_TORCH_UNSUPPORTED[cls], *e.args)
    mapped.__dict__.update(e.__dict__)
    mapped.msg = str(e)
    return mapped.with_traceback(e.__traceback__)


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


class ExportedFunction:
    """What ``torch._dynamo.export(f)(*args)`` returns first: called as ``f`` is (the exported graph and the
    code rebuilding ``f``'s return value, :func:`tinydynamo.export`'s ``call_like_f``), the graph module's
    attributes otherwise."""

    def __init__(self, gm):
        self.graph_module = gm

    def __call__(self, *args, **kwargs):
        return self.graph_module.meta["call_like_f"](*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.graph_module, name)


def export(f, *extra_args, aten_graph: bool = False, decomposition_table=None, **_ignored):
    """``torch._dynamo.export`` with tinydynamo's: one graph (a break raises torch's ``Unsupported``)."""
    def inner(*args, **kwargs):
        try:
            gm, guards = tinydynamo.export(f, aten_graph=aten_graph, decomposition_table=decomposition_table)(
                *args, **kwargs)
        except tinydynamo.exc.Unsupported as e:
            raise as_torch_unsupported(e) from e.__cause__
        return torch._dynamo.eval_frame.ExportResult(ExportedFunction(gm), guards)

    return inner(*extra_args) if extra_args else inner


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
    torch._dynamo.export = torch._dynamo.eval_frame.export = export
    tinydynamo.eval_frame.convert_frame = convert_frame
    torch.compiler.reset = reset


def pytest_configure(config) -> None:
    install()
