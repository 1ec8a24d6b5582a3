"""User functions, methods and closures: the interpreter does not call them, it *inlines* them.

Calling one starts a nested translator over the function's own bytecode with the argument
variables bound to its parameters; its ops land in the same graph.

Layer: above constant; the tuple and dict that ``*args`` / ``**kwargs`` bind to are made
through base.constructor (lists and dicts sit above).
"""
from __future__ import annotations

import functools
import inspect
import os
import site
import sysconfig
import types
import types as _types
from typing import Any, Callable

import torch

from tinydynamo.exc import raise_observed, unimplemented
from tinydynamo.source import AttrSource, GetItemSource
from tinydynamo.variables.base import VariableTracker, constructor
from tinydynamo.variables.constant import ConstantVariable


class CellVariable(VariableTracker):
    """A closure cell: a mutable box shared by a frame and the nested functions that capture it."""

    external = False  # True for real cells from outside the trace: writing them would be a lost side effect
    cell_source = None  # where the real cell object is (for an external cell), to rebuild closures
    real_cell = None  # that real cell (a nonlocal store to it is replayed after the graph)

    def __init__(self, value: VariableTracker | None = None):
        super().__init__(None)
        self.value = value

    def reconstruct(self, codegen) -> str:
        """The real cell: the outside one, or a new cell made once (every closure rebuilt from this
        tracker shares it, as the nested functions of the frame shared the frame's cell)."""
        if self.cell_source is not None:
            return codegen.source_expr(self.cell_source)
        if self.external:
            unimplemented("rebuilding a closure cell from outside the frame whose location is unknown")

        make = codegen.constant(_types.CellType, "CellType")
        return codegen.shared(self, lambda: f"{make}({self.value.reconstruct(codegen)})" if self.value is not None
                              else f"{make}()")

    def get(self) -> VariableTracker:
        if self.value is None:
            unimplemented("reading a closure variable before it was assigned")
        return self.value

    def __repr__(self) -> str:
        return f"CellVariable({self.value!r})"


def bind_arguments(
    code: types.CodeType,
    args: list[VariableTracker],
    kwargs: dict[str, VariableTracker],
    defaults: tuple[VariableTracker, ...] = (),
    kwdefaults: dict[str, VariableTracker] | None = None,
    fn_name: str = "",
) -> dict[str, VariableTracker]:
    """Match arguments to the parameters of ``code``, as a Python call would (error -> Unsupported).
    ``*args`` is bound to a tuple and ``**kwargs`` to a dict (trackers of the layer above: base.constructor)."""
    kwdefaults = kwdefaults or {}
    nargs, nkw = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    positional, kwonly = names[:nargs], names[nargs:nargs + nkw]
    has_varargs, has_varkw = bool(code.co_flags & inspect.CO_VARARGS), bool(code.co_flags & inspect.CO_VARKEYWORDS)
    bound: dict[str, VariableTracker] = {}
    for name, value in zip(positional, args):
        bound[name] = value
    extra = list(args[nargs:])
    if extra and not has_varargs:
        unimplemented(f"{fn_name}() takes {nargs} positional arguments but {len(args)} were given")
    kwargs = dict(kwargs)
    for i, name in enumerate(positional):
        if name in kwargs:
            if name in bound or i < code.co_posonlyargcount:
                unimplemented(f"{fn_name}() got multiple values for argument {name!r}")
            bound[name] = kwargs.pop(name)
    first_default = nargs - len(defaults)
    for i, name in enumerate(positional):
        if name not in bound:
            if i >= first_default:
                bound[name] = defaults[i - first_default]
            else:
                unimplemented(f"{fn_name}() missing required argument {name!r}")
    for name in kwonly:
        if name in kwargs:
            bound[name] = kwargs.pop(name)
        elif name in kwdefaults:
            bound[name] = kwdefaults[name]
        else:
            unimplemented(f"{fn_name}() missing keyword-only argument {name!r}")
    index = nargs + nkw
    if has_varargs:
        bound[names[index]] = constructor("TupleVariable")(extra)
        index += 1
    if has_varkw:
        bound[names[index]] = constructor("DictVariable")(kwargs)
    elif kwargs:
        unimplemented(f"{fn_name}() got unexpected keyword arguments {sorted(kwargs)}")
    return bound


