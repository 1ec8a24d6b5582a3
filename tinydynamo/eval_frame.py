"""Entry points and the cache: ``optimize``, ``compile``, ``disable``, ``reset``, ``OptimizedModule``.

Pure Python cannot install CPython's frame-evaluation hook (PEP 523), so tinydynamo wraps the
callable instead. Each call binds the arguments into ``L`` (the frame's locals), then looks up
the cache of the function's code object: a list of entries ``(guards, compiled frame)``, newest
first. The first entry whose guards pass runs. A miss asks :mod:`tinydynamo.convert_frame` for a
new entry (it logs the failing guards; after ``config.recompile_limit`` entries, or when the frame
cannot be captured, the frame runs eagerly, with its reason recorded, and raised with
``nopython=True`` / ``fullgraph=True``).

What the frame hook would do for the frames a compiled frame calls at a graph break (compile them
too), :func:`wrap_for_resume` does: convert_frame passes it down to the code it generates.
"""
from __future__ import annotations

import builtins
import contextlib
import copy
import dataclasses
import functools
import inspect
import keyword
import types
import warnings
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.nn.modules import module as module_mod
from torch.utils._python_dispatch import any_torch_dispatch_mode_on_stack

from tinydynamo import config, distributed, symbolic_shapes, trace_rules
from tinydynamo.backends import lookup_backend, lookup_backend_with_options
from tinydynamo.convert_frame import _eager_code_compiling_callees, convert_frame, counters
from tinydynamo.exc import EagerFallbackWarning
from tinydynamo.output_graph import CompiledFrame
from tinydynamo.registry import swap
from tinydynamo.variables.functions import is_library_function, is_torch_internal
from tinydynamo.variables.nn_module import _has_hooks


@dataclasses.dataclass
class FrameCache:
    """Everything tinydynamo remembers about one code object (PyTorch: the code object's
    ``ExtraState`` with its list of ``CacheEntry``)."""

    entries: list[CompiledFrame] = dataclasses.field(default_factory=list)
    run_eagerly: str | None = None  # why this code object now always runs eagerly
    eager_code: types.CodeType | None = None  # what it runs then, if not its own code (tinydynamo.skip_frame)
    last_reason: str | None = None  # the latest recompile reason
    #: input source -> its sizes at the last compile, None where they changed (automatic dynamic)
    frame_state: dict = dataclasses.field(default_factory=dict)


def lookup_entry(entries: list[CompiledFrame], L: dict, G: dict, backend) -> CompiledFrame | None:
    """The first (newest) entry for ``backend`` whose guards pass on ``L``/``G``, else None (a miss)."""
    for entry in entries:
        if entry.backend is backend and entry.check_fn(L, G):
            return entry
    return None


def _fast_lookup(entries: list[CompiledFrame], L: dict, G: dict, backend) -> CompiledFrame | None:
    """lookup_entry without the CheckFunction wrapper call (the generated check catches errors itself)."""
    for entry in entries:
        if entry.backend is backend:
            try:  # free unless it raises (3.11+); the course's generated checks have no try of their own
                ok = entry.check_fn.check(L, G)
            except Exception:
                ok = False
            if ok:
                return entry
    return None


_lookup = {"fn": _fast_lookup}


@contextlib.contextmanager
def use_cache_lookup(fn) -> Iterator[None]:
    """Temporarily look entries up with ``fn(entries, L, G, backend)`` (the course plugs a learner's in)."""
    with swap(_lookup, {"fn": fn}):
        yield


_caches: dict[types.CodeType, FrameCache] = {}


def get_cache(code: types.CodeType) -> FrameCache:
    return _caches.setdefault(code, FrameCache())


#: called by :func:`reset`: a backend's own caches of compiled graphs register here
#: (tininductor's graph cache), so that after a reset everything compiles afresh
reset_hooks: list[Callable[[], None]] = []


def reset() -> None:
    """Forget every compiled frame and counter (like torch._dynamo.reset())."""
    _caches.clear()
    counters.clear()
    for hook in reset_hooks:
        hook()


_dispatch_stack_len = torch._C._len_torch_dispatch_stack

