"""Where each task of a chapter lives: every file it touches, read from the files themselves.

A task ("3.2") is spread over the reference answer (``solutions/``), the learner's stub
(``exercises/``), the notebook that teaches it, the chapter's helpers (``course/chapters/``), the
notebook's stand-in while it is unfinished (``course/fallbacks.py``), its hints, its wrong answers
(``course/mutants/``) and its graded tests (``tests/graded/``, marker ``chNN_M``). This module finds
each of them by what the file says (the stub's ``Exercise N.M`` raise, the fallback's key, the
test's marker), never from a hand-kept list, and ``--check`` fails if a task misses one of the
pieces every task needs::

    python -m course.index            # every chapter
    python -m course.index ch03       # one chapter, with line numbers
    python -m course.index --check    # exit 1 if a task lacks a solution, stub, test, hints or mutants
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from course import fallbacks, loader
from course.hints import HINTS
from course.mutants import mutants_of

ROOT = loader.ROOT
#: what every task must have (the fallback is not required: a task whose notebook never calls it
#: needs no stand-in)
REQUIRED = ("solution", "exercise", "graded tests", "hints", "mutants")
MIN_MUTANTS = 3


@dataclass
class Task:
    task: str  # "3.2"
    function: str  # the stub's qualname
    files: dict[str, str] = field(default_factory=dict)  # piece -> "path:line" (or "path (n items)")

    def missing(self) -> list[str]:
        return [piece for piece in REQUIRED if piece not in self.files]


def chapters() -> list[str]:
    """``["ch00", "ch01", ...]``: every chapter with a solution file."""
    return sorted({p.name[:4] for p in (ROOT / "solutions").glob("ch[0-9][0-9]_*.py")})


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _stub_lines(path: Path) -> dict[str, tuple[str, int]]:
    """``{task: (qualname, line)}`` of the functions in ``path`` that hold the task's stub or solution."""
    tree = ast.parse(path.read_text())
    found = {}
    for qualname, (task, fn) in loader.stubs(tree).items():
        found.setdefault(task, (qualname, fn.lineno))
    return found


def _solution_lines(path: Path) -> dict[str, int]:
    """``{task: line}`` of each ``# BEGIN SOLUTION (Exercise N.M: ...)`` marker."""
    found = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        match = re.match(r"\s*# BEGIN SOLUTION \(Exercise (\d+\.\d+)\b", line)
        if match:
            found.setdefault(match.group(1), n)
    return found


def _graded_tests(chapter: str) -> dict[str, list[str]]:
    """``{task: ["tests/graded/test_chNN_x.py::test_name", ...]}`` from the ``chNN_M`` markers."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests" / "graded").glob(f"test_{chapter}_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
                continue
            for deco in node.decorator_list:
                text = ast.unparse(deco)
                match = re.search(rf"mark\.{chapter}_(\d+)", text)
                if match:
                    task = f"{int(chapter[2:])}.{match.group(1)}"
                    found.setdefault(task, []).append(f"{_rel(path)}:{node.lineno}")
    return found


def _notebook_lines(chapter: str) -> tuple[Path | None, dict[str, int]]:
    """The chapter's notebook source and the first line that names each ``Exercise N.M``."""
    matches = sorted((ROOT / "notebooks").glob(f"{chapter[2:]}_*.py"))
    if not matches:
        return None, {}
    found = {}
    for n, line in enumerate(matches[0].read_text().splitlines(), 1):
        for task in re.findall(r"[Ee]xercises? (\d+\.\d+)", line):
            found.setdefault(task, n)
    return matches[0], found


def index(chapter: str) -> list[Task]:
    """Every task of ``chapter`` ("ch03") with the files that hold its pieces."""
    solution = loader.chapter_file(chapter, "solutions")
    exercise = loader.chapter_file(chapter, "exercises")
    stubs = _stub_lines(exercise)
    solved = _solution_lines(solution)
    tests = _graded_tests(chapter)
    notebook, taught = _notebook_lines(chapter)
    helpers = sorted((ROOT / "course" / "chapters").glob(f"{chapter}_*.py"))
    mutants: dict[str, int] = {}
    for m in mutants_of(chapter):
        mutants[m.task] = mutants.get(m.task, 0) + 1
    tasks = []
    for task in sorted(set(stubs) | set(solved), key=lambda t: tuple(int(p) for p in t.split("."))):
        qualname = stubs.get(task, ("?", 0))[0]
        t = Task(task, qualname)
        if task in solved:
            t.files["solution"] = f"{_rel(solution)}:{solved[task]}"
        if task in stubs:
            t.files["exercise"] = f"{_rel(exercise)}:{stubs[task][1]}"
        if notebook is not None and task in taught:
            t.files["notebook"] = f"{_rel(notebook)}:{taught[task]}"
        if helpers:
            t.files["chapter helpers"] = ", ".join(_rel(p) for p in helpers)
        if f"{chapter}.{qualname}" in fallbacks.REGISTRY:
            t.files["fallback"] = f"course/fallbacks.py: {fallbacks.REGISTRY[f'{chapter}.{qualname}'][1]}"
        if HINTS.get(task):
            t.files["hints"] = f"course/hints.py ({len(HINTS[task])} levels)"
        if mutants.get(task, 0) >= MIN_MUTANTS:
            t.files["mutants"] = f"course/mutants/{chapter}.py ({mutants[task]} wrong answers)"
        if task in tests:
            t.files["graded tests"] = f"{len(tests[task])} in " + ", ".join(
                sorted({entry.split(':')[0] for entry in tests[task]}))
        tasks.append(t)
    return tasks


def render(chapter: str, tasks: list[Task]) -> str:
    lines = [f"{chapter}:"]
    for t in tasks:
        lines.append(f"  {t.task}  {t.function}")
        for piece, where in t.files.items():
            lines.append(f"      {piece:<16}{where}")
        if t.missing():
            lines.append(f"      MISSING         {', '.join(t.missing())}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.index", description=__doc__.split("\n\n")[0])
    p.add_argument("chapters", nargs="*", help="chNN (default: every chapter)")
    p.add_argument("--check", action="store_true", help="exit 1 if a task misses a required piece")
    args = p.parse_args(argv)
    known = chapters()
    chosen = [c if c.startswith("ch") else f"ch{int(c):02d}" for c in args.chapters] or known
    unknown = [c for c in chosen if c not in known]
    if unknown:
        p.error(f"no chapter {', '.join(unknown)}; chapters: {', '.join(known)}")
    incomplete = []
    for chapter in chosen:
        tasks = index(chapter)
        print(render(chapter, tasks))
        incomplete += [f"{t.task} ({', '.join(t.missing())})" for t in tasks if t.missing()]
    if args.check and incomplete:
        print(f"\ntasks missing a required piece: {'; '.join(incomplete)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
