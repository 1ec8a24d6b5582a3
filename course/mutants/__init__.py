"""Plausible wrong answers to every exercise, kept to prove the graded tests reject them.

Each chapter's file (``course/mutants/chNN.py``) lists :class:`Mutant` edits of the reference
solution in ``solutions/chNN_*.py``: the kind of mistake a learner makes (an operand order, a
missing pop, a forgotten type check). ``python -m course.grade --mutants`` applies each one to a
copy of the solutions, runs only that task's graded tests, and reports every mutant the tests
accept: a surviving mutant is a wrong answer a learner could pass with.
"""
from __future__ import annotations

import dataclasses
import importlib
import re

CHAPTERS = [f"ch{n:02d}" for n in range(13)]


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One wrong answer: ``old`` (which must occur exactly once in the task's solution block)
    replaced by ``new``."""

    task: str  # "2.1"
    description: str  # the mistake, in a learner's words
    old: str
    new: str
    python: str | None = None  # "3.12": the mistake only shows there; run the task's tests under that Python

    @property
    def chapter(self) -> str:
        return f"ch{int(self.task.split('.')[0]):02d}"

    @property
    def marker(self) -> str:
        """The pytest marker of the task's graded tests (``ch02_1``)."""
        chapter, number = self.task.split(".")
        return f"ch{int(chapter):02d}_{int(number)}"


class MutantError(ValueError):
    """A mutant no longer applies to the solution (the reference changed): fix the mutant."""


def solution_blocks(text: str, task: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the ``BEGIN SOLUTION (Exercise <task>: ...)`` blocks."""
    spans = []
    begin = re.compile(rf"^[ \t]*# BEGIN SOLUTION \(Exercise {re.escape(task)}:.*$", re.M)
    for match in begin.finditer(text):
        end = text.find("# END SOLUTION", match.end())
        if end < 0:
            raise MutantError(f"Exercise {task}: BEGIN SOLUTION without END SOLUTION")
        spans.append((match.end(), end))
    return spans


def apply(mutant: Mutant, text: str) -> str:
    """The solution file's text with ``mutant`` applied inside its task's solution blocks."""
    spans = solution_blocks(text, mutant.task)
    if not spans:
        raise MutantError(f"no solution block for Exercise {mutant.task}")
    hits = [(s, e) for s, e in spans for _ in range(text.count(mutant.old, s, e))]
    if len(hits) != 1:
        raise MutantError(
            f"mutant {mutant.task} {mutant.description!r}: its old snippet occurs {len(hits)} times in the "
            f"solution block(s) of Exercise {mutant.task}; it must occur exactly once:\n{mutant.old}")
    start, end = hits[0]
    at = text.index(mutant.old, start, end)
    return text[:at] + mutant.new + text[at + len(mutant.old):]


def mutants_of(chapter: str) -> list[Mutant]:
    """The mutants listed in ``course/mutants/<chapter>.py`` (``MUTANTS``)."""
    return list(importlib.import_module(f"course.mutants.{chapter}").MUTANTS)