#: callables with no Python frame of their own (``torch.add``, ``torch.ops.aten.add.Tensor``, a partial):
#: compiled through a one-line Python function that calls them, as TorchDynamo wraps them
CALLABLES_WITHOUT_FRAMES = (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                            functools.partial, torch._ops.OpOverload, torch._ops.OpOverloadPacket)


def _calling(fn: Callable) -> types.FunctionType:
    """``lambda *args, **kwargs: fn(*args, **kwargs)`` with a code object of its own (its own cache)."""
    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    name = getattr(fn, "__name__", type(fn).__name__)
    call.__code__ = call.__code__.replace(co_name=name, co_qualname=f"calling_{name}")
    return functools.wraps(fn, assigned=("__name__", "__doc__"))(call) if hasattr(fn, "__name__") else call


def _user_function(fn: Callable) -> tuple[types.FunctionType, Any]:
    """(plain function, bound self or None) for a function or bound method."""
    if isinstance(fn, types.MethodType):
        return fn.__func__, fn.__self__
    if isinstance(fn, types.FunctionType):
        return fn, None
    if isinstance(fn, CALLABLES_WITHOUT_FRAMES):
        return _calling(fn), None
    raise TypeError(f"tinydynamo can compile Python functions, methods and nn.Modules, not {type(fn).__name__}")


def argument_binder(fn: types.FunctionType) -> types.FunctionType:
    """A function with ``fn``'s parameters that returns them by name: ``binder(*args, **kwargs)`` is
    the frame's arguments as ``fn``'s call would bind them, by CPython's own argument parsing (its
    errors, its keyword rules). It has no defaults of its own: the caller gives it ``fn``'s current
    ``__defaults__``/``__kwdefaults__`` (``inspect.Signature.bind`` does the same in ~10 us of Python)."""
    code = fn.__code__
    # a comprehension's code object takes ``.0`` (its iterator): not a name a ``def`` can have
    names = [n if n.isidentifier() and not keyword.iskeyword(n) else f"___arg{i}"
             for i, n in enumerate(code.co_varnames)]
    positional = list(names[:code.co_argcount])
    if code.co_posonlyargcount:
        positional.insert(code.co_posonlyargcount, "/")
    at = code.co_argcount + code.co_kwonlyargcount
    keyword_only = list(names[code.co_argcount:at])
    star = []
    if code.co_flags & inspect.CO_VARARGS:
        star, at = [f"*{names[at]}"], at + 1
    elif keyword_only:
        star = ["*"]
    double_star = [f"**{names[at]}"] if code.co_flags & inspect.CO_VARKEYWORDS else []
    params = positional + star + keyword_only + double_star
    bound = [p.lstrip("*") for p in params if p not in ("/", "*")]
    real = dict(zip(names, code.co_varnames))
    source = f"def bind({', '.join(params)}):\n    return {{{', '.join(f'{real[n]!r}: {n}' for n in bound)}}}\n"
    scope: dict = {}
    exec(builtins.compile(source, f"<arguments of {code.co_qualname}>", "exec"), scope)
    binder = scope["bind"]
    binder.__name__, binder.__qualname__ = code.co_name, code.co_qualname  # its errors name the function
    return binder