#: attributes of a function that are plain constants (no guard needed beyond the function's identity)
FUNCTION_CONSTANT_ATTRS = frozenset({"__code__", "__module__", "__name__", "__qualname__", "__doc__"})


class BaseUserFunctionVariable(VariableTracker):
    def get_code(self) -> types.CodeType:
        raise NotImplementedError

    def get_globals(self) -> dict:
        raise NotImplementedError

    def bind(self, tx, args, kwargs) -> dict[str, VariableTracker]:
        raise NotImplementedError

    def closure_cells(self, tx) -> dict[str, CellVariable]:
        return {}

    def fn_name(self) -> str:
        return self.get_code().co_name

    def call_function(self, tx, args, kwargs):
        return tx.inline_user_function(self, args, kwargs)


class UserFunctionVariable(BaseUserFunctionVariable):
    """A real Python function (global, module method, closure)."""

    def __init__(self, fn: types.FunctionType, source=None, identity_guard: Callable[[], None] | None = None):
        super().__init__(source)
        self.fn = fn
        # set for a closure guarded by its code, not its identity: names and docs are then read through
        # sources, and whatever uses the function as a value (``is``, ``==``, a dict key) first calls it
        # to guard the identity after all
        self.identity_guard = identity_guard

    @property
    def guarded_by_code(self) -> bool:
        return self.identity_guard is not None or getattr(self.fn, "_tinydynamo_rebuilt", False)

    def python_type(self):
        return types.FunctionType

    def as_python_constant(self):
        if self.identity_guard is not None:
            self.identity_guard()
            self.identity_guard = None
        return self.fn

    def get_code(self):
        return self.fn.__code__

    def get_globals(self):
        return self.fn.__globals__

    def _wrap(self, tx, value: Any, source) -> VariableTracker:
        return VariableTracker.build(tx, value, source if self.source is not None else None)

    def bind(self, tx, args, kwargs):
        defaults = tuple(
            self._wrap(tx, v, GetItemSource(AttrSource(self.source, "__defaults__"), i) if self.source else None)
            for i, v in enumerate(self.fn.__defaults__ or ())
        )
        kwdefaults = {
            k: self._wrap(tx, v, GetItemSource(AttrSource(self.source, "__kwdefaults__"), k) if self.source else None)
            for k, v in (self.fn.__kwdefaults__ or {}).items()
        }
        return bind_arguments(self.get_code(), args, kwargs, defaults, kwdefaults, self.fn.__qualname__)

    def var_getattr(self, tx, name: str) -> VariableTracker:
        """``fn.__code__``, ``fn.__module__``, ``fn.__name__``...: read from the real function (it is
        guarded by identity, and these do not change); other attributes are guarded by their source."""
        try:
            value = getattr(self.fn, name)
        except AttributeError:
            raise_observed(AttributeError, f"function {self.fn.__qualname__} has no attribute {name!r}")
        if name in FUNCTION_CONSTANT_ATTRS and (name == "__code__" or not self.guarded_by_code or self.source is None):
            return ConstantVariable(value)
        return self._wrap(tx, value, AttrSource(self.source, name) if self.source is not None else None)

    def closure_cells(self, tx):
        cells = {}
        for i, (name, cell) in enumerate(zip(self.get_code().co_freevars, self.fn.__closure__ or ())):
            try:
                value = cell.cell_contents
            except ValueError:
                unimplemented(f"closure variable {name!r} of {self.fn.__qualname__} is not set yet")
            src = None
            if self.source is not None:
                src = AttrSource(GetItemSource(AttrSource(self.source, "__closure__"), i), "cell_contents")
            real = self.fn.__closure__[i]
            known = shared_cell_tracker(tx, real)
            if known is not None:  # the same real cell met before (another closure, the frame's own): one tracker
                cells[name] = known
                continue
            cells[name] = CellVariable(VariableTracker.build(tx, value, src))
            cells[name].external = True
            if self.source is not None:
                cells[name].cell_source = GetItemSource(AttrSource(self.source, "__closure__"), i)
                cells[name].real_cell = real
                shared_cell_tracker(tx, real, cells[name])
        return cells

    def __repr__(self) -> str:
        return f"UserFunctionVariable({self.fn.__qualname__})"


