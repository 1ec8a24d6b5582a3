"""tinydynamo's settings: a small object whose fields can be patched for a block of code.

    with tinydynamo.config.patch(recompile_limit=2):
        ...
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator


@dataclasses.dataclass
class Config:
    #: misses per code object before tinydynamo gives up and runs it eagerly (torch: recompile_limit)
    recompile_limit: int = 8
    #: internal compiler errors fall back to eager with a warning (False: raise them)
    suppress_errors: bool = True
    #: deepest chain of inlined user functions
    max_inline_depth: int = 32
    #: instructions one frame may execute symbolically (stops runaway loops)
    max_instructions: int = 200_000
    #: the backend ``compile``/``optimize`` use when none is given
    default_backend: str = "eager"

    @contextlib.contextmanager
    def patch(self, arg: str | dict | None = None, value: Any = None, **changes: Any) -> Iterator["Config"]:
        """Temporarily change fields: ``patch(recompile_limit=2)`` or ``patch("recompile_limit", 2)``."""
        if isinstance(arg, str):
            changes[arg] = value
        elif isinstance(arg, dict):
            changes.update(arg)
        for name in changes:
            if not hasattr(self, name):
                raise AttributeError(f"tinydynamo.config has no setting {name!r}; known: {sorted(vars(self))}")
        saved = {name: getattr(self, name) for name in changes}
        for name, v in changes.items():
            setattr(self, name, v)
        try:
            yield self
        finally:
            for name, v in saved.items():
                setattr(self, name, v)


config = Config()