class OptimizedFunction:
    """A function wrapped by ``optimize``: each call checks the cache, compiling on a miss (PyTorch:
    ``_TorchDynamoContext``'s wrapper plus the C frame-evaluation hook)."""

    _tinydynamo_compiled = True  # how traced code recognises a compiled function (variables/builder.py)

    def __init__(self, fn: Callable, backend: Any, nopython: bool = False, dynamic: bool | None = None):
        self._orig_fn = fn
        self._dynamic = dynamic  # compile(dynamic=...): None (automatic), True (symbolic), False (static)
        self._fn, self._self = _user_function(fn)
        self._code = self._fn.__code__
        self._globals = self._fn.__globals__
        self._backend = lookup_backend(backend)
        self._nopython = nopython
        # the code's own parameters (a decorator's ``wrapper(*args, **kwargs)`` binds as that, not as
        # the function in its ``__wrapped__``)
        self._binder = argument_binder(self._fn)
        functools.update_wrapper(self, self._fn)

    def _bind(self, args: tuple, kwargs: dict, closure: tuple | None = None) -> dict[str, Any]:
        """The frame's locals ``L``: arguments by name (+ closure contents by name, and the cells
        themselves as ``L['___closure']`` for resume functions that need the real cells)."""
        if self._self is not None:
            args = (self._self, *args)
        fn, binder = self._fn, self._binder
        if binder.__defaults__ is not fn.__defaults__:  # the defaults as they are now (they may be rebound)
            binder.__defaults__ = fn.__defaults__
        if binder.__kwdefaults__ is not fn.__kwdefaults__:  # (a dict: changed in place, it is seen as well)
            binder.__kwdefaults__ = fn.__kwdefaults__
        L = binder(*args, **kwargs)
        closure = self._fn.__closure__ if closure is None else closure
        if closure:
            for name, cell in zip(self._code.co_freevars, closure):
                try:
                    L[name] = cell.cell_contents
                except ValueError:  # an empty cell: the frame assigns it later
                    pass
            L["___closure"] = closure
        return L

    def __call__(self, /, *args, **kwargs):  # (a keyword argument may be named self)
        return self._call(args, kwargs, None)

    def call_with_closure(self, closure: tuple, *args):
        """Call with these cells as the function's closure (a resume function of a frame with cells:
        one compiled function per code object, the cells of each call passed in)."""
        return self._call(args, {}, closure)

    def _call(self, args: tuple, kwargs: dict, closure: tuple | None):
        eager = self._orig_fn if closure is None else \
            types.FunctionType(self._code, self._globals, self._code.co_name, None, closure)
        if config.disable or trace_rules.is_disabled(self._orig_fn):  # TINY_DISABLE=1 / disable(fn)
            own_frame_only = None if config.disable else _nonrecursive_disabled(self._orig_fn)
            if own_frame_only is not None:
                _current_backend.append(self._backend)  # the backend its callees get
                try:
                    return own_frame_only(*args, **kwargs)
                finally:
                    _current_backend.pop()
            return eager(*args, **kwargs)
        if _dispatch_stack_len() and any_torch_dispatch_mode_on_stack():
            return eager(*args, **kwargs)  # a user's TorchDispatchMode is active: it sees eager's ops, as in TorchDynamo
        L = self._bind(args, kwargs, closure)
        G = self._globals
        cache = _caches.get(self._code) or get_cache(self._code)
        entry = _lookup["fn"](cache.entries, L, G, self._backend)  # newest entry whose guards pass
        if entry is None:
            if cache.run_eagerly is None:
                entry = self._compile(cache, L, G)
            if entry is None:
                return self._run_eagerly(cache, eager, args, kwargs)
        if entry.break_reason is None:  # one graph and no native calls: nothing asks for the backend
            return entry.run(L, G)
        _current_backend.append(self._backend)  # for the functions called natively at the break
        try:
            if self._dynamic is not None:  # functions compiled at the break follow this frame's dynamic=
                with config.patch(symbolic_shapes.policy_patch(self._dynamic)):
                    return entry.run(L, G)
            return entry.run(L, G)
        finally:
            _current_backend.pop()

    def _run_eagerly(self, cache: FrameCache, eager, args: tuple, kwargs: dict):
        """The frame runs natively: its own code, or the copy whose breaking call is compiled."""
        if cache.eager_code is None or self._nopython:
            return eager(*args, **kwargs)
        fn = types.FunctionType(cache.eager_code, eager.__globals__, eager.__name__, eager.__defaults__,
                                eager.__closure__)
        fn.__kwdefaults__ = eager.__kwdefaults__
        if isinstance(eager, types.MethodType):  # a module's forward: bound to the module
            fn = types.MethodType(fn, eager.__self__)
        _current_backend.append(self._backend)  # the backend the compiled callee gets
        try:
            return fn(*args, **kwargs)
        finally:
            _current_backend.pop()

    def __get__(self, obj, objtype=None):  # decorating a method: bind like a function would
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    def _compile(self, cache: FrameCache, L: dict, G: dict) -> CompiledFrame | None:
        """A cache miss: compile a new entry (tinydynamo.convert_frame), or None to run eagerly."""
        return convert_frame(self._fn, cache, L, G, self._backend, nopython=self._nopython, dynamic=self._dynamic,
                             wrap_for_resume=wrap_for_resume, call_resume_with_closure=call_resume_with_closure)


