"""Sources: where a value the interpreter saw came from, as a Python expression.

Guards and the input fetcher of a compiled frame are generated Python code over two roots,
``L`` (the frame's locals: arguments and closure variables) and ``G`` (its globals). Globals of
*other* modules (reached by inlining a function defined elsewhere) get their own root name,
registered in the :class:`SourceScope`.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable


def _computed_once(method: Callable[[Any], str], slot: str) -> Callable[[Any], str]:
    """``method`` with its result kept on the instance: a source is frozen, and a deep one's name
    is a walk over all its bases, asked for again and again while guards are built."""
    @functools.wraps(method)
    def once(self) -> str:
        try:
            return self.__dict__[slot]
        except KeyError:
            value = method(self)
            object.__setattr__(self, slot, value)  # past the frozen dataclass's __setattr__
            return value

    return once


class Source:
    """Base class: ``name()`` is the expression (``L['x']``, ``L['self'].fc1.weight``).

    ``code()`` is the expression generated code evaluates: the same value, sometimes read a
    faster way (see :class:`ModuleMemberSource`); ``name()`` is what guards and logs show.
    Sources are immutable, so each computes both strings once.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for method in ("name", "code"):
            if method in cls.__dict__:
                setattr(cls, method, _computed_once(cls.__dict__[method], f"_{method}_once"))

    def name(self) -> str:
        raise NotImplementedError

    def code(self) -> str:
        return self.name()

    def __str__(self) -> str:
        return self.name()


@dataclasses.dataclass(frozen=True)
class LocalSource(Source):
    local: str

    def name(self) -> str:
        return f"L[{self.local!r}]"


@dataclasses.dataclass(frozen=True)
class GlobalSource(Source):
    global_name: str
    root: str = "G"  # "G" for the frame's own globals, "___G<n>" for another module's

    def name(self) -> str:
        return f"{self.root}[{self.global_name!r}]"


@dataclasses.dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    attr: str

    def name(self) -> str:
        return self._read(self.base.name())

    def code(self) -> str:
        return self._read(self.base.code())

    def _read(self, base: str) -> str:
        if self.attr.isidentifier():
            return f"{base}.{self.attr}"
        return f"getattr({base}, {self.attr!r})"


@dataclasses.dataclass(frozen=True)
class ModuleMemberSource(AttrSource):
    """A parameter, buffer or submodule of an ``nn.Module``, shown as ``L['self'].fc1.weight``
    and read as ``L['self']._modules['fc1']._parameters['weight']``.

    ``nn.Module`` keeps these in three dicts, and ``module.fc1`` reaches them through a
    Python-level ``__getattr__``, which costs about half a microsecond. Guards and frames run
    on every call and read every parameter, so they go to the dict directly, as TorchDynamo's
    guards do. :func:`module_member_source` only uses this where the two reads agree.
    """

    table: str = "_parameters"  # or "_buffers", "_modules"

    def code(self) -> str:
        return f"{self.base.code()}.{self.table}[{self.attr!r}]"


def is_data_descriptor(attr) -> bool:
    """A class attribute that wins over the instance dict (a property, ``__slots__`` members)."""
    return hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")


@dataclasses.dataclass(frozen=True)
class InstanceAttrSource(AttrSource):
    """An attribute kept in the object's own ``__dict__`` that nothing on its class shadows (a
    module's ``training``, a Dropout's ``p``): ``L['self'].drop.p``, and the same value as
    ``L['self'].drop.__dict__['p']``, which is how the guard check reads it (``through_dicts``)."""


def module_member_source(module: Any, base: Source, attr: str) -> AttrSource:
    """The source of ``module.<attr>``: a :class:`ModuleMemberSource` when plain attribute lookup
    would end in the module's own ``_parameters`` / ``_buffers`` / ``_modules`` (nothing on the
    instance or its class shadows the name), an :class:`InstanceAttrSource` when it ends in the
    module's ``__dict__``, else an ordinary :class:`AttrSource`."""
    own = vars(module)
    if attr not in own and not hasattr(type(module), attr):
        for table in ("_parameters", "_buffers", "_modules"):
            if attr in own.get(table, ()):
                return ModuleMemberSource(base, attr, table)
    if attr in own and type(module).__getattribute__ is object.__getattribute__:
        if not is_data_descriptor(inspect.getattr_static(type(module), attr, None)):
            return InstanceAttrSource(base, attr)  # (a data descriptor on the class would win over the dict)
    return AttrSource(base, attr)


