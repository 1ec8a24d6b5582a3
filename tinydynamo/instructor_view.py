"""``tinydynamo.show(fn, *args)``: the instructor's view of everything tinydynamo (and later layers) made.

Runs ``fn(*args)`` under tinydynamo with a fresh cache and shows, for every compiled frame
(the function and its resume functions), the artefacts recorded while compiling it: source,
bytecode, FX graph, guards, transformed code, and whatever later layers record (joint graph,
fused IR, kernels...). In Jupyter: an HTML panel, one column per artefact; in a terminal: text.
Later layers add artefacts by calling ``tinydynamo.artifacts.record(kind, title, value)``, and
can add a renderer for a kind with :func:`register_renderer`.

``TINY_COMPILE_DEBUG=1`` writes the same artefacts, one directory per compiled frame, under
``tiny_debug/`` (or ``$TINY_COMPILE_DEBUG_DIR``).
"""
from __future__ import annotations

import html
from typing import Any, Callable

from tinydynamo import artifacts, eval_frame
from tinydynamo.artifacts import dump_debug_dir  # noqa: F401  (the TINY_COMPILE_DEBUG dump lives beside the artefacts)

#: kind -> function(value) -> HTML string (default: preformatted text)
RENDERERS: dict[str, Callable[[Any], str]] = {}


def register_renderer(kind: str, render: Callable[[Any], str]) -> None:
    RENDERERS[kind] = render


class ShowResult:
    def __init__(self, frames: list[artifacts.CompileArtifacts], result: Any):
        self.frames = frames
        self.result = result

    def __str__(self) -> str:
        return "\n\n".join(str(f) for f in self.frames) or "(nothing was compiled)"

    def _repr_html_(self) -> str:
        parts = []
        for f in self.frames:
            cells = []
            for kind in artifacts.KINDS:
                for title, value in f.get(kind):
                    body = RENDERERS.get(kind, lambda v: f"<pre>{html.escape(str(v))}</pre>")(value)
                    cells.append(f"<div style='flex:1;min-width:22em;overflow:auto'><b>{kind}</b>"
                                 f" <small>{html.escape(title)}</small>{body}</div>")
            parts.append(f"<h4>{html.escape(f.name)}</h4><div style='display:flex;gap:1em;flex-wrap:wrap'>"
                         + "".join(cells) + "</div>")
        return "".join(parts) or "<i>nothing was compiled</i>"


def show(fn: Callable, *args, backend: Any = None, **kwargs) -> ShowResult:
    """Compile and run ``fn(*args, **kwargs)`` with a fresh cache; return the artefacts of each frame."""
    eval_frame.reset()
    kept = list(artifacts.history)  # keeps them alive, so their ids stay unique
    before = {id(a) for a in kept}
    result = eval_frame.optimize(backend)(fn)(*args, **kwargs)
    frames = [a for a in artifacts.history if id(a) not in before]  # history is a bounded deque
    return ShowResult(frames, result)