_resume_wrappers: dict = {}
_own_frame_only_codes: dict = {}


def _nonrecursive_disabled(fn: Any) -> Callable | None:
    """``torch._dynamo.disable(f, recursive=False)``: ``f``'s own frame runs natively, but the functions
    and modules it calls are compiled (tinydynamo.skip_frame), as TorchDynamo skips only that frame.
    None for any other function."""
    orig = getattr(fn, "_torchdynamo_orig_callable", None)
    if getattr(fn, "_torchdynamo_disable_recursive", True) is not False or not isinstance(orig, types.FunctionType):
        return None
    if orig.__code__ not in _own_frame_only_codes:
        _own_frame_only_codes[orig.__code__] = _eager_code_compiling_callees(orig.__code__, wrap_for_resume)
    code = _own_frame_only_codes[orig.__code__]
    if code is None:
        return orig
    own = types.FunctionType(code, orig.__globals__, orig.__name__, orig.__defaults__, orig.__closure__)
    own.__kwdefaults__ = orig.__kwdefaults__
    return own


def wrap_for_resume(fn: Any, backend: Any) -> Any:
    """What a transformed frame calls: resume functions, user functions and methods get compiled
    (their own graphs, guards, cache); a module called at a graph break runs its compiled forward
    (its hooks, if any, through the usual ``Module.__call__``); anything else as is.

    ``backend=None`` (a native call at a graph break) keeps the caller's backend if known. The
    wrappers are cached per (function, backend) and never hold the bound object or module: a method's
    ``self`` is passed at the call (so compiled code keeps no reference to it after the call returns).
    """
    if backend is None:
        backend = config.default_backend if _current_backend[-1] is None else _current_backend[-1]
    if isinstance(fn, (OptimizedFunction, OptimizedModule)) or trace_rules.is_disabled(fn):
        return fn
    if isinstance(fn, nn.Module):
        forward = getattr(type(fn), "forward", None)
        # torch.nn's own leaf modules (Linear, ...) run as they are; its containers (Sequential, ...)
        # are compiled, since the modules they call are the user's
        if type(fn).__call__ is not nn.Module.__call__ or not isinstance(forward, types.FunctionType) \
                or (is_torch_internal(forward) and not fn._modules) or is_library_function(forward) \
                or getattr(fn, "__dict__", {}).get("forward") is not None:
            return fn
        return functools.partial(_call_module, fn, _function_wrapper(forward, backend))
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        func = fn.__func__
        if is_torch_internal(func) or is_library_function(func):
            return fn
        return functools.partial(_function_wrapper(func, backend), fn.__self__)
    if isinstance(fn, types.FunctionType) and not is_torch_internal(fn) and not is_library_function(fn):
        return _function_wrapper(fn, backend)
    return fn


def _function_wrapper(fn: types.FunctionType, backend) -> "OptimizedFunction":
    dynamic = symbolic_shapes.current_policy()  # the calling frame's dynamic= (set in config while it compiles/runs)
    key = (fn, id(backend), dynamic)
    wrapper = _resume_wrappers.get(key)
    if wrapper is None:
        wrapper = _resume_wrappers[key] = OptimizedFunction(fn, backend, dynamic=dynamic)
    return wrapper


def _call_module(module: nn.Module, compiled_forward: "OptimizedFunction", *args, **kwargs):
    """``module(*args)`` at a graph break: the compiled forward, unless hooks ask for Module.__call__."""
    if _has_hooks(module):  # the hooks run natively (FSDP's all-gathers), around the compiled forward
        with distributed.compiled_forward(module, functools.partial(compiled_forward, module)):
            return module(*args, **kwargs)
    return compiled_forward(module, *args, **kwargs)


_current_backend: list = [None]