@dataclasses.dataclass(frozen=True)
class ContainerItemSource(Source):
    """A child of an ``nn.Sequential`` / ``nn.ModuleList`` / ``nn.ParameterList`` by position, shown as
    ``L['self'].layers[0]`` and read as ``L['self'].layers._modules['0']``.

    The containers' ``__getitem__`` is Python that walks the children to the position (a few
    microseconds, and a big model's guards and frames read hundreds of them per call). The trace
    took the child from the container's dict by its key, and the dict's keys are guarded
    (``DICT_KEYS``), so reading that key directly is the same object.
    """

    base: Source
    index: int
    key: str
    table: str = "_modules"  # "_parameters" for a ParameterList

    def name(self) -> str:
        return f"{self.base.name()}[{self.index!r}]"

    def code(self) -> str:
        return f"{self.base.code()}.{self.table}[{self.key!r}]"


@dataclasses.dataclass(frozen=True)
class ClassSource(Source):
    """A class, held by the check function as a constant (``scope_name``): guards on what the
    class holds (``Linear.forward``) are then made once per class, not once per instance."""

    cls: type
    scope_name: str

    def name(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"

    def code(self) -> str:
        return self.scope_name


@dataclasses.dataclass(frozen=True)
class GetItemSource(Source):
    base: Source
    index: Any  # int or str (hashable constant)

    def name(self) -> str:
        return f"{self.base.name()}[{self.index!r}]"

    def code(self) -> str:
        return f"{self.base.code()}[{self.index!r}]"


@dataclasses.dataclass(frozen=True)
class DictKeySource(Source):
    """The ``index``-th key of a dict, ``list(base)[index]``: a key that is not a constant (a tensor,
    an object) has no literal to index the dict with, so it and its value are read by position."""

    base: Source
    index: int

    def name(self) -> str:
        return f"list({self.base.name()})[{self.index}]"

    def code(self) -> str:
        return f"list({self.base.code()})[{self.index}]"


@dataclasses.dataclass(frozen=True)
class DictValueSource(Source):
    """The ``index``-th value of a dict, ``list(base.values())[index]`` (see :class:`DictKeySource`)."""

    base: Source
    index: int

    def name(self) -> str:
        return f"list({self.base.name()}.values())[{self.index}]"

    def code(self) -> str:
        return f"list({self.base.code()}.values())[{self.index}]"


@dataclasses.dataclass(frozen=True)
class BaseMethodSource(Source):
    """``dict.get(base, key)``: a read-only method of a builtin base class on a subclass instance
    (what ``super().get(key)`` reads), bypassing the subclass's overrides."""

    base: Source
    method: str  # "dict.get", "dict.__getitem__", ...
    args: tuple  # constant arguments

    def name(self) -> str:
        return f"{self.method}({', '.join([self.base.name(), *map(repr, self.args)])})"

    def code(self) -> str:
        return f"{self.method}({', '.join([self.base.code(), *map(repr, self.args)])})"


@dataclasses.dataclass(frozen=True)
class CallSource(Source):
    """``fn(*args)`` with constant arguments, ``fn`` bound to a scope name: the value a folded read-only
    call returned (``os.environ.get('X', '0')``), so that a guard can read it again."""

    fn_name: str  # the scope name bound to the function
    label: str  # what people read: "os.environ.get"
    args: tuple

    def name(self) -> str:
        return f"{self.label}({', '.join(map(repr, self.args))})"

    def code(self) -> str:
        return f"{self.fn_name}({', '.join(map(repr, self.args))})"


@dataclasses.dataclass(frozen=True)
class PlainTensorSource(Source):
    """A tensor subclass input seen as a plain tensor (``base.as_subclass(torch.Tensor)``, read through
    the scope function ``fn_name``): what the graph of a ``__torch_function__`` subclass takes."""

    base: Source
    fn_name: str

    def name(self) -> str:
        return f"{self.base.name()}.as_subclass(torch.Tensor)"

    def code(self) -> str:
        return f"{self.fn_name}({self.base.code()})"


@dataclasses.dataclass(frozen=True)
class NumpyTensorSource(Source):
    """A NumPy array input seen as the tensor sharing its memory (``torch.as_tensor(base)``, read through
    the scope function ``fn_name``): what the graph takes for an ndarray argument."""

    base: Source
    fn_name: str

    def name(self) -> str:
        return f"torch.as_tensor({self.base.name()})"

    def code(self) -> str:
        return f"{self.fn_name}({self.base.code()})"


@dataclasses.dataclass(frozen=True)
class ConstSource(Source):
    """A value referred to by a scope name (e.g. a closure cell of an inlined function)."""

    scope_name: str

    def name(self) -> str:
        return self.scope_name


def read_parent(source: Source, through_dicts: bool = False) -> tuple[Source | None, Callable[[str], str]]:
    """(the source a read of ``source`` goes through, a function from that parent's expression to
    the code that reads ``source``). With ``through_dicts`` a module's member is read from its
    table in the module's instance dict, and an :class:`InstanceAttrSource` from that dict."""
    base = getattr(source, "base", None)
    if through_dicts and isinstance(source, (ModuleMemberSource, ContainerItemSource)):
        member = source.attr if isinstance(source, ModuleMemberSource) else source.key
        return GetItemSource(AttrSource(base, "__dict__"), source.table), lambda table: f"{table}[{member!r}]"
    if through_dicts and isinstance(source, InstanceAttrSource):
        return AttrSource(base, "__dict__"), lambda instance_dict: f"{instance_dict}[{source.attr!r}]"
    code = source.code()
    if base is None:
        return None, lambda _: code
    return base, lambda parent: code.replace(base.code(), parent, 1)


def source_reader(lines: list[str], prefix: str, bind: Callable[[Source], bool] = lambda source: True,
                  through_dicts: bool = False) -> Callable[[Source], str]:
    """A function ``source -> expression`` for generated code that reads many sources, each
    parent once. A source that ``bind`` accepts is read into a temporary (``<prefix>0 = L['self']``,
    appended to ``lines`` on first use) and its children are read through it
    (``<prefix>0._modules['fc1']``), so a walk shared by many sources is done once.

    The guard check binds every source (each is read by several conditions); a compiled frame's
    input reads bind only the parents that several inputs go through.

    ``through_dicts``: a module's parameter, buffer, child or plain attribute is read from the
    module's instance dict (``<local>['_modules']['fc1']``, ``<local>['training']``), not as an
    attribute: ``nn.Module`` defines ``__getattr__``, so CPython cannot specialise attribute reads
    on modules, and a dict subscript costs a third of one (:func:`read_parent`)."""
    names: dict[str, str] = {}

    def read(source: Source) -> str:
        key = source.name()
        if key in names:
            return names[key]
        parent, code_from = read_parent(source, through_dicts)
        code = code_from(read(parent) if parent is not None else "")
        if not bind(source):
            return code
        names[key] = f"{prefix}{len(names)}"
        lines.append(f"{names[key]} = {code}")
        return names[key]

    return read


class SourceScope:
    """Names that generated guard/fetch code may use besides ``L`` and ``G`` (``___G1``, ``___c0``...)."""

    def __init__(self, f_globals: dict):
        self.f_globals = f_globals
        self.names: dict[str, Any] = {}
        self._globals_roots: dict[int, str] = {}
        self._constants: dict[tuple[int, str], str] = {}  # (id, hint) -> name: reuse without a scan

    def globals_root(self, globals_dict: dict) -> str:
        if globals_dict is self.f_globals:
            return "G"
        key = id(globals_dict)
        if key not in self._globals_roots:
            name = f"___G{len(self._globals_roots) + 1}"
            self._globals_roots[key] = name
            self.names[name] = globals_dict
        return self._globals_roots[key]

    def constant(self, value: Any, hint: str = "c") -> str:
        """A scope name bound to ``value`` (reused for the same object, and for an equal device).
        Found by identity in a dict: a big model's guards bind thousands of constants."""
        name = self._constants.get((id(value), hint))
        if name is not None and self.names.get(name) is value:
            return name
        if type(value).__name__ == "device":
            for name, v in self.names.items():
                if type(v) is type(value) and v == value and name.startswith(f"___{hint}"):
                    return name
        name = f"___{hint}{len(self.names)}"
        self.names[name] = value
        self._constants[(id(value), hint)] = name
        return name

    def evaluate(self, source: Source, L: dict, G: dict) -> Any:
        return eval(source.code(), {**self.names, "L": L, "G": G})