class UserMethodVariable(UserFunctionVariable):
    """A function bound to ``obj`` (a module's ``forward``, a user object's method)."""

    def __init__(self, fn: types.FunctionType, obj: VariableTracker, source=None):
        super().__init__(fn, source)
        self.obj = obj

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name == "__self__":
            return self.obj
        if name == "__func__":
            return UserFunctionVariable(self.fn)
        return super().var_getattr(tx, name)

    def call_function(self, tx, args, kwargs):
        return tx.inline_user_function(self, [self.obj, *args], kwargs)

    def reconstruct(self, codegen) -> str:
        return f"{codegen.constant(types.MethodType, 'MethodType')}({codegen.constant(self.fn, 'fn')}, " \
               f"{self.obj.reconstruct(codegen)})"

    def __repr__(self) -> str:
        return f"UserMethodVariable({self.fn.__qualname__})"


class NestedUserFunctionVariable(BaseUserFunctionVariable):
    """A function made by MAKE_FUNCTION while tracing (a lambda, a local ``def``)."""

    def __init__(self, code: types.CodeType, f_globals: dict, qualname: str):
        super().__init__(None)
        self.code = code
        self.f_globals = f_globals
        self.qualname = qualname
        self.defaults: tuple[VariableTracker, ...] = ()
        self.kwdefaults: dict[str, VariableTracker] = {}
        self.closure: tuple[CellVariable, ...] = ()
        self.wrapped: VariableTracker | None = None  # ``__wrapped__`` set by functools.wraps

    def python_type(self):
        return types.FunctionType

    def var_setattr(self, tx, name: str, value: VariableTracker) -> None:
        if name != "__wrapped__":
            unimplemented(f"setting {name!r} on the function {self.qualname} made in the frame")
        self.wrapped = value

    def set_attribute(self, name: str, value: VariableTracker) -> None:
        """SET_FUNCTION_ATTRIBUTE (normalised from MAKE_FUNCTION's flags on 3.11/3.12)."""
        if name == "defaults":
            self.defaults = tuple(value.unpack_var_sequence(None))
        elif name == "kwdefaults":
            self.kwdefaults = {k: v for k, v in value.items.items()}
        elif name == "closure":
            self.closure = tuple(value.items)
        # annotations are ignored: they do not change behaviour

    def get_code(self):
        return self.code

    def get_globals(self):
        return self.f_globals

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name == "__wrapped__" and self.wrapped is not None:  # set by functools.wraps in the frame
            return self.wrapped
        known = {"__code__": self.code, "__name__": self.code.co_name, "__qualname__": self.qualname,
                 "__module__": self.f_globals.get("__name__")}
        if name in known:
            return ConstantVariable(known[name])
        if name == "__defaults__":
            return constructor("TupleVariable")(list(self.defaults)) if self.defaults else ConstantVariable(None)
        unimplemented(f"attribute {name!r} of the nested function {self.qualname}")

    def bind(self, tx, args, kwargs):
        return bind_arguments(self.code, args, kwargs, self.defaults, self.kwdefaults, self.qualname)

    def closure_cells(self, tx):
        return dict(zip(self.code.co_freevars, self.closure))

    def reconstruct(self, codegen) -> str:
        """A real function with the same code, defaults and (shared) closure cells."""
        def build() -> str:
            defaults = "(" + "".join(f"{d.reconstruct(codegen)}, " for d in self.defaults) + ")" if self.defaults else "None"
            kwdefaults = "{" + ", ".join(f"{k!r}: {v.reconstruct(codegen)}" for k, v in self.kwdefaults.items()) + "}"
            closure = "(" + "".join(f"{c.reconstruct(codegen)}, " for c in self.closure) + ")" if self.closure else "None"
            return (f"{codegen.constant(make_function, 'make_function')}({codegen.constant(self.code, 'code')}, "
                    f"{codegen.constant(self.f_globals, 'globals')}, {self.qualname!r}, {defaults}, {kwdefaults}, {closure}"
                    + (f", {self.wrapped.reconstruct(codegen)})" if self.wrapped is not None else ")"))

        return codegen.shared(self, build)

    def __repr__(self) -> str:
        return f"NestedUserFunctionVariable({self.qualname})"