def optimize(backend: Any = None, nopython: bool = False, dynamic: bool | None = None) -> Callable[[Callable], Callable]:
    """``tinydynamo.optimize(backend)(fn)``: like ``torch._dynamo.optimize`` (``dynamic``: see :func:`compile`)."""
    backend_fn = lookup_backend(backend)

    def decorator(fn):
        if isinstance(fn, OptimizedModule):  # optimizing again: the original with the new backend
            fn = fn._orig_mod
        elif isinstance(fn, OptimizedFunction):
            fn = fn._orig_fn
        if isinstance(fn, nn.Module):
            return OptimizedModule(fn, backend_fn, nopython, dynamic)
        return OptimizedFunction(fn, backend_fn, nopython, dynamic)

    return _OptimizeDecorator(decorator)


class _OptimizeDecorator:
    """What ``optimize(backend)`` returns: a decorator. Like torch 2.x, not a context manager."""

    def __init__(self, decorator):
        self._decorator = decorator

    def __call__(self, fn):
        return self._decorator(fn)

    def __enter__(self):
        raise RuntimeError("tinydynamo.optimize(...) is used as a context manager; like torch._dynamo.optimize "
                           "in torch 2.x it is a decorator only: use tinydynamo.optimize(backend)(fn) or "
                           "tinydynamo.compile(fn)")

    def __exit__(self, *exc):
        return False


def compile(model: Callable | None = None, *, backend: Any = None, fullgraph: bool = False,
            dynamic: bool | None = None, mode: str | None = None, options: dict | None = None):
    """``tinydynamo.compile(fn_or_module, backend=..., fullgraph=...)``: like ``torch.compile``.

    ``dynamic`` as torch.compile's (tinydynamo.symbolic_shapes): ``None`` static first, then the sizes that
    change are compiled as symbols ("automatic dynamic"); ``True`` symbolic from the start (sizes 0 and 1
    stay static); ``False`` always static (a new size is a recompile). ``mode="reduce-overhead"`` (CUDA graphs) and ``options={"triton.cudagraphs": True, ...}``
    configure the tininductor backend, as they configure inductor for torch.compile.
    """
    if dynamic not in (None, True, False):
        raise TypeError(f"compile(dynamic=...) takes None, True or False, not {dynamic!r}")
    if model is None:
        return lambda m: compile(m, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode, options=options)
    return optimize(lookup_backend_with_options(backend, mode, options), nopython=fullgraph, dynamic=dynamic)(model)


def _call_module_with_hooks(module, *args, **kwargs):
    """What a compiled module with forward hooks traces: the call itself (hooks + forward)."""
    return module(*args, **kwargs)


