"""Sources: where a value the interpreter saw came from, as a Python expression.

Guards and the input fetcher of a compiled frame are generated Python code over two roots,
``L`` (the frame's locals: arguments and closure variables) and ``G`` (its globals). Globals of
*other* modules (reached by inlining a function defined elsewhere) get their own root name,
registered in the :class:`SourceScope`.
"""
from __future__ import annotations

import dataclasses
from typing import Any


class Source:
    """Base class: ``name()`` is the expression (``L['x']``, ``L['self'].fc1.weight``)."""

    def name(self) -> str:
        raise NotImplementedError

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
        if self.attr.isidentifier():
            return f"{self.base.name()}.{self.attr}"
        return f"getattr({self.base.name()}, {self.attr!r})"


@dataclasses.dataclass(frozen=True)
class GetItemSource(Source):
    base: Source
    index: Any  # int or str (hashable constant)

    def name(self) -> str:
        return f"{self.base.name()}[{self.index!r}]"


@dataclasses.dataclass(frozen=True)
class ConstSource(Source):
    """A value referred to by a scope name (e.g. a closure cell of an inlined function)."""

    scope_name: str

    def name(self) -> str:
        return self.scope_name


class SourceScope:
    """Names that generated guard/fetch code may use besides ``L`` and ``G`` (``___G1``, ``___c0``...)."""

    def __init__(self, f_globals: dict):
        self.f_globals = f_globals
        self.names: dict[str, Any] = {}
        self._globals_roots: dict[int, str] = {}

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
        """A scope name bound to ``value`` (reused for the same object)."""
        for name, v in self.names.items():
            same = v is value or (type(v) is type(value) and type(value).__name__ == "device" and v == value)
            if same and name.startswith(f"___{hint}"):
                return name
        name = f"___{hint}{len(self.names)}"
        self.names[name] = value
        return name

    def evaluate(self, source: Source, L: dict, G: dict) -> Any:
        return eval(source.name(), {**self.names, "L": L, "G": G})
