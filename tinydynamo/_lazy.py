"""PEP 562 lazy attributes for package ``__init__`` modules: import on first use, then cache."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_attributes(module_globals: dict[str, Any], table: dict[str, str]) -> tuple[Callable, Callable]:
    """Return ``(__getattr__, __dir__)`` resolving names from ``table`` ("module:attr", or "module:" for a module)."""
    package = module_globals["__name__"]

    def __getattr__(name: str) -> Any:
        try:
            module_name, _, attr = table[name].partition(":")
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        module = importlib.import_module(module_name)
        value = getattr(module, attr) if attr else module
        module_globals[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(module_globals) | set(table))

    return __getattr__, __dir__