class OptimizedModule(nn.Module):
    """A compiled ``nn.Module``: calls go through the compiled ``forward``; everything else
    (parameters, state_dict, attributes, train/eval) is the original module's, with the same names."""

    def __init__(self, mod: nn.Module, backend, nopython: bool, dynamic: bool | None = None):
        super().__init__()
        self._orig_mod = mod
        self._compiled_forward = OptimizedFunction(mod.forward, backend, nopython, dynamic)

    def __deepcopy__(self, memo: dict) -> "OptimizedModule":
        """A compiled copy of a copy of the module (same backend and fullgraph setting; compiled caches are
        per code object, so the copy reuses them where its guards pass)."""
        fn = self._compiled_forward
        return OptimizedModule(copy.deepcopy(self._orig_mod, memo), fn._backend, fn._nopython, fn._dynamic)

    def __bool__(self) -> bool:
        """The original module's truth value (an empty ModuleList is false, compiled or not)."""
        return bool(self._orig_mod)

    def __call__(self, /, *args, **kwargs):
        # the wrapper adds nothing around forward: hooks (global ones too) run once, on the
        # original module, as ``m(*args)`` would run them
        if self._forward_hooks or self._forward_pre_hooks:
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        m = self._orig_mod
        inner = distributed.wrapped_module(m)
        if inner is not None:  # DDP: its forward runs natively, the module it wraps is compiled
            return self._call_wrapper_natively(m, inner, args, kwargs)
        if m._forward_hooks or m._forward_pre_hooks:  # compile the call with its hooks (inlined around forward)
            if getattr(self, "_compiled_call", None) is None:
                self._compiled_call = OptimizedFunction(_call_module_with_hooks, self._compiled_forward._backend,
                                                        self._compiled_forward._nopython, self._compiled_forward._dynamic)
            return self._compiled_call(m, *args, **kwargs)
        if module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks:
            return m(*args, **kwargs)  # global hooks are not captured: run the module as usual
        compiled = self._compiled_forward
        forward = m.__dict__.get("forward") or type(m).forward
        if forward is not compiled._orig_fn and forward is not compiled._fn:
            # ``m.forward = fn`` on the instance, or ``forward`` replaced on the class: compile what
            # ``m(...)`` would run now (each function keeps its own cache, by code object)
            compiled = self._compiled_forward = OptimizedFunction(
                forward if "forward" in m.__dict__ else types.MethodType(forward, m),
                compiled._backend, compiled._nopython, compiled._dynamic)
        return compiled(*args, **kwargs)

    def _call_wrapper_natively(self, wrapper: nn.Module, inner: nn.Module, args: tuple, kwargs: dict):
        """``wrapper(*args)`` natively, with ``inner``'s forward compiled as a frame of its own (what a
        PEP 523 hook does when it skips DDP's frame and catches the wrapped module's forward)."""
        forward = type(inner).forward
        if isinstance(inner, OptimizedModule) or not isinstance(forward, types.FunctionType) \
                or "forward" in inner.__dict__:
            return wrapper(*args, **kwargs)  # compiled already, or a forward of its own: run as given
        outer = self._compiled_forward
        compiled = self.__dict__.get("_compiled_inner")
        if compiled is None or compiled._fn is not forward:
            compiled = self.__dict__["_compiled_inner"] = OptimizedFunction(
                forward, outer._backend, outer._nopython, outer._dynamic)
        with distributed.compiled_forward(inner, functools.partial(compiled, inner)):
            out = wrapper(*args, **kwargs)
        cache = get_cache(compiled._code)
        if cache.run_eagerly is not None and not self.__dict__.get("_warned_eager"):
            self.__dict__["_warned_eager"] = True  # never silently eager
            warnings.warn(f"tinydynamo: {type(inner).__name__}.forward (wrapped by {type(wrapper).__name__}) "
                          f"runs eagerly: {cache.run_eagerly}", EagerFallbackWarning, stacklevel=3)
        return out

    def __getattr__(self, name: str):
        if name in ("_orig_mod", "_compiled_forward", "_compiled_call"):
            return super().__getattr__(name)
        return getattr(self._orig_mod, name)

    def train(self, mode: bool = True):
        self._orig_mod.train(mode)
        self.training = mode
        return self

    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self._orig_mod.named_buffers(*args, **kwargs)

    def named_children(self):
        return self._orig_mod.named_children()

    def named_modules(self, *args, **kwargs):
        return self._orig_mod.named_modules(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"


def disable(fn: Callable | None = None, recursive: bool = True, *, reason: str | None = None):
    """Never trace ``fn``: it always runs eagerly (a call to it from traced code is a graph break).

    On an ``nn.Module`` its ``forward`` is disabled (the module itself is returned, as torch does).
    ``recursive=False`` (torch: skip only this frame, still compile the functions it calls) is treated
    like ``recursive=True`` here: without a frame-evaluation hook, calls made by eager code are not seen.
    """
    if fn is None:
        return functools.partial(disable, recursive=recursive, reason=reason)
    if isinstance(fn, OptimizedModule):
        fn = fn._orig_mod
    if isinstance(fn, OptimizedFunction):
        fn = fn._orig_fn
    if isinstance(fn, nn.Module):
        fn.forward = disable(fn.forward, recursive, reason=reason)
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    wrapper._tinydynamo_disabled = True
    return wrapper


def cache_info(fn: Callable) -> FrameCache:
    """The cache entries of a function (or OptimizedFunction / compiled module) for inspection."""
    if isinstance(fn, OptimizedModule):
        fn = fn._compiled_forward
    if isinstance(fn, OptimizedFunction):
        return get_cache(fn._code)
    return get_cache(_user_function(fn)[0].__code__)


def call_resume_with_closure(resume: Any, closure: tuple, *args):
    """What compiled code calls for a resume function that takes the frame's cells as its closure."""
    if isinstance(resume, OptimizedFunction):
        return resume.call_with_closure(closure, *args)
    return types.FunctionType(resume.__code__, resume.__globals__, resume.__name__, None, closure)(*args)
