"""Artefacts that each compiler layer produces for one compiled frame.

Every layer (bytecode, FX graph, guards, transformed code, joint/forward/backward graphs,
loop IR, kernels, wrapper code) calls :func:`record` while a frame is being compiled. The
records land in the :class:`CompileArtifacts` of that frame, which the instructor's view
(``tinydynamo.show``) and the debug dump read. Recording only happens at compile time, so
cached calls pay nothing for it.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator

#: The kinds, in the order the instructor's view shows them (pipeline order).
KINDS = (
    "source",
    "bytecode",
    "graph",
    "guards",
    "transformed_code",
    "ddp_split",
    "joint_graph",
    "forward_graph",
    "backward_graph",
    "ir",
    "kernels",
    "output_code",
)


@dataclasses.dataclass
class CompileArtifacts:
    """Everything recorded while compiling one frame (one code object, one cache entry)."""

    name: str
    items: dict[str, list[tuple[str, Any]]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list)
    )

    def get(self, kind: str) -> list[tuple[str, Any]]:
        return self.items.get(kind, [])

    def __str__(self) -> str:
        parts = [f"=== compiled frame {self.name} ==="]
        for kind in sorted(self.items, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
            for title, value in self.items[kind]:
                parts.append(f"--- {kind}: {title} ---\n{value}")
        return "\n".join(parts)


_stack: list[CompileArtifacts] = []
#: The most recent compiled frames, newest last.
history: collections.deque[CompileArtifacts] = collections.deque(maxlen=64)


class LazyText:
    """An artefact whose text is made when it is first shown, not while compiling: ``make()``
    returns it (printing a large graph's IR takes a good part of a second, for a view that is
    seldom opened). ``make`` must not depend on what changes after the compile."""

    def __init__(self, make: Callable[[], str]):
        self._make: Callable[[], str] | None = make
        self._text = ""

    def __str__(self) -> str:
        if self._make is not None:
            self._text, self._make = self._make(), None
        return self._text


def record(kind: str, title: str, value: Any) -> None:
    """Attach ``value`` (text, or an object whose ``str`` is readable) to every frame being compiled."""
    if kind not in KINDS:
        raise ValueError(f"unknown artefact kind {kind!r}; use one of {KINDS}")
    for arts in _stack:
        arts.items[kind].append((title, value))


@contextlib.contextmanager
def collecting(name: str) -> Iterator[CompileArtifacts]:
    """Collect the records made while compiling the frame ``name``; nests (inlined frames, resume functions)."""
    arts = CompileArtifacts(name)
    _stack.append(arts)
    try:
        yield arts
    finally:
        _stack.remove(arts)
        history.append(arts)


def dump_debug_dir(arts: CompileArtifacts) -> Path | None:
    """With TINY_COMPILE_DEBUG=1: write one directory per compiled frame (called by convert_frame), under
    ``tiny_debug/`` or ``$TINY_COMPILE_DEBUG_DIR`` (TorchDynamo: ``TORCH_COMPILE_DEBUG``)."""
    if os.environ.get("TINY_COMPILE_DEBUG", "") not in ("1", "true", "True"):
        return None
    root = Path(os.environ.get("TINY_COMPILE_DEBUG_DIR", "tiny_debug"))
    index = len(list(root.glob("*"))) if root.exists() else 0
    d = root / f"{index:03d}_{re.sub(r'[^0-9A-Za-z_.]+', '_', arts.name)}"
    d.mkdir(parents=True, exist_ok=True)
    for kind, items in arts.items.items():
        for i, (title, value) in enumerate(items):
            suffix = ".py" if kind in ("source", "graph", "guards", "transformed_code", "output_code") else ".txt"
            (d / f"{kind}{'_' + str(i) if i else ''}{suffix}").write_text(f"# {title}\n{value}\n")
    return d
