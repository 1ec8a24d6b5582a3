"""Backends: what turns a captured ``torch.fx.GraphModule`` into something to call.

The contract is torch.compile's: ``backend(gm, example_inputs) -> callable``. Backends are
found by name in a registry of lazy ``"module:attr"`` paths (so "tininductor" costs nothing
until used, and PyTorch's own "inductor" plugs in the same way), or passed as callables.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterator

import torch.fx

from tinydynamo import config

Backend = Callable[[torch.fx.GraphModule, list], Callable]


def eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Run the captured graph as it is (checks capture alone)."""
    return gm.forward


_BACKENDS: dict[str, Any] = {
    "eager": eager,
    "aot_eager": "tininductor.aot_autograd:aot_eager",
    "tininductor": "tininductor.compile_fx:compile_fx",
    "inductor": "torch._inductor.compile_fx:compile_fx",
}


def register_backend(name: str, backend: Backend | str) -> None:
    """Add a backend: a callable, or a lazy ``"module:attr"`` path."""
    _BACKENDS[name] = backend


def list_backends() -> list[str]:
    return sorted(_BACKENDS)


def lookup_backend(backend: str | Backend | None) -> Backend:
    if backend is None:
        backend = config.default_backend
    if callable(backend):
        return _warmed_up(backend)
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use one of {list_backends()}, or pass a callable "
                         "backend(gm, example_inputs) -> callable")
    entry = _BACKENDS[backend]
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        try:
            entry = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"backend {backend!r} ({module_name}:{attr}) is not available: {e}") from e
        _BACKENDS[backend] = entry
    return _warmed_up(entry)


def _warmed_up(backend: Backend) -> Backend:
    """A backend may start background work (threads, worker processes) when it is chosen, through a
    ``warm_up()`` attribute: it then overlaps with capturing the frame (tininductor: Triton's driver and
    its compile workers). Nothing starts when a backend's module is imported."""
    warm_up = getattr(backend, "warm_up", None)
    if callable(warm_up):
        warm_up()
    return backend


def lookup_backend_with_options(backend: str | Backend | None, mode: str | None, options: dict | None) -> Backend:
    """``compile(..., mode=, options=)``: the backend configured by them (tininductor's ``with_options``)."""
    fn = lookup_backend(backend)
    if mode in (None, "default") and not options:
        return fn
    configure = getattr(fn, "with_options", None)
    if configure is None:
        raise ValueError(f"mode={mode!r}/options={options!r} configure the tininductor backend; backend "
                         f"{backend!r} takes none: drop them, or use backend='tininductor'")
    return configure(mode, options)


#: per frame being compiled: must a backend's error raise (fullgraph=True, suppress_errors=False)?
_strict: list[bool] = []


@contextlib.contextmanager
def compiling_frame(strict: bool) -> Iterator[None]:
    """While a frame compiles (tinydynamo.convert_frame): ``strict`` says whether it asked for errors.
    The user's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``) do not run on the values
    the trace and the backend save: only the compiled code's saves at run time reach them, as in eager."""
    _strict.append(strict)
    set_tracing = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)
    prior = set_tracing(True) if set_tracing is not None else None
    try:
        yield
    finally:
        _strict.pop()
        if set_tracing is not None:
            set_tracing(prior)


def errors_must_raise() -> bool:
    """Asked by backends that fall back to eager on their own errors: the frame being compiled
    asked for errors (``fullgraph=True`` or ``config.suppress_errors = False``), so raise instead."""
    return bool(_strict and _strict[-1]) or not config.suppress_errors