def shared_cell_tracker(tx, real_cell, tracker: "CellVariable | None" = None) -> "CellVariable | None":
    """One CellVariable per real cell in a trace (like one tracker per real list): a write through one
    closure is then seen by every function sharing that cell. With ``tracker``, register it."""
    table = tx.output.__dict__.setdefault("cell_trackers", {})
    if tracker is not None:
        table[id(real_cell)] = (real_cell, tracker)  # the cell is kept alive with its entry (ids stay unique)
        return tracker
    entry = table.get(id(real_cell))
    return entry[1] if entry is not None and entry[0] is real_cell else None


def make_function(code, f_globals, qualname, defaults, kwdefaults, closure, wrapped=None):
    """What compiled code calls to rebuild a function made in the frame (a lambda, a local ``def``)."""
    fn = types.FunctionType(code, f_globals, code.co_name, defaults, closure)
    fn.__qualname__ = qualname
    fn.__kwdefaults__ = kwdefaults or None
    if wrapped is not None:
        functools.update_wrapper(fn, wrapped)
    fn._tinydynamo_rebuilt = True  # guarded by its code, not its identity (see VariableBuilder)
    return fn


def _dirs() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(the standard library, site-packages folders, PyTorch's own package folders), real paths with a slash."""

    def norm(p):
        return os.path.join(os.path.realpath(p), "")

    paths = sysconfig.get_paths()
    sites = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
    try:
        sites.add(site.getusersitepackages())
    except AttributeError:
        pass
    torch_dirs = {os.path.dirname(torch.__file__)}
    return (tuple({norm(paths["stdlib"]), norm(paths["platstdlib"])}), tuple(sorted({norm(p) for p in sites})),
            tuple(norm(p) for p in torch_dirs))


STDLIB_DIRS, SITE_PACKAGES_DIRS, TORCH_DIRS = _dirs()
#: installed packages never traced into (TorchDynamo keeps a similar skip list): their calls are breaks
SKIP_PACKAGES = frozenset({"numpy", "scipy", "pandas", "sympy", "networkx", "matplotlib", "IPython", "triton",
                           "_pytest", "pytest", "pluggy", "tqdm", "PIL", "tinydynamo", "tininductor"})


def _real_file(code) -> str:
    return os.path.realpath(code.co_filename)


def package_of(filename: str) -> str | None:
    """The top-level package an installed file belongs to (``transformers``), or None outside site-packages."""
    for d in SITE_PACKAGES_DIRS:
        if filename.startswith(d):
            return filename[len(d):].split("/", 1)[0].removesuffix(".py")
    return None


def is_torch_internal(fn) -> bool:
    """Is ``fn`` PyTorch's own Python code? Decided by where its code lives, not by a module name's
    prefix (a user package ``torchfoo`` is user code)."""
    code = getattr(fn, "__code__", None)
    return code is not None and _real_file(code).startswith(TORCH_DIRS)


def is_library_function(fn) -> bool:
    """A function tinydynamo does not trace into, like TorchDynamo's skip rules: the standard library and
    a short list of installed packages (SKIP_PACKAGES). Other third-party Python (transformers, timm,
    torchvision...) is traced like user code. Calling a library function from traced code is a graph break.
    PyTorch's own functions are not "library" here: they become graph ops (variables.torch)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    filename = _real_file(code)
    if filename.startswith(TORCH_DIRS):
        return False
    package = package_of(filename)
    if package is not None:
        return package in SKIP_PACKAGES
    return filename.startswith(STDLIB_DIRS)


class SkippedFunctionVariable(VariableTracker):
    """A library function tinydynamo does not trace into (numpy, the standard library...)."""

    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def as_python_constant(self):
        return self.fn

    def call_function(self, tx, args, kwargs):
        if self.fn in FOLDABLE_LIBRARY_FUNCTIONS:
            real_args = [real_python_value(a) for a in args]
            real_kwargs = {k: real_python_value(v) for k, v in kwargs.items()}
            if all(a is not _UNKNOWN for a in [*real_args, *real_kwargs.values()]):
                try:
                    return ConstantVariable(self.fn(*real_args, **real_kwargs))
                except Exception as e:
                    unimplemented(f"{self.fn.__qualname__}(...) raised {e!r} at trace time")
        unimplemented(f"call to {getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.fn)}, "
                      "a library function tinydynamo does not trace")


_UNKNOWN = object()


def real_python_value(var: VariableTracker):
    """The real object a (non-tensor) variable stands for, or _UNKNOWN: a bound method is rebuilt, so that
    ``inspect.signature(self.forward)`` leaves out ``self`` as Python does."""
    if isinstance(var, UserMethodVariable):
        obj = real_python_value(var.obj)
        return _UNKNOWN if obj is _UNKNOWN else types.MethodType(var.fn, obj)
    if isinstance(var, UserFunctionVariable):
        return var.fn
    for attr in ("module", "value"):  # NNModuleVariable, UserDefinedObjectVariable
        if hasattr(var, attr) and not hasattr(var, "node"):
            return getattr(var, attr)
    if var.is_python_constant():
        return var.as_python_constant()
    return _UNKNOWN


def _foldable_library_functions() -> frozenset:
    return frozenset({inspect.signature, inspect.isclass, inspect.isfunction, inspect.ismethod,
                      inspect.isgeneratorfunction, inspect.iscoroutinefunction, inspect.getfullargspec})


#: standard-library functions of a function's or class's definition: run at trace time on the real
#: object (guarded by identity where it has a source); the result is a constant
FOLDABLE_LIBRARY_FUNCTIONS = _foldable_library_functions()


class DisabledFunctionVariable(VariableTracker):
    """A function wrapped with ``tinydynamo.disable``: never traced into."""

    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def call_function(self, tx, args, kwargs):
        unimplemented(f"call to {getattr(self.fn, '__qualname__', self.fn)} which is marked tinydynamo.disable")


class OpaqueCallVariable(VariableTracker):
    """A callable that is never traced into, with the reason (a graph break where the call happens)."""

    def __init__(self, fn, reason: str):
        super().__init__(None)
        self.fn = fn
        self.reason = reason

    def as_python_constant(self):
        return self.fn

    def call_function(self, tx, args, kwargs):
        unimplemented(self.reason)


class InGraphFunctionVariable(VariableTracker):
    """A function called as one node of the graph (``allow_in_graph``), or folded to ``constant``."""

    def __init__(self, fn, constant: VariableTracker | None = None):
        super().__init__(None)
        self.fn = fn
        self.constant = constant

    def as_python_constant(self):
        return self.fn

    def call_function(self, tx, args, kwargs):
        if self.constant is not None:
            return self.constant
        return tx.output.create_node("call_function", self.fn, list(args), dict(kwargs))


def constant_none() -> ConstantVariable:
    return ConstantVariable(None)
