"""Load a chapter's exercise module, from ``solutions/`` or ``exercises/`` by one switch."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
MODE_ENV = "TINY_COURSE_MODE"
MODES = ("exercises", "solutions")


def mode() -> str:
    """The active mode: ``exercises`` (the learner's files, the default) or ``solutions``."""
    value = os.environ.get(MODE_ENV, "exercises").strip().lower()
    if value not in MODES:
        raise ValueError(
            f"{MODE_ENV}={value!r} is not a course mode; set it to 'exercises' or 'solutions'"
        )
    return value


def chapter_file(chapter: str, which: str | None = None) -> Path:
    """The file for ``chapter`` ("ch03" or "3") in ``solutions/`` or ``exercises/``."""
    which = which or mode()
    tag = chapter if chapter.startswith("ch") else f"ch{int(chapter):02d}"
    matches = sorted((ROOT / which).glob(f"{tag}_*.py"))
    if len(matches) != 1:
        found = ", ".join(p.name for p in matches) or "none"
        raise FileNotFoundError(
            f"expected exactly one {which}/{tag}_*.py, found {found}; "
            "run `python -m course.exercises` to regenerate the exercises"
        )
    return matches[0]


def load(chapter: str, which: str | None = None) -> ModuleType:
    """Import the chapter's module afresh (so edits to an exercise file are picked up on re-run)."""
    path = chapter_file(chapter, which)
    name = f"course_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module
